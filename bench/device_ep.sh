#!/usr/bin/env bash
# Expert parallelism on the GPU machine: build against the NCCL of torch's
# Python environment (2.28.9 there; the system NCCL is older and lacks the
# device API as used here — headers and library must come from ONE copy),
# run the EP GPU tests, and on a machine with R >= 2 GPUs the multi-GPU test
# and `nvfp4moe bench --ep R`.
#
#   bench/device_ep.sh [tests|bench|all|profile|bound]   (default all; logs under $OUT)
#
# PREBUILT=<build dir> uses binaries built elsewhere against NCCL 2.28.9 (the
# same version as torch's; LD_LIBRARY_PATH below makes them load torch's copy)
# when they start here; otherwise this builds, which needs .deps/googletest
# (copy /usr/src/googletest there and bring .deps along to the GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-all}
OUT=${OUT:-$PWD/out-ep}
mkdir -p "$OUT"
BUILD=${BUILD:-build-device-ep}
export NCCL_NVLS_ENABLE=0  # no NVLink multicast (docs/ep.md)

# nvidia.nccl may be a namespace package (no __file__): take its first path.
NCCL_ROOT=${NCCL_ROOT:-$(python3 -c "import nvidia.nccl as m, os; f = getattr(m, '__file__', None); print(os.path.dirname(f) if f else list(m.__path__)[0])" 2>/dev/null || true)}
if [[ -z "$NCCL_ROOT" || ! -f "$NCCL_ROOT/include/nccl_device.h" ]]; then
  h=$(find / -path /proc -prune -o -name nccl_device.h -path '*site-packages*' -print 2>/dev/null | head -1 || true)
  [[ -n "$h" ]] && NCCL_ROOT=$(dirname "$(dirname "$h")")
fi
if [[ -z "$NCCL_ROOT" || ! -f "$NCCL_ROOT/include/nccl_device.h" ]]; then
  echo "device_ep: no NCCL with the device API found (NCCL_ROOT='$NCCL_ROOT')" | tee "$OUT/summary.txt"
  exit 1
fi
export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l || echo 0)
echo "device_ep: NCCL_ROOT=$NCCL_ROOT GPUs=$GPUS mode=$MODE" | tee "$OUT/summary.txt"

if [[ -n "${PREBUILT:-}" && -x "$PREBUILT/tests/nvfp4moe_gpu_tests" ]] &&
   "$PREBUILT/tests/nvfp4moe_gpu_tests" --gtest_list_tests >/dev/null 2>&1; then
  BUILD=$PREBUILT
  echo "device_ep: using prebuilt binaries in $BUILD" | tee -a "$OUT/summary.txt"
else
  {
    cmake -S . -B "$BUILD" -G Ninja -DNCCL_ROOT="$NCCL_ROOT" -DNVFP4MOE_BUILD_PYTHON=OFF
    ninja -C "$BUILD" -j"$(nproc)" nvfp4moe_gpu_tests nvfp4moe_cli
  } >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; echo "device_ep: BUILD FAILED" | tee -a "$OUT/summary.txt"; exit 1; }
  grep -i "nccl expert parallelism" "$OUT/build.log" | tee -a "$OUT/summary.txt" || true
fi
strings "$NCCL_ROOT/lib/libnccl.so.2" 2>/dev/null | grep -m1 "NCCL version" | tee -a "$OUT/summary.txt" || true

status=0
if [[ "$MODE" == tests || "$MODE" == all ]]; then
  # One GPU: the R=1 NCCL path and the R in {1,2,4,8} emulation; with >= 2
  # GPUs EpMultiGpu launches one process per GPU and compares every rank.
  if timeout "${EP_TEST_TIMEOUT:-110}" "$BUILD/tests/nvfp4moe_gpu_tests" --gtest_filter='EpIndex.*:Ranks/EpEmulation.*:EpEmulationErrors.*:EpNccl.*:EpMultiGpu.*:EpCli.*' >"$OUT/ep_tests.log" 2>&1; then
    echo "ep tests: PASS" | tee -a "$OUT/summary.txt"
  else
    status=1
    echo "ep tests: FAIL" | tee -a "$OUT/summary.txt"
    grep -E "Failure|error|FAILED|Expected|Which is|actual|seed=" "$OUT/ep_tests.log" | head -60
  fi
  grep -E "^\[  (PASSED|FAILED|SKIPPED) " "$OUT/ep_tests.log" | tee -a "$OUT/summary.txt" || true
  # Out-of-bounds accesses in the EP kernels (emulation: no NCCL under the sanitizer).
  if command -v compute-sanitizer >/dev/null 2>&1; then
    if timeout "${EP_MEMCHECK_TIMEOUT:-60}" compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/nvfp4moe_gpu_tests" \
        --gtest_filter='EpIndex.*:Ranks/EpEmulation.MatchesSingleGpuOnRandomRouting/R4:Ranks/EpEmulation.CapacityOverflowIsReportedNotCorrupting/R2:Ranks/EpEmulation.OutOfRangeExpertIdIsReported/R8' \
        >"$OUT/ep_memcheck.log" 2>&1; then
      echo "ep memcheck: clean" | tee -a "$OUT/summary.txt"
    else
      echo "ep memcheck: FAIL (or timeout)" | tee -a "$OUT/summary.txt"
      grep -E "ERROR SUMMARY|Invalid|at 0x|by thread" "$OUT/ep_memcheck.log" | head -20
    fi
  fi
