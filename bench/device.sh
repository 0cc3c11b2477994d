#!/usr/bin/env bash
# The one script run on the GPU machine, from the repository root:
#   build (CMake + Ninja, googletest from .deps/) -> GPU tests -> compute-sanitizer
#   memcheck on small cases -> benchmarks -> the markdown table of
#   docs/performance.md and a short summary, printed last.
# Usage: bench/device.sh [--steps build,tests,sanitizer,bench,speed,modes,convert,quantize,quantize-dir,shared,bulk-copy,ep,python,profile,profile-decode]
#                        [--tokens LIST] [--filter GTEST_FILTER] [--workload ep8|ep1|both]
#                        [--model dsv4-pro|dsv4-flash]
#   --model: the layer geometry of bench, speed and modes (EP8: an eighth of
#          the model's experts, EP1: all of them); default dsv4-pro.
#   bench: `nvfp4moe bench` (the whole layer forward) -> $OUT/bench.csv;
#   speed: the routed-expert bench (target nvfp4moe_routed_bench) -> $OUT/routed.json
#          and the PyTorch baselines (bench/baselines_torch.py) -> $OUT/torch.json;
#   modes: the routed-expert bench over --format nvfp4,mxfp4 x --act nvfp4,bf16,fp8
#          -> $OUT/modes.json, its table -> $OUT/modes_table.md;
#   convert: `convert --device cuda` on one DeepSeek-V4-Pro layer of 48 experts
#          (target nvfp4moe_convert_bench, device time per cast) -> $OUT/convert.log;
#   quantize: `quantize --device cuda` of one BF16 DeepSeek-V4-Pro layer of 48
#          experts against the read rate of its input (target
#          nvfp4moe_quantize_bench) -> $OUT/quantize.log; quantize-dir: the
#          same for a model directory of 4 such layers -> $OUT/quantize_dir.log;
#   shared: the FP8 shared expert against its BF16 form, every path side by
#          side (target nvfp4moe_shared_expert_bench) -> $OUT/shared_expert.md;
#   bulk-copy: bulk copies into shared memory, one CTA an SM, nothing
#          consuming (target nvfp4moe_bulk_copy_bench) -> $OUT/bulk_copy.md.
# bench/perf_table.py turns whichever of those exist into $OUT/performance_table.md.
# Logs go to $OUT (or ./device-out when $OUT is unset). Each step has its own
# time limit so that one hang still leaves the others' results.
set -euo pipefail

STEPS="build,tests,sanitizer,bench"
TOKENS="1,8,64,512,2048,8192"
FILTER="*"  # every GPU test of this build (the NCCL ones skip: step ep runs them against torch's NCCL)
WORKLOAD="both"
MODEL="dsv4-pro"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) STEPS="$2"; shift 2 ;;
    --tokens) TOKENS="$2"; shift 2 ;;
    --filter) FILTER="$2"; shift 2 ;;
    --workload) WORKLOAD="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    *) echo "device.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
BUILD="${BUILD_DIR:-build-device}"
JOBS="$(nproc)"
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt" || true

if has_step build; then
  start=$(date +%s)
  set +e
  targets="nvfp4moe nvfp4moe_gpu_tests nvfp4moe_cli"
  if has_step speed || has_step modes; then targets="$targets nvfp4moe_routed_bench"; fi
  if has_step convert; then targets="$targets nvfp4moe_convert_bench"; fi
  if has_step shared || [[ "${PROFILE_BENCH:-}" == shared ]]; then targets="$targets nvfp4moe_shared_expert_bench"; fi
  if has_step bulk-copy; then targets="$targets nvfp4moe_bulk_copy_bench"; fi
  if has_step quantize || has_step quantize-dir; then targets="$targets nvfp4moe_quantize_bench"; fi
  timeout 240 bash -c "cmake -S . -B '$BUILD' -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4MOE_BUILD_PYTHON=OFF \
      -DNVFP4MOE_BUILD_BENCH=ON && ninja -C '$BUILD' -j '$JOBS' -k 0 $targets" > "$OUT/build.log" 2>&1
  rc=$?
  set -e
  grep -E "error|FAILED" "$OUT/build.log" | head -20 || true
  note "build: rc=$rc in $(( $(date +%s) - start )) s"
fi

