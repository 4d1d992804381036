#!/usr/bin/env bash
# Compile every built-in kernel for sm_90 with a second Triton beside .venv's: by default 3.6.0, the one
# the H200 runs (torch 2.11's). Triton's compiler changes between versions; a kernel one version builds,
# another may reject, and the CPU tests compile with .venv's only. Run after scripts/setup.sh; the wheel
# goes to .triton-<version>/ once (about 200 MB). Also checks, with that Triton, what depends on its version:
# cross_entropy's extreme values and the source hash in decision keys. Usage: scripts/check-triton.sh [VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.6.0}
target=.triton-$version
if [ ! -f "$target/triton/__init__.py" ]; then
    rm -rf "$target"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --target "$target" "triton==$version"
fi
PYTHONPATH="$PWD/$target" .venv/bin/python -c "import triton; assert triton.__version__ == '$version', triton.__version__"
PYTHONPATH="$PWD/$target" .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_compiles_for_hopper.py
# Triton 3.6's interpreter rounds an fma twice: cross_entropy's forwards then keep their exp form (the probe in
# kernelgate.ops.cross_entropy); its precision tests run under that interpreter too.
PYTHONPATH="$PWD/$target" .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_cross_entropy.py \
    -k "extreme or both_forms"
# Decision keys: the same source hash in every process (Triton 3.6's own kernel hash depended on the order).
PYTHONPATH="$PWD/$target" .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_selection.py \
    -k "alike_whatever or constexpr_globals"
