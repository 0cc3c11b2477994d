// Hardware ceilings measured in a benchmark's own run, for its roofline
// (`nvfp4moe bench` and the programs in bench/): device read bandwidth (a
// streaming sum over a buffer far larger than L2), device copy bandwidth
// (read + write, the ceiling of a kernel that writes what it reads, like the
// activation staging), dense BF16 GEMM throughput (cuBLAS, FP32
// accumulation), dense FP8 GEMM throughput (cuBLASLt, E4M3), the timing
// they share, and the device they were measured on.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace nvfp4moe::cuda {

// The current device as a benchmark's output names it: "NAME, N SMs, L2 M MB"
// (timings compare only between runs on the same kind of device).
std::string device_description();

// Median time in microseconds of `iters` runs of fn on the default stream,
// each between two events, after one warm-up run.
double median_time_us(int iters, const std::function<void()>& fn);

// Bytes per second read from HBM: median of `iters` sums over `bytes`.
double measure_read_bandwidth(int64_t bytes, int iters);
// Bytes moved (read + written) per second by a device-to-device copy of `bytes`.
double measure_copy_bandwidth(int64_t bytes, int iters);
// FLOP/s of a BF16 m x n x k cuBLAS GEMM: median of `iters`.
double measure_bf16_gemm_flops(int64_t m, int64_t n, int64_t k, int iters);
// FLOP/s of a dense E4M3 x E4M3 m x n x k cuBLASLt GEMM (FP32 accumulation, BF16 out): median of `iters`.
double measure_fp8_gemm_flops(int64_t m, int64_t n, int64_t k, int iters);

}  // namespace nvfp4moe::cuda
