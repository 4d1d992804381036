#!/usr/bin/env bash
# Set up .venv with kernelgate and its test tools, reusing an installed torch.
# On a machine without an NVIDIA GPU it installs the CPU build of torch, never the multi-GB CUDA one.
set -euo pipefail
cd "$(dirname "$0")/.."

python=""
for candidate in ${PYTHON:-} python3 python3.13 python3.12 python3.11 python3.10; do
    if command -v "$candidate" >/dev/null 2>&1 &&
        "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
        python=$candidate
        break
    fi
done
if [ -z "$python" ]; then
    echo "kernelgate needs Python >= 3.10; none found. Install one, or set PYTHON=/path/to/python3.1x." >&2
    exit 1
fi

if [ ! -x .venv/bin/python ]; then
    # --system-site-packages: an installed torch (often a large CUDA build) is reused, not downloaded again.
    "$python" -m venv --system-site-packages .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)

if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        "${pip[@]}" torch
    else
        # The CPU build, from PyTorch's CPU index (pip's configured local wheels are searched too).
        "${pip[@]}" --timeout 30 --index-url https://download.pytorch.org/whl/cpu "torch==${KERNELGATE_CPU_TORCH:-2.13.0}+cpu"
    fi
fi
"${pip[@]}" -e ".[dev]"
echo "kernelgate is set up in .venv ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
