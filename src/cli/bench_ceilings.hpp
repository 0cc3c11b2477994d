// Hardware ceilings measured in the benchmark's own run, for its roofline:
// device read bandwidth (a streaming sum over a buffer far larger than L2)
// and dense BF16 GEMM throughput (cuBLAS, FP32 accumulation).
#pragma once

#include <cstdint>

namespace nvfp4moe::cuda {

// Bytes per second read from HBM: median of `iters` sums over `bytes`.
double measure_read_bandwidth(int64_t bytes, int iters);
// FLOP/s of a BF16 m x n x k cuBLAS GEMM: median of `iters`.
double measure_bf16_gemm_flops(int64_t m, int64_t n, int64_t k, int iters);

}  // namespace nvfp4moe::cuda
