#!/usr/bin/env bash
# A/B of variants on the GPU machine, in one run: for each variant builds the
# library and bench/sm90_gemm_bench.cu, then runs the routed-path bench on the
# same sizes, so the variants share one machine, clock state and routing.
# Machines differ by several per cent from call to call (bench/NOTES.md), so
# compare variants of one call, not calls.
# A variant is extra CUDA defines ("-" for none), or "patch:FILE" — the tree
# with FILE (a `git diff` of this checkout, kept untracked so that it travels
# with the working tree) applied, so a code change and the code it replaces
# run side by side; "patch:FILE -DX" adds defines to it.
# Usage: bench/device_ab.sh --tokens 1,8,64 [--experts 48,384] [--reps 10] VARIANT...
#   e.g. bench/device_ab.sh --tokens 1,8 - "-DNVFP4MOE_DECODE_RING_MIN_NTILES=1"
#        git diff > ab.diff; git stash; bench/device_ab.sh --tokens 1,8 - patch:ab.diff
# Logs: $OUT/ab_<i>.log; the GEMM lines of every variant are printed last.
set -euo pipefail
TOKENS="1,8,64,512"
EXPERTS="48,384"
REPS=10
VARIANTS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tokens) TOKENS="$2"; shift 2 ;;
    --experts) EXPERTS="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    *) VARIANTS+=("$1"); shift ;;
  esac
done
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
ROOT="$PWD"
# The variants build side by side (each with its share of the cores): a
# variant's slowest translation unit is paid once, not once per variant.
JOBS=$(( $(nproc) / ${#VARIANTS[@]} + 1 ))
build_variant() {
  local i="$1" flags="${VARIANTS[$1]}"
  [[ "$flags" == "-" ]] && flags=""
  local b="$ROOT/build-ab$i" src="$ROOT" spec patch_file
  : > "$OUT/ab_build_$i.log"
  if [[ "$flags" == patch:* ]]; then
    spec="${flags#patch:}"
    patch_file="${spec%% *}"
    flags="${spec#"$patch_file"}"
    src="$ROOT/build-ab$i-src"
    rm -rf "$src" && mkdir -p "$src"
    tar -C "$ROOT" --exclude='./build*' --exclude='./.deps' --exclude='./.git' -cf - . | tar -C "$src" -xf -
    if [[ -d "$ROOT/.deps" ]]; then ln -s "$ROOT/.deps" "$src/.deps"; fi
    patch -d "$src" -p1 < "$ROOT/$patch_file" >> "$OUT/ab_build_$i.log" 2>&1
  fi
  (cd "$src" &&
    cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4MOE_BUILD_PYTHON=OFF -DNVFP4MOE_BUILD_TESTS=OFF \
      "-DCMAKE_CUDA_FLAGS=$flags" >> "$OUT/ab_build_$i.log" 2>&1 &&
    ninja -C "$b" -j "$JOBS" nvfp4moe >> "$OUT/ab_build_$i.log" 2>&1 &&
    nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr $flags -Iinclude -Isrc \
      bench/sm90_gemm_bench.cu "$b/libnvfp4moe.a" -lcublas -o "$b/sm90_gemm_bench" >> "$OUT/ab_build_$i.log" 2>&1)
}
for i in "${!VARIANTS[@]}"; do build_variant "$i" & done
wait
for i in "${!VARIANTS[@]}"; do
  "build-ab$i/sm90_gemm_bench" --tokens "$TOKENS" --experts "$EXPERTS" --reps "$REPS" --no-simple > "$OUT/ab_$i.log" 2>&1
done
for i in "${!VARIANTS[@]}"; do
  echo "== variant $i: ${VARIANTS[$i]}"
  grep -E "^(EP|     stages|     in the graph)" "$OUT/ab_$i.log" | sed -E 's/ +stages us:.*\| sweep/   sweep/'
done
