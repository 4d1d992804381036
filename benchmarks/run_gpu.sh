#!/usr/bin/env bash
# On a GPU machine: the whole test suite (kernels compiled), then demo, tune, a second process on
# the warm cache, and the overhead benchmark. Everything is written under $1 (default ./gpu-out).
# With QUICK=1: only the test suite and the overhead benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-gpu-out}
mkdir -p "$out"
# Installs the console script (the tests check it); no network is needed for an editable install.
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || cat "$out/install.log"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=160
export KERNELGATE_CACHE_DIR=$out/cache
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; echo "kernelgate commit ${KERNELGATE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}";
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$out/provenance.txt"
python3 -m pytest tests src -q -p no:cacheprovider -rs > "$out/pytest.log" 2>&1; echo "pytest rc=$?" >> "$out/pytest.log"
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest.log" | tail -15
if [ "${QUICK:-0}" != 1 ]; then
python3 -m kernelgate doctor > "$out/doctor.txt" 2>&1
( time python3 -m kernelgate demo --log "$out/demo.csv" --repeats 50 ) > "$out/demo.txt" 2>&1
( time python3 -m kernelgate tune softmax rms_norm --shape 16384x4096 --shape 4096x32768 --shape 65536x1024 \
    --shape 1x4096 --shape 64x4096 --shape 512x4096 --dtype bfloat16 --dtype float32 ) > "$out/tune.txt" 2>&1
( time python3 -m kernelgate demo --log "$out/demo-warm.csv" --repeats 50 ) > "$out/demo-warm.txt" 2>&1
python3 -m kernelgate cache show > "$out/cache.txt" 2>&1
fi
python3 benchmarks/overhead.py --out "$out/overhead.json" > "$out/overhead.txt" 2>&1
python3 benchmarks/memory.py --out "$out/memory.json" > "$out/memory.txt" 2>&1
[ -f "$out/demo-warm.txt" ] && tail -n 12 "$out/demo-warm.txt"; cat "$out/overhead.txt" "$out/memory.txt"
tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" && rm -rf "$out"
