// Combine and element-wise kernels (see combine.hpp).
#include "cuda/combine.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/swiglu.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void combine_kernel(CombineArgs a) {
  const int64_t t = blockIdx.y;
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= a.hidden) return;
  float sum = 0.0f;
  for (int j = 0; j < a.top_k; ++j) {
    const int64_t pair = t * a.top_k + j;
    if (a.pos_of_pair[pair] >= 0) sum += a.y_pair[pair * a.hidden + n];
  }
  if (a.shared) sum += a.shared[t * a.hidden + n];
  a.y[t * a.hidden + n] = __float2bfloat16_rn(sum);
}

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

void combine_slots(const CombineArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return;
  NVFP4_CHECK(a.tokens <= 65535, "combine: token count ", a.tokens, " above the grid limit 65535");
  const dim3 grid(unsigned(ceil_div(a.hidden, kThreads)), unsigned(a.tokens));
  combine_kernel<<<grid, kThreads, 0, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("combine_kernel");
}

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
