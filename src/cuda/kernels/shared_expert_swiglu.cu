// The element-wise kernels of the shared expert's cuBLAS path (see
// shared_expert.hpp): x to BF16, and the SwiGLU between its two GEMMs.
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/shared_expert.hpp"
#include "cuda/kernels/swiglu.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void f32_to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* y) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void swiglu_kernel(const float* gu, int64_t tokens, int64_t inter, bool has_limit, float L,
                              __nv_bfloat16* h) {
  const int64_t n = tokens * inter;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / inter, c = i % inter;
    h[i] = __float2bfloat16_rn(swiglu_limited(gu[t * 2 * inter + c], gu[t * 2 * inter + inter + c], has_limit, L));
  }
}

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>(4096, std::max<int64_t>(1, ceil_div(n, kThreads)))); }

}  // namespace

void f32_to_bf16(const float* x, int64_t n, __nv_bfloat16* y, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, y);
  NVFP4_CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
}

void swiglu_to_bf16(const float* gu, int64_t tokens, int64_t inter, bool has_limit, float limit,
                    __nv_bfloat16* h, cudaStream_t stream) {
  if (tokens == 0) return;
  swiglu_kernel<<<grid_for(tokens * inter), kThreads, 0, stream>>>(gu, tokens, inter, has_limit, limit, h);
  NVFP4_CUDA_CHECK_LAUNCH("swiglu_kernel");
}

}  // namespace nvfp4moe::cuda
