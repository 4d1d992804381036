#!/usr/bin/env bash
# On a GPU machine, in two parts that each fit one call:
#   benchmarks/run_gpu.sh tests OUT   the test suite with the kernels compiled (WORKERS, 8; TESTS: the
#                                     paths or -k expression to run instead of all, e.g. "tests/test_ops.py", split
#                                     on spaces; TESTS_K: a -k expression kept whole, e.g. "gpu or precompile")
#   benchmarks/run_gpu.sh extras OUT  doctor, demo, tune, a second demo on the warm cache, overhead,
#                                     memory, the autograd step's host cost (autograd_overhead,
#                                     autograd_threads, step conditions); the whole suite alone takes
#                                     about 500 s of a call
#   benchmarks/run_gpu.sh bench OUT   `kernelgate bench` over the default suite (QUICK=1: --quick), starting
#                                     no case after TIME_LIMIT seconds (default 540, so one call fits 10
#                                     minutes); RESUME=path/to/bench.csv continues that run (--resume)
#   benchmarks/run_gpu.sh profile OUT benchmarks/profile_case.py for each of CASES, space-separated
#                                     op:shape:dtype:direction (e.g. cross_entropy:8192x32000:bfloat16:forward+backward)
#   benchmarks/run_gpu.sh ab OUT      `kernelgate bench BENCH_ARGS` on another kernelgate's sources, BASE_SRC (its commit:
#                                     BASE_COMMIT), then on this tree, each with its own caches and half the budget
#                                     left (a side starts no case after 3/4 of its share) (BENCH_ARGS default:
#                                     --suite benchmarks/long-rows.json --no-backward --no-compile --no-liger); make
#                                     BASE_SRC with `git archive BASE src | tar -x -C DIR` and pass DIR/src;
#                                     TREE_SRC and TREE_COMMIT put another kernelgate's sources in this tree's place
#   benchmarks/run_gpu.sh variants OUT benchmarks/$VARIANTS.py (default layer_norm_variants; split_rows_variants,
#                                     cross_entropy_persistent, cross_entropy_split_looped, split_looped_forwards too)
#                                     with VARIANT_ARGS (e.g. "--op softmax --lengths 65536 131072")
#   benchmarks/run_gpu.sh counters OUT Nsight Compute's counters (ncu) of benchmarks/run_kernel.py's second launch for
#                                     each of CASES, space-separated op:shape:dtype:impl:config (the config's
#                                     commas kept, e.g. softmax:512x131072:bfloat16:split_rows:BLOCK_N=8192,maxnreg=0,num_warps=8)
# STACKS_AFTER=S (any part): every Python process of the call (the run, its precompile and compile workers) writes
# its threads' stacks to OUT/stacks/stacks-PID.txt every 15 s from S seconds after it starts, to show where a call
# that stalls spends its time (a default suite on an H100 at d1e3a00 made no decision for 2 minutes inside
# cross_entropy). Each dump pauses its process briefly: set S past the measurements that matter.
# Everything is written under OUT (default ./gpu-out), then packed into OUT.tar.gz. The device returns
# at most 8 files, and nothing of a call killed at its time limit except what is already there, so
# every step stops by BUDGET seconds (default 570) and the packing always runs.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-tests}
out=${2:-gpu-out}
mkdir -p "$out"
# Installs the console script (the tests check it); no network is needed for an editable install.
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || cat "$out/install.log"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 COLUMNS=160
if [ -n "${STACKS_AFTER:-}" ]; then
  mkdir -p "$out/stacks" "$out/.stacks-site"
  cat > "$out/.stacks-site/sitecustomize.py" <<'PY'
import faulthandler, os, threading, time

def _dump_later(folder: str, after: float) -> None:
    time.sleep(after)
    faulthandler.dump_traceback_later(15, repeat=True, file=open(f"{folder}/stacks-{os.getpid()}.txt", "w"))

threading.Thread(target=_dump_later, args=(os.environ["STACKS_DIR"], float(os.environ["STACKS_AFTER"])), daemon=True).start()
PY
  out_dir=$(cd "$out" && pwd)
  export STACKS_DIR=$out_dir/stacks STACKS_AFTER PYTHONPATH=$out_dir/.stacks-site:$PYTHONPATH
