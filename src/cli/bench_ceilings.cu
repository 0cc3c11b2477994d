// Ceilings for the benchmark's roofline (see bench_ceilings.hpp).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <cublasLt.h>

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

// A 32-bit hash of element i: the fills' pseudo-random bits.
__device__ __forceinline__ uint32_t element_hash(int64_t i, uint32_t seed) {
  uint32_t h = uint32_t(i) * 0x9e3779b1u ^ seed;
  h ^= h >> 15;
  h *= 0x85ebca6bu;
  return h ^ (h >> 13);
}

// Pseudo-random BF16 in [-1, 1): random data draws realistic power (zeros run faster).
__global__ void fill_random_bf16_kernel(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(float(element_hash(i, seed) >> 8) * (2.0f / 16777216.0f) - 1.0f);
}

// Pseudo-random E4M3 bytes of magnitude at most 1.75 (exponent field <= 7), either sign.
__global__ void fill_random_e4m3_kernel(uint8_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t h = element_hash(i, seed);
    p[i] = uint8_t((h & 0x80u) | ((h >> 8) & 0x3Fu));
  }
}

void check_lt(cublasStatus_t s, const char* what) {
  NVFP4_CHECK(s == CUBLAS_STATUS_SUCCESS, "cublasLt ", what, " failed with status ", int(s));
}

}  // namespace

std::string device_description() {
  int device = 0;
  NVFP4_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  NVFP4_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  char tail[64];
  std::snprintf(tail, sizeof tail, ", %d SMs, L2 %.0f MB", prop.multiProcessorCount, prop.l2CacheSize / 1e6);
  return std::string(prop.name) + tail;
}

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

double measure_fp8_gemm_flops(int64_t m, int64_t n, int64_t k, int iters) {
  // D[n, m] (column-major, BF16) = A^T B with A [m, k] and B [n, k] row-major
  // E4M3: the "TN" form cuBLASLt's FP8 kernels take, FP32 accumulation.
  DeviceBuffer<uint8_t> a{size_t(m * k)}, b{size_t(n * k)};
  DeviceBuffer<__nv_bfloat16> d{size_t(m * n)};
  fill_random_e4m3_kernel<<<1024, 256>>>(a.get(), m * k, 3u);
  fill_random_e4m3_kernel<<<1024, 256>>>(b.get(), n * k, 4u);
  NVFP4_CUDA_CHECK_LAUNCH("fill_random_e4m3_kernel");
  cublasLtHandle_t lt = nullptr;
  check_lt(cublasLtCreate(&lt), "create");
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const size_t workspace_bytes = size_t(32) << 20;
  DeviceBuffer<uint8_t> workspace{workspace_bytes};
  check_lt(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t), "transa");
  check_lt(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &nt, sizeof nt), "transb");
  check_lt(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(m), k), "layout a");
  check_lt(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, uint64_t(k), uint64_t(n), k), "layout b");
  check_lt(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, uint64_t(m), uint64_t(n), m), "layout d");
  check_lt(cublasLtMatmulPreferenceCreate(&pref), "preference");
  check_lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                sizeof workspace_bytes),
           "workspace");
  cublasLtMatmulHeuristicResult_t algo{};
  int found = 0;
  check_lt(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &algo, &found), "heuristic");
  NVFP4_CHECK(found > 0, "cublasLt: no FP8 GEMM algorithm for ", m, " x ", n, " x ", k);
  const float alpha = 1.0f, beta = 0.0f;
  const double us = median_time_us(iters, [&] {
    check_lt(cublasLtMatmul(lt, op, &alpha, a.get(), la, b.get(), lb, &beta, d.get(), ld, d.get(), ld, &algo.algo,
                            workspace.get(), workspace_bytes, nullptr),
             "matmul");
  });
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  return 2.0 * double(m) * double(n) * double(k) / (us * 1e-6);
}

}  // namespace nvfp4moe::cuda
