#!/usr/bin/env bash
# A/B of code variants on the GPU machine, in one run, so that the variants
# share one machine, clock state and routing. H200s differ by several per cent
# from run to run: compare the variants of one run, not runs.
#
# A variant is the working tree as it is ("-"), the tree with extra CUDA
# defines ("-DNAME=VALUE ..."), or the tree with a patch applied
# ("patch:FILE", optionally followed by defines). FILE is a `git diff` kept
# untracked in the checkout, so that it travels with the working tree; to run
# a change beside the code it replaces, make the patch undo it:
#   git diff -R HEAD~1 -- src/cuda > base.diff && bench/device_ab.sh - patch:base.diff
#
# Every variant is configured and built with CMake in build-ab<i>/
# (-DNVFP4MOE_BUILD_BENCH=ON, CMAKE_CUDA_FLAGS = its defines), all variants
# at once. Then they run in turn, --rounds times (A B A B ...):
#   default      the routed-expert bench (target nvfp4moe_routed_bench) on
#                --tokens / --experts (and --format / --act when given);
#   --cli "ARGS" `nvfp4moe ARGS` instead (repeatable); built against the NCCL
#                of torch's Python environment when it has one, so that
#                `bench --ep R` runs too;
#   --shared "ARGS" the FP8 shared-expert bench (target
#                nvfp4moe_shared_expert_bench) with ARGS instead, e.g.
#                --shared "--tokens 16,32,64 --reps 20".
# Usage: bench/device_ab.sh [--tokens 1,8,64,512] [--experts 48,384] [--reps 10] [--rounds 2]
#                           [--format nvfp4,mxfp4] [--act nvfp4,bf16,fp8]
#                           [--cli "ARGS"]... [--shared "ARGS"] VARIANT...
#   e.g. bench/device_ab.sh --tokens 1,8 - "-DNVFP4MOE_DECODE_RING_MIN_NTILES=1"
#        bench/device_ab.sh --cli "bench --ep 1 --experts 48 --tokens 1,8 --graph" - patch:base.diff
# Runs add up: variants x rounds x one benchmark run each.
# Logs: $OUT/ab_build_<i>.log, $OUT/ab_<i>_<round>.log; every run's rows are printed last.
set -euo pipefail
TOKENS="1,8,64,512"
EXPERTS="48,384"
REPS=10
ROUNDS=2
ROUTED_ARGS=()
CLI_ARGS=()
SHARED_ARGS=""
VARIANTS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tokens) TOKENS="$2"; shift 2 ;;
    --experts) EXPERTS="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --format|--act) ROUTED_ARGS+=("$1" "$2"); shift 2 ;;
    --cli) CLI_ARGS+=("$2"); shift 2 ;;
    --shared) SHARED_ARGS="$2"; shift 2 ;;
    *) VARIANTS+=("$1"); shift ;;
  esac