fi
export KERNELGATE_CACHE_DIR=$out/cache
# Triton's kernels in a directory of this run's machine, not the home directory's default: the A/B calls that
# set one planned buckets at the usual speed, the default suite at 0668973 without one 3 to 7 times slower.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/kernelgate-triton-cache}
# The commit measured: KERNELGATE_COMMIT, else HEAD, marked +changes where src differs from it (a tree copied
# onto the machine can sit beside an older checkout's .git).
commit=${KERNELGATE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}
if [ -z "${KERNELGATE_COMMIT:-}" ] && [ -n "$(git status --porcelain -- src 2>/dev/null)" ]; then commit="$commit+changes"; fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; echo "kernelgate commit $commit";
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } > "$out/provenance.txt"
deadline=$((SECONDS + ${BUDGET:-570}))
# Runs a step with what is left of the budget, keeping 15 s for the packing.
within_budget() { local left=$((deadline - SECONDS - 15)); [ "$left" -gt 0 ] && timeout --kill-after=5 "$left" "$@"; }
if [ "$part" = tests ]; then
  # -rfEs: the short summary names failures and errors, not only skips; -v names each test's outcome as
  # it happens, since a time limit may cut the run off before the summary.
  # shellcheck disable=SC2086
  within_budget python3 -m pytest ${TESTS:-tests src} ${TESTS_K:+-k "$TESTS_K"} -v -p no:cacheprovider -n "${WORKERS:-8}" \
    -rfEs --durations=30 > "$out/pytest.log" 2>&1
  echo "pytest rc=$?" >> "$out/pytest.log"
  grep -E "FAILED|ERROR|passed|failed" "$out/pytest.log" | tail -25
elif [ "$part" = extras ]; then
  within_budget python3 benchmarks/overhead.py --out "$out/overhead.json" > "$out/overhead.txt" 2>&1
  within_budget python3 benchmarks/autograd_overhead.py --out "$out/autograd-overhead.json" > "$out/autograd-overhead.txt" 2>&1
  within_budget python3 benchmarks/autograd_threads.py --out "$out/autograd-threads.json" > "$out/autograd-threads.txt" 2>&1
  cat "$out/overhead.txt" "$out/autograd-overhead.txt" "$out/autograd-threads.txt"
  within_budget python3 -m kernelgate doctor > "$out/doctor.txt" 2>&1
  ( time within_budget python3 -m kernelgate demo --log "$out/demo.csv" --repeats 50 ) > "$out/demo.txt" 2>&1
  ( time within_budget python3 -m kernelgate demo --log "$out/demo-warm.csv" --repeats 50 ) > "$out/demo-warm.txt" 2>&1
  within_budget python3 -m kernelgate cache show > "$out/cache.txt" 2>&1
  within_budget python3 benchmarks/memory.py --out "$out/memory.json" > "$out/memory.txt" 2>&1
  within_budget python3 benchmarks/autograd_step_conditions.py --out "$out/step-conditions-64x4096.json" \
    --shape 64x4096 > "$out/step-conditions.txt" 2>&1
  within_budget python3 benchmarks/autograd_step_conditions.py --out "$out/step-conditions-32768x1024.json" \
    --shape 32768x1024 --dtype float32 >> "$out/step-conditions.txt" 2>&1
  tail -n 12 "$out/demo-warm.txt"; cat "$out/memory.txt" "$out/step-conditions.txt"
elif [ "$part" = bench ]; then
  mkdir -p "$out/bench"
  # The calls already made (runs.json beside the CSV) go with it, so the summary's run time adds them up.
  if [ -n "${RESUME:-}" ]; then
    cp "$RESUME" "$out/bench/bench.csv"
    if [ -f "$(dirname "$RESUME")/runs.json" ]; then cp "$(dirname "$RESUME")/runs.json" "$out/bench/runs.json"; fi
  fi
  ( time within_budget python3 -m kernelgate bench ${QUICK:+--quick} ${RESUME:+--resume} --time-limit "${TIME_LIMIT:-540}" \
      --out "$out/bench" ${BENCH_ARGS:-} ) > "$out/bench.txt" 2>&1
  tail -n 60 "$out/bench.txt"
