#!/usr/bin/env bash
# A/B of the `nvfp4moe` CLI on the GPU machine, in one run: builds the CLI of
# this tree (A) and of the tree with PATCH applied (B), both against the NCCL
# of torch's Python environment (so `bench --ep` runs too), then runs every
# argument set as A, B, A, B — the variants share one machine and clock state.
# PATCH is a `git diff` kept untracked in the checkout (it travels with the
# working tree); to compare a change with the code it replaces, B is usually
# the tree before it: `git diff -R FILES > base.diff`.
# Usage: bench/device_cli_ab.sh PATCH "ARGS" ["ARGS" ...]
#   e.g. bench/device_cli_ab.sh base.diff "bench --workload ep1 --tokens 1,64" \
#          "bench --ep 1 --experts 48 --tokens 1,8 --graph"
# Logs: $OUT/cli_ab_build_{A,B}.log; the runs are printed.
set -euo pipefail
PATCH="$1"; shift
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
ROOT="$PWD"
export NCCL_NVLS_ENABLE=0
NCCL_ROOT=$(python3 -c "import nvidia.nccl as m, os; f = getattr(m, '__file__', None); print(os.path.dirname(f) if f else list(m.__path__)[0])" 2>/dev/null || true)
export LD_LIBRARY_PATH="${NCCL_ROOT:+$NCCL_ROOT/lib:}${LD_LIBRARY_PATH:-}"
nccl_flag=()
[[ -n "$NCCL_ROOT" && -f "$NCCL_ROOT/include/nccl_device.h" ]] && nccl_flag=(-DNCCL_ROOT="$NCCL_ROOT")

build() {  # $1 = variant name, $2 = source dir
  cmake -S "$2" -B "$ROOT/build-cli-$1" -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4MOE_BUILD_PYTHON=OFF \
      -DNVFP4MOE_BUILD_TESTS=OFF "${nccl_flag[@]}" > "$OUT/cli_ab_build_$1.log" 2>&1 &&
    ninja -C "$ROOT/build-cli-$1" -j "$(nproc)" nvfp4moe_cli >> "$OUT/cli_ab_build_$1.log" 2>&1 ||
    { tail -30 "$OUT/cli_ab_build_$1.log"; echo "device_cli_ab: build $1 FAILED"; exit 1; }
}
src_b="$ROOT/build-cli-B-src"
rm -rf "$src_b" && mkdir -p "$src_b"
tar -C "$ROOT" --exclude='./build*' --exclude='./.deps' --exclude='./.git' -cf - . | tar -C "$src_b" -xf -
patch -d "$src_b" -p1 < "$ROOT/$PATCH" > "$OUT/cli_ab_patch.log" 2>&1 || { cat "$OUT/cli_ab_patch.log"; exit 1; }
build A "$ROOT" &
build B "$src_b" &
wait
for args in "$@"; do
  for v in A B A B; do
    echo "== $v: nvfp4moe $args"
    # shellcheck disable=SC2086
    timeout 120 "$ROOT/build-cli-$v/nvfp4moe" $args 2>&1 | grep -vE "^(NCCL|  *$)" | tail -12
  done
done
