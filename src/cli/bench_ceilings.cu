// Ceilings for the benchmark's roofline (see bench_ceilings.hpp).
#include <algorithm>
#include <vector>

#include "cli/bench_ceilings.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels/shared_expert.hpp"

namespace nvfp4moe::cuda {

namespace {

// Streams the buffer once with 16-byte loads; the xor-sum keeps the loads alive.
__global__ void read_sum_kernel(const uint4* p, int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // practically never: no write traffic
}

// Pseudo-random BF16 in [-1, 1): random data draws realistic power (zeros run faster).
__global__ void fill_random_bf16_kernel(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9e3779b1u ^ seed;
    h ^= h >> 15;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    p[i] = __float2bfloat16_rn(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

}  // namespace

double median_time_us(int iters, const std::function<void()>& fn) {
  CudaEvent a, b;
  std::vector<float> ms;
  fn();  // warm-up
  for (int i = 0; i < iters; ++i) {
    NVFP4_CUDA_CHECK(cudaEventRecord(a.get()));
    fn();
    NVFP4_CUDA_CHECK(cudaEventRecord(b.get()));
    NVFP4_CUDA_CHECK(cudaEventSynchronize(b.get()));
    float t = 0;
    NVFP4_CUDA_CHECK(cudaEventElapsedTime(&t, a.get(), b.get()));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

double measure_read_bandwidth(int64_t bytes, int iters) {
  const int64_t n = bytes / 16;
  DeviceBuffer<uint4> buf{size_t(n)};
  DeviceBuffer<unsigned> sink{1};
  NVFP4_CUDA_CHECK(cudaMemset(buf.get(), 1, buf.bytes()));
  int sms = 0;
  NVFP4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double us = median_time_us(iters, [&] {
    read_sum_kernel<<<sms * 8, 512>>>(buf.get(), n, sink.get());
    NVFP4_CUDA_CHECK_LAUNCH("read_sum_kernel");
  });
  return double(n * 16) / (us * 1e-6);
}

double measure_copy_bandwidth(int64_t bytes, int iters) {
  DeviceBuffer<uint8_t> src{size_t(bytes)}, dst{size_t(bytes)};
  NVFP4_CUDA_CHECK(cudaMemset(src.get(), 1, src.bytes()));
  const double us = median_time_us(iters, [&] {
    NVFP4_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), size_t(bytes), cudaMemcpyDeviceToDevice, nullptr));
  });
  return 2.0 * double(bytes) / (us * 1e-6);
}

double measure_bf16_gemm_flops(int64_t m, int64_t n, int64_t k, int iters) {
  DeviceBuffer<__nv_bfloat16> a{size_t(m * k)}, b{size_t(n * k)};
  DeviceBuffer<float> c{size_t(m * n)};
  fill_random_bf16_kernel<<<1024, 256>>>(a.get(), m * k, 1u);
  fill_random_bf16_kernel<<<1024, 256>>>(b.get(), n * k, 2u);
  NVFP4_CUDA_CHECK_LAUNCH("fill_random_bf16_kernel");
  CublasHandle h;
  const double us = median_time_us(iters, [&] { gemm_bf16_rowmajor_bt(h.get(), a.get(), b.get(), c.get(), m, n, k); });
  return 2.0 * double(m) * double(n) * double(k) / (us * 1e-6);
}

}  // namespace nvfp4moe::cuda