elif [ "$part" = profile ]; then
  for case in ${CASES:-}; do
    IFS=: read -r op shape dtype direction <<< "$case"
    within_budget python3 benchmarks/profile_case.py --op "$op" --shape "$shape" --dtype "$dtype" --direction "$direction" \
      --out "$out/profile-$op-$shape-$dtype-${direction/+/-}.json" 2>&1 | grep -v "^USDT" | tee -a "$out/profile.txt"
  done
elif [ "$part" = ab ]; then
  : "${BASE_SRC:?set BASE_SRC to the src directory of the kernelgate to compare with}" "${BASE_COMMIT:?set BASE_COMMIT}"
  # Each side gets an equal share of what is left when it starts, and starts no case after three quarters of it
  # (--time-limit), so a slow base (a cold compile) leaves the tree side its share: a run whose base took the whole
  # budget left no tree results at all.
  sides=2
  for side in base tree; do
    if [ "$side" = base ]; then src=$BASE_SRC; label=$BASE_COMMIT; else src=${TREE_SRC:-$PWD/src}; label=${TREE_COMMIT:-$commit}; fi
    share=$(( (deadline - SECONDS - 15) / sides )); sides=$((sides - 1))
    if [ "$share" -le 0 ]; then echo "$side ($label): no time left"; continue; fi
    # shellcheck disable=SC2086
    PYTHONPATH=$src${PYTHONPATH#"$PWD/src"} KERNELGATE_COMMIT=$label KERNELGATE_CACHE_DIR=$out/cache-$side \
      TRITON_CACHE_DIR=$TRITON_CACHE_DIR-$side timeout --kill-after=5 "$share" python3 -m kernelgate bench \
      --time-limit $((share * 3 / 4)) \
      ${BENCH_ARGS:---suite benchmarks/long-rows.json --no-backward --no-compile --no-liger} --out "$out/$side" \
      > "$out/$side.txt" 2>&1
    echo "$side ($label) rc=$?"
  done
  # kernelgate's rows of both sides: op, dtype, shape, direction, base's and tree's fractions of copy, tree's note.
  ( python3 - "$out" <<'PY'
import csv, os, sys
paths = {side: f"{sys.argv[1]}/{side}/bench.csv" for side in ("base", "tree")}
rows = {side: {(r["op"], r["dtype"], r["shape"], r["direction"]): r for r in csv.DictReader(open(path))
               if r["impl"] == "kernelgate" and r["status"] == "ok"} if os.path.exists(path) else {}
        for side, path in paths.items()}
for key, tree in rows["tree"].items():
    base = rows["base"].get(key)
    print(*key, base["frac_of_copy"][:5] if base else "-", tree["frac_of_copy"][:5], tree["note"][:60])
PY
  ) | tee "$out/compare.txt"
elif [ "$part" = counters ]; then
  # The clocks left as found (--clock-control none); the first launch compiles and is skipped.
  for case in ${CASES:-}; do
    IFS=: read -r op shape dtype impl config <<< "$case"
    name="$op-$shape-$dtype-$impl-${config//[=,]/-}"
    within_budget ncu --clock-control none --kernel-name regex:^_ --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section SchedulerStats -o "$out/$name" \
      python3 benchmarks/run_kernel.py --op "$op" --shape "$shape" --dtype "$dtype" --impl "$impl" --config "$config" \
      > "$out/$name.log" 2>&1
    echo "$case rc=$?"
    within_budget ncu --import "$out/$name.ncu-rep" --page details > "$out/$name.txt" 2>&1 && grep -E \
      "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Stall" \
      "$out/$name.txt" | head -20
  done
elif [ "$part" = variants ]; then
  script=${VARIANTS:-layer_norm_variants}
  # shellcheck disable=SC2086
  within_budget python3 "benchmarks/$script.py" ${VARIANT_ARGS:-} --out "$out/$script.json" > "$out/$script.txt" 2>&1
  echo "$script rc=$?"; cat "$out/$script.txt"
else
  echo "usage: benchmarks/run_gpu.sh tests|extras|bench|profile|ab|variants|counters [OUT]" >&2; exit 2
fi
tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" && rm -rf "$out"