GPU_TESTS="$BUILD/tests/nvfp4moe_gpu_tests"
if has_step tests; then
  if [[ -x "$GPU_TESTS" ]]; then
    set +e
    timeout 200 "$GPU_TESTS" --gtest_filter="$FILTER" 2>&1 | tee "$OUT/tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|rel L2|error" | head -80
    rc=${PIPESTATUS[0]}
    set -e
    note "tests ($FILTER): rc=$rc, $(grep -c '^\[       OK' "$OUT/tests.log" || true) ok, $(grep -c '^\[  FAILED  \].*ms)' "$OUT/tests.log" || true) failed"
  else
    note "tests: $GPU_TESTS was not built"
  fi
fi

if has_step sanitizer; then
  if [[ -x "$GPU_TESTS" ]]; then
    set +e
    timeout 150 compute-sanitizer --tool memcheck --error-exitcode 99 "$GPU_TESTS" \
      --gtest_filter='SharedFp8.*:Shapes/SharedGemvShapes.*:Tokens/Sm90DecodeGemm.*:CudaMoe.CallerRoutingWithMinusOneSlots:CudaMoe.OutOfRangeExpertIdIsReportedOthersIntact:CudaQuantize.BadArgumentsAreHostErrors:Shapes/Sm90PrefillGemm.*T40*:Shapes/Sm90PrefillGemm.*T10_*:Shapes/Sm90PrefillGemm.*H640*:Sm90PrefillSplit.*:Sm90Stage.KSlot*:Shapes/Sm90Stage.*:Shapes/CombineShapes.*:Fp8OperandRows.*:FormatsAndModes/CudaMoeModes.NanTokenOnlyAffectsItself/MXFP4_fp8_fp8_exact' \
      > "$OUT/sanitizer.log" 2>&1
    rc=$?
    set -e
    tail -5 "$OUT/sanitizer.log"
    note "compute-sanitizer memcheck: rc=$rc ($(grep -c 'Invalid' "$OUT/sanitizer.log" || true) invalid accesses; $(grep 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1))"
  fi
fi

if has_step bench; then
  if [[ -x "$BUILD/nvfp4moe" ]]; then
    set +e
    timeout 270 "$BUILD/nvfp4moe" bench --model "$MODEL" --workload "$WORKLOAD" --tokens "$TOKENS" --csv "$OUT/bench.csv" \
      > "$OUT/bench.log" 2> "$OUT/bench.err"
    rc=$?
    set -e
    tail -5 "$OUT/bench.err" || true
    note "bench: rc=$rc"
    cat "$OUT/bench.log" >> "$SUMMARY"
  else
    note "bench: $BUILD/nvfp4moe was not built"
  fi
fi

# The routed-expert path stage by stage and as one CUDA graph (decode and
# prefill GEMMs), then the PyTorch BF16 / FP8 grouped-MoE baselines on the
# same sizes: the rows of the routed table. Not a default step.
ROUTED_BENCH="$BUILD/bench/nvfp4moe_routed_bench"
if has_step speed; then
  if [[ -x "$ROUTED_BENCH" ]]; then
    set +e
    timeout 300 "$ROUTED_BENCH" --model "$MODEL" --tokens "$TOKENS" --reps 10 --no-simple --json "$OUT/routed.json" \
      > "$OUT/routed.log" 2>&1
    rc=$?
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/baselines_torch.py --model "$MODEL" --tokens "$TOKENS" \
      --json "$OUT/torch.json" > "$OUT/baselines.log" 2>&1
    brc=$?
    set -e
    note "speed: routed bench rc=$rc, baselines rc=$brc"
  else
    note "speed: $ROUTED_BENCH was not built"
  fi
fi

# The routed-expert path for both weight formats and all three activation
# modes: 2 formats x 3 modes x 5 T x 2 workloads = 60 rows in one process,
# so each MXFP4 row is set against an NVFP4 row of the same run (two runs
# differ by up to 11 %, docs/performance.md). Expected: ~2-3 minutes on the
# H200 (at --reps 10 a row takes up to ~1 s, most of it the sweep of GEMM
# configurations; the 384 MXFP4 experts take ~15 s to make and upload on the
# host), so with the build step (at most 240 s) it fits a 10-minute command;
# the 300 s limit leaves twice the expected time. No T = 8192: the target is
# about decode and its rows would cost several seconds each.
# Not a default step: `--steps build,modes`, alone.
MODES_TOKENS="1,8,64,512,2048"
if has_step modes; then
  if [[ -x "$ROUTED_BENCH" ]]; then
    set +e
    timeout 300 "$ROUTED_BENCH" --model "$MODEL" --format nvfp4,mxfp4 --act nvfp4,bf16,fp8 --tokens "$MODES_TOKENS" \
      --reps 10 --no-simple --json "$OUT/modes.json" > "$OUT/modes.log" 2>&1
    rc=$?
    set -e
    note "modes: routed bench rc=$rc ($(grep -c '"kind": *"ours"' "$OUT/modes.json" 2>/dev/null || true) rows)"
    # The closing MXFP4-against-NVFP4 table of the bench's log.
    sed -n '/^MXFP4 against NVFP4/,$p' "$OUT/modes.log" >> "$SUMMARY"
    if [[ -s "$OUT/modes.json" ]]; then
      python3 bench/perf_table.py --routed "$OUT/modes.json" --out "$OUT/modes_table.md" || note "perf_table (modes): rc=$?"
    fi
  else
    note "modes: $ROUTED_BENCH was not built"
  fi