done
if [[ ${#VARIANTS[@]} -eq 0 ]]; then
  echo "device_ab: give at least one variant ('-', '-DNAME=VALUE', 'patch:FILE')" >&2
  exit 2
fi
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
ROOT="$PWD"
export NCCL_NVLS_ENABLE=0  # no NVLink multicast (docs/ep.md)

TARGET=nvfp4moe_routed_bench
[[ -n "$SHARED_ARGS" ]] && TARGET=nvfp4moe_shared_expert_bench
CMAKE_EXTRA=()
if [[ ${#CLI_ARGS[@]} -gt 0 ]]; then
  TARGET=nvfp4moe_cli
  # nvidia.nccl may be a namespace package (no __file__): take its first path.
  NCCL_ROOT=$(python3 -c "import nvidia.nccl as m, os; f = getattr(m, '__file__', None); print(os.path.dirname(f) if f else list(m.__path__)[0])" 2>/dev/null || true)
  if [[ -n "$NCCL_ROOT" && -f "$NCCL_ROOT/include/nccl_device.h" ]]; then
    CMAKE_EXTRA+=(-DNCCL_ROOT="$NCCL_ROOT")
    export LD_LIBRARY_PATH="$NCCL_ROOT/lib:${LD_LIBRARY_PATH:-}"
  fi
fi

# The variants build side by side, each with its share of the cores: the
# slowest translation unit is paid once, not once per variant.
JOBS=$(( $(nproc) / ${#VARIANTS[@]} + 1 ))
# The patch file of a "patch:FILE [defines]" variant.
patch_of() {
  local rest="${1#patch:}"
  echo "${rest%% *}"
}
build_variant() {
  local i="$1" variant="${VARIANTS[$1]}" src="$ROOT" flags patch_file
  [[ "$variant" == "-" ]] && variant=""
  flags="$variant"
  : > "$OUT/ab_build_$i.log"
  if [[ "$variant" == patch:* ]]; then
    patch_file="$(patch_of "$variant")"
    flags="${variant#patch:"$patch_file"}"
    src="$ROOT/build-ab$i-src"
    rm -rf "$src" && mkdir -p "$src"
    tar -C "$ROOT" --exclude='./build*' --exclude='./.deps' --exclude='./.git' -cf - . | tar -C "$src" -xf -
    if [[ -d "$ROOT/.deps" ]]; then ln -s "$ROOT/.deps" "$src/.deps"; fi
    patch -d "$src" -p1 < "$ROOT/$patch_file" >> "$OUT/ab_build_$i.log" 2>&1 || return 1
  fi
  cmake -S "$src" -B "$ROOT/build-ab$i" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4MOE_BUILD_PYTHON=OFF \
      -DNVFP4MOE_BUILD_TESTS=OFF -DNVFP4MOE_BUILD_BENCH=ON "-DCMAKE_CUDA_FLAGS=$flags" "${CMAKE_EXTRA[@]}" \
      >> "$OUT/ab_build_$i.log" 2>&1 &&
    ninja -C "$ROOT/build-ab$i" -j "$JOBS" "$TARGET" >> "$OUT/ab_build_$i.log" 2>&1
}
# Every patch must apply to the tree as it is: checked before any build, so
# that a stale patch costs seconds, not a round of builds.
for variant in "${VARIANTS[@]}"; do
  [[ "$variant" == patch:* ]] || continue
  patch_file="$(patch_of "$variant")"
  if ! patch -d "$ROOT" -p1 --dry-run --force < "$ROOT/$patch_file" > /dev/null 2>&1; then
    echo "device_ab: $patch_file does not apply to this tree:" >&2
    patch -d "$ROOT" -p1 --dry-run --force < "$ROOT/$patch_file" >&2 || true
    exit 1
  fi
done

pids=()
for i in "${!VARIANTS[@]}"; do
  build_variant "$i" &
  pids+=($!)
done
failed=0
for i in "${!VARIANTS[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "device_ab: variant $i (${VARIANTS[$i]}) did not build:"
    tail -30 "$OUT/ab_build_$i.log"
    failed=1
  fi
done
[[ $failed == 0 ]] || exit 1

for round in $(seq 1 "$ROUNDS"); do
  for i in "${!VARIANTS[@]}"; do
    log="$OUT/ab_${i}_$round.log"
    : > "$log"
    if [[ ${#CLI_ARGS[@]} -gt 0 ]]; then
      for args in "${CLI_ARGS[@]}"; do
        echo "== nvfp4moe $args" >> "$log"
        # shellcheck disable=SC2086
        timeout 120 "$ROOT/build-ab$i/nvfp4moe" $args >> "$log" 2>&1 || echo "rc=$?" >> "$log"
      done
    elif [[ -n "$SHARED_ARGS" ]]; then
      # shellcheck disable=SC2086
      timeout 120 "$ROOT/build-ab$i/bench/nvfp4moe_shared_expert_bench" $SHARED_ARGS >> "$log" 2>&1 ||
        echo "rc=$?" >> "$log"
    else
      timeout 300 "$ROOT/build-ab$i/bench/nvfp4moe_routed_bench" --tokens "$TOKENS" --experts "$EXPERTS" \
        --reps "$REPS" --no-simple "${ROUTED_ARGS[@]}" >> "$log" 2>&1 || echo "rc=$?" >> "$log"
    fi
  done
done

for round in $(seq 1 "$ROUNDS"); do
  for i in "${!VARIANTS[@]}"; do
    echo "== round $round, variant $i: ${VARIANTS[$i]}"
    if [[ ${#CLI_ARGS[@]} -gt 0 ]]; then
      grep -vE "^(NCCL|  *$)" "$OUT/ab_${i}_$round.log" || true
    elif [[ -n "$SHARED_ARGS" ]]; then
      grep -E "^(\| V4|ceilings|rc=)" "$OUT/ab_${i}_$round.log" || true
    else
      grep -E "^(EP|ceilings|rc=|     stages|     in the graph)" "$OUT/ab_${i}_$round.log" |
        sed -E 's/ +stages us:.*\| sweep/   sweep/' || true
    fi
  done
done