fi

if [[ ("$MODE" == bench || "$MODE" == all) && "$GPUS" -ge 2 ]]; then
  R=2
  [[ "$GPUS" -ge 4 ]] && R=4
  [[ "$GPUS" -ge 8 ]] && R=8
  # The token counts of DeepGEMM's published SM90 MegaMoE figures (docs/performance.md) and T = 1.
  if "$BUILD/nvfp4moe" bench --ep "$R" --tokens 1,8,64,512,2048,8192 --iters 20 >"$OUT/ep_bench.log" 2>&1 &&
     "$BUILD/nvfp4moe" bench --ep "$R" --tokens 1,8,64,512,2048 --iters 20 --combine bf16 >>"$OUT/ep_bench.log" 2>&1 &&
     "$BUILD/nvfp4moe" bench --ep "$R" --tokens 1,8,64 --iters 20 --graph --breakdown 0 >>"$OUT/ep_bench.log" 2>&1; then
    cat "$OUT/ep_bench.log" | tee -a "$OUT/summary.txt"
    # The tables of docs/performance.md from the log (beside DeepGEMM's published figures).
    python3 bench/perf_table.py --ep-log "$OUT/ep_bench.log" --out "$OUT/ep_table.md" && cat "$OUT/ep_table.md" | tee -a "$OUT/summary.txt"
  else
    status=1
    echo "ep bench --ep $R: FAIL" | tee -a "$OUT/summary.txt"
    tail -30 "$OUT/ep_bench.log"
  fi
elif [[ "$MODE" == bench || "$MODE" == all ]]; then
  # One GPU: the R = 1 NCCL path alone (communication is a local copy), with
  # the 48 experts one rank of EP8 holds for DeepSeek-V4-Pro.
  if timeout "${EP_BENCH_TIMEOUT:-55}" "$BUILD/nvfp4moe" bench --ep 1 --model dsv4-pro --experts 48 --tokens 1,64,512 --iters 10 \
      >"$OUT/ep_bench.log" 2>&1 &&
     timeout "${EP_BENCH_TIMEOUT:-55}" "$BUILD/nvfp4moe" bench --ep 1 --model dsv4-pro --experts 48 --tokens 1,8,64 --iters 10 \
      --graph >>"$OUT/ep_bench.log" 2>&1; then
    cat "$OUT/ep_bench.log" | tee -a "$OUT/summary.txt"
  else
    echo "ep bench --ep 1: FAIL or timeout" | tee -a "$OUT/summary.txt"
    tail -20 "$OUT/ep_bench.log"
  fi
fi

# A layer sized for 512 tokens per rank (a deployment's largest batch)
# running decode batches, with and without the per-forward token bound
# (docs/ep.md), alternated twice: `bench/device_ep.sh bound`, not part of all.
if [[ "$MODE" == bound ]]; then
  echo "bench --ep 1 --experts 48 --max-tokens 512 --graph: us per forward, bound T vs --unbounded" | tee -a "$OUT/summary.txt"
  for rep in 1 2; do
    for variant in "" "--unbounded"; do
      timeout 60 "$BUILD/nvfp4moe" bench --ep 1 --model dsv4-pro --experts 48 --tokens 1,8,64 --iters 20 --graph \
        --max-tokens 512 $variant > "$OUT/ep_bound_$rep${variant}.log" 2>&1 || echo "bench $variant: rc=$?" | tee -a "$OUT/summary.txt"
      echo "run $rep ${variant:-bounded}: $(awk '$1 ~ /^[0-9]+$/ {printf "T=%s %s us  ", $1, $2}' "$OUT/ep_bound_$rep${variant}.log")" |
        tee -a "$OUT/summary.txt"
    done
  done
fi

# Per-kernel breakdown of one R = 1 forward (48 experts, shared expert
# included; Nsight Compute SpeedOfLight at free-running clocks, kernels
# serialised by the profiler): `bench/device_ep.sh profile`, not part of all.
if [[ "$MODE" == profile ]]; then
  for T in ${PROFILE_TOKENS:-1 64}; do
    timeout 200 ncu --target-processes all --clock-control none --section SpeedOfLight --csv \
      "$BUILD/nvfp4moe" bench --ep 1 --model dsv4-pro --experts 48 --tokens "$T" --iters 1 --warmup 0 \
      > "$OUT/ncu_ep_T$T.csv" 2> "$OUT/ncu_ep_T$T.err" || echo "ncu ep T=$T: rc=$?" | tee -a "$OUT/summary.txt"
    echo "profile bench --ep 1 T=$T (ncu SpeedOfLight): kernel | duration | DRAM % | SM %" | tee -a "$OUT/summary.txt"
    python3 bench/ncu_kernel_table.py "$OUT/ncu_ep_T$T.csv" | tee -a "$OUT/summary.txt"
  done
fi

echo "---- summary"
cat "$OUT/summary.txt"
exit $status