fi

# One bench program as a step: `bench_step NAME LIMIT_S LOG BINARY ARGS...`
# runs it under its time limit when the step is asked for, prints its log
# and notes its status.
bench_step() {
  local name="$1" limit="$2" log="$3" bin="$4"
  shift 4
  has_step "$name" || return 0
  if [[ ! -x "$bin" ]]; then
    note "$name: $bin was not built"
    return 0
  fi
  set +e
  timeout "$limit" "$bin" "$@" > "$OUT/$log" 2>&1
  local rc=$?
  set -e
  cat "$OUT/$log"
  note "$name: bench rc=$rc"
}

# Not default steps: the MXFP4 -> NVFP4 conversion of one layer on the GPU;
# quantize --device cuda of one 6.3 GB BF16 layer (~1 minute), and of a
# model directory of four such shards (25 GB of input, 32 GB of disk with
# the output; ~1 minute); the FP8
# shared expert (V4-Pro and -Flash, T = 1 .. 2048; ~15 s).
bench_step convert 300 convert.log "$BUILD/bench/nvfp4moe_convert_bench" 48 "${TMPDIR:-/tmp}"
bench_step quantize 300 quantize.log "$BUILD/bench/nvfp4moe_quantize_bench" 48 "${TMPDIR:-/tmp}"
bench_step quantize-dir 300 quantize_dir.log "$BUILD/bench/nvfp4moe_quantize_bench" 48 "${TMPDIR:-/tmp}" --shards 4
bench_step shared 120 shared_expert.md "$BUILD/bench/nvfp4moe_shared_expert_bench" --reps 20 \
  --tokens 1,8,16,32,64,128,256,512,2048
# Bulk-copy streaming into shared memory, nothing consuming (~5 s).
bench_step bulk-copy 60 bulk_copy.md "$BUILD/bench/nvfp4moe_bulk_copy_bench"

# Expert parallelism (built against torch's NCCL 2.28.9: the system copy there
# is older) and the Python package (GPU pytest suite): delegated to their own
# scripts so each stays runnable alone; not default steps.
if has_step ep; then
  set +e
  OUT="$OUT/ep" timeout 300 bash bench/device_ep.sh all > "$OUT/ep.log" 2>&1
  note "ep: rc=$? ($(grep -E 'ep tests:|ep bench' "$OUT/ep.log" | tr '\n' ' '))"
  set -e
fi
if has_step python; then
  set +e
  OUT="$OUT/python" timeout 300 bash python/device_test.sh > "$OUT/python.log" 2>&1
  note "python: rc=$? ($(grep -E '^=+ .*(passed|failed)' "$OUT/python.log" | tail -1))"
  set -e
fi

# Per-kernel breakdown of one ep8 forward (Nsight Compute, SpeedOfLight): not a default step.
if has_step profile; then
  for T in ${PROFILE_TOKENS:-1 2048}; do
    set +e
    timeout 200 ncu --section SpeedOfLight --csv \
      --kernel-name regex:'sm90_nvfp4|stage_|group_|quantize_act|requantize|combine|swiglu|f32_to_bf16|router|shared_gemv' \
      "$BUILD/nvfp4moe" bench --workload ep8 --tokens "$T" --iters 1 --warmup 0 --no-ceilings \
      > "$OUT/ncu_T$T.csv" 2> "$OUT/ncu_T$T.err"
    set -e
    note "profile ep8 T=$T (ncu SpeedOfLight): kernel | duration | DRAM % | SM %"
    python3 bench/ncu_kernel_table.py "$OUT/ncu_T$T.csv" | tee -a "$SUMMARY"
  done
fi

