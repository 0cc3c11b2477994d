#!/usr/bin/env bash
# One device call for the decode GEMM (helper "speed"): build the library,
# the sm90 tests and the benchmark; run the tests, the benchmark and the
# PyTorch baselines; print one table last. Logs and JSON go to $OUT.
#   bench/sm90_device.sh [tokens] [experts]
set -uo pipefail
OUT=${OUT:-/tmp/sm90_out}
mkdir -p "$OUT"
TOKENS=${1:-1,8,64,512,2048,4096,8192}
EXPERTS=${2:-48,384}
B=build-sm90
GT=.deps/googletest/googletest
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DNVFP4MOE_BUILD_TESTS=OFF > "$OUT/build.log" 2>&1
ninja -C $B nvfp4moe >> "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
FLAGS="-std=c++20 -O2 -Iinclude -Isrc -Itests -I/usr/local/cuda/include"
( g++ $FLAGS -I$GT/include -I$GT tests/cuda/test_sm90_mma_gemm.cpp tests/cuda/test_sm90_stage.cpp tests/cuda/test_sm90_group.cpp tests/common/test_util.cpp $GT/src/gtest-all.cc \
    $GT/src/gtest_main.cc $B/libnvfp4moe.a -L/usr/local/cuda/lib64 -lcudart_static -lcublas -lpthread -ldl -lrt \
    -o $B/sm90_tests > "$OUT/build_tests.log" 2>&1 || tail -20 "$OUT/build_tests.log" ) &
nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude -Isrc \
    bench/sm90_gemm_bench.cu $B/libnvfp4moe.a -lcublas -o $B/sm90_bench > "$OUT/build_bench.log" 2>&1 \
    || tail -20 "$OUT/build_bench.log"
wait
echo "build: $(( $(date +%s) - t0 )) s"
# SASS: HMMA present, no local memory in the decode GEMM.
cuobjdump --dump-sass $B/libnvfp4moe.a 2>/dev/null > "$OUT/sass_all.txt"
awk '/Function : .*sm90_nvfp4_mma_gemm_kernel/{f=1} /Function : /&&!/sm90_nvfp4_mma_gemm_kernel/{f=0} f' \
    "$OUT/sass_all.txt" > "$OUT/sass_mma.txt"
echo "sass (mma gemm): HMMA $(grep -c HMMA "$OUT/sass_mma.txt") LDL/STL $(grep -cE 'LDL|STL' "$OUT/sass_mma.txt")"
rm -f "$OUT/sass_all.txt"
timeout 240 $B/sm90_tests > "$OUT/tests.log" 2>&1
echo "tests rc=$?: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tests.log" | tr '\n' ' ')"
grep -E "Failure|error|Expected|Which is|seed" "$OUT/tests.log" | head -30
timeout 300 $B/sm90_bench --tokens "$TOKENS" --experts "$EXPERTS" --json "$OUT/ours.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
cat "$OUT/bench.log"
PYTHONUNBUFFERED=1 timeout 240 python3 bench/baselines_torch.py --tokens "$TOKENS" --experts "$EXPERTS" \
    --json "$OUT/torch.json" --ours "$OUT/ours.json" > "$OUT/torch.log" 2>&1
echo "torch rc=$?"
tail -25 "$OUT/torch.log"
echo "total: $(( $(date +%s) - t0 )) s"