# Where a GEMM kernel's warps wait, per SASS instruction (Nsight Compute
# source view, free-running clocks): by default the L1 decode GEMM of one ep8
# T=1 forward; PROFILE_KERNEL (regex), PROFILE_TOKENS and PROFILE_SKIP (launches
# of that kernel to skip) pick another, e.g. the 64-wide wgmma launch of
# ep8 T=512 with PROFILE_KERNEL=sm90_nvfp4_prefill_gemm_kernel PROFILE_SKIP=2.
# PROFILE_BENCH=shared profiles the FP8 shared-expert bench instead (V4-Pro
# first; e.g. PROFILE_KERNEL=shared_fp8_wgmma PROFILE_SKIP=2 PROFILE_TOKENS=64
# is the gate/up kernel of its second timed forward).
# The top instructions by stall samples with their opcodes. Not a default step.
if has_step profile-decode; then
  PK="${PROFILE_KERNEL:-sm90_nvfp4_decode_gemm_kernel}"
  PT="${PROFILE_TOKENS:-1}"
  if [[ "${PROFILE_BENCH:-layer}" == shared ]]; then
    pcmd=("$BUILD/bench/nvfp4moe_shared_expert_bench" --tokens "$PT" --reps 3)
  else
    pcmd=("$BUILD/nvfp4moe" bench --workload ep8 --tokens "$PT" --iters 1 --warmup 0 --no-ceilings)
  fi
  set +e
  timeout 200 ncu --clock-control none --kernel-name "regex:$PK" --launch-skip "${PROFILE_SKIP:-0}" --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
    "${pcmd[@]}" > "$OUT/ncu_decode_source.csv" 2> "$OUT/ncu_decode_source.err"
  set -e
  note "profile-decode (ncu source view, $PK launch ${PROFILE_SKIP:-0}, ${PROFILE_BENCH:-layer} T=$PT): top instructions by warp stall samples"
  python3 - "$OUT/ncu_decode_source.csv" <<'PY' | tee -a "$SUMMARY"
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace"))]
hdr_i = next((i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r)), None)
if hdr_i is None: print("  (no source table)"); sys.exit(0)
hdr = [c.strip() for c in rows[hdr_i]]
src = hdr.index("Source")
stall_cols = [i for i, c in enumerate(hdr) if c.startswith("Warp Stall Sampling (All")]
if not stall_cols: print("  (columns: %s)" % ", ".join(hdr[:40])); sys.exit(0)
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
total = sum(num(r[stall_cols[0]]) for r in body) or 1.0
def opcode(text):  # "@P2 HMMA..." -> "HMMA..."
    t = text.split()
    return (t[1] if t[0].startswith("@") and len(t) > 1 else t[0]) if t else "?"
by_op = collections.Counter()
for r in body: by_op[opcode(r[src])] += num(r[stall_cols[0]])
reasons = [i for i, c in enumerate(hdr) if c.startswith("stall_") and "(Not Issued)" not in c]
if reasons:
    tot = {hdr[i]: sum(num(r[i]) for r in body) for i in reasons}
    s = sum(tot.values()) or 1.0
    print("  stall reasons: " + ", ".join("%s %.0f%%" % (k[6:], 100 * v / s) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])[:8]))
print("  stall samples by opcode: " + ", ".join("%s %.0f%%" % (k, 100 * v / total) for k, v in by_op.most_common(12)))
for r in sorted(body, key=lambda r: -num(r[stall_cols[0]]))[:25]:
    print("  %5.1f%%  %s" % (100 * num(r[stall_cols[0]]) / total, r[src].strip()[:90]))
PY
fi

# The table of docs/performance.md from whatever this run measured.
table_args=()
[[ -s "$OUT/routed.json" ]] && table_args+=(--routed "$OUT/routed.json")
[[ -s "$OUT/torch.json" ]] && table_args+=(--baselines "$OUT/torch.json")
[[ -s "$OUT/bench.csv" ]] && table_args+=(--layer "$OUT/bench.csv" --layer-log "$OUT/bench.log")
if [[ -s "$OUT/routed.json" || -s "$OUT/bench.csv" ]]; then
  python3 bench/perf_table.py "${table_args[@]}" --out "$OUT/performance_table.md" || note "perf_table: rc=$?"
fi

echo "================ summary ================"
cat "$SUMMARY"
if [[ -s "$OUT/performance_table.md" ]]; then
  echo "================ performance table ($OUT/performance_table.md) ================"
  cat "$OUT/performance_table.md"
fi
if [[ -s "$OUT/modes_table.md" ]]; then
  echo "================ formats and activation modes ($OUT/modes_table.md) ================"
  cat "$OUT/modes_table.md"
fi
