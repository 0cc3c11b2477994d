// shared_expert_ref (see shared_expert_ref.hpp).
#include "cuda/kernels/ref/shared_expert_ref.hpp"

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/swiglu.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

// grid (tokens, ceil(Is / kThreads)); smem: H floats of x.
template <typename XT>
__global__ void shared_gate_up_ref_kernel(SharedExpertRefArgs a) {
  extern __shared__ float row[];
  const int64_t t = blockIdx.x, H = a.hidden, Is = a.inter;
  const XT* x = static_cast<const XT*>(a.x);
  for (int64_t k = threadIdx.x; k < H; k += blockDim.x) row[k] = to_f32(x[t * H + k]);
  __syncthreads();
  const int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= Is) return;
  float gate = 0.0f, up = 0.0f;
  for (int64_t k = 0; k < H; ++k) {
    gate += row[k] * __bfloat162float(a.w13[i * H + k]);
    up += row[k] * __bfloat162float(a.w13[(Is + i) * H + k]);
  }
  a.h[t * Is + i] = swiglu_limited(gate, up, a.has_limit, a.limit);
}

// grid (tokens, ceil(H / kThreads)); smem: Is floats of h.
__global__ void shared_down_ref_kernel(SharedExpertRefArgs a) {
  extern __shared__ float row[];
  const int64_t t = blockIdx.x, H = a.hidden, Is = a.inter;
  for (int64_t k = threadIdx.x; k < Is; k += blockDim.x) row[k] = a.h[t * Is + k];
  __syncthreads();
  const int64_t n = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (n >= H) return;
  float acc = 0.0f;
  for (int64_t k = 0; k < Is; ++k) acc += row[k] * __bfloat162float(a.w2[n * Is + k]);
  a.out[t * H + n] = acc;
}

}  // namespace

void shared_expert_ref_prepare(int64_t hidden, int64_t inter) {
  allow_smem_at_least(shared_gate_up_ref_kernel<__nv_bfloat16>, size_t(hidden) * 4);
  allow_smem_at_least(shared_gate_up_ref_kernel<float>, size_t(hidden) * 4);
  allow_smem_at_least(shared_down_ref_kernel, size_t(inter) * 4);
}

void shared_expert_ref(const SharedExpertRefArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return;
  const dim3 g1(unsigned(a.tokens), unsigned(ceil_div(a.inter, kThreads)));
  if (a.x_is_bf16)
    shared_gate_up_ref_kernel<__nv_bfloat16><<<g1, kThreads, size_t(a.hidden) * 4, stream>>>(a);
  else
    shared_gate_up_ref_kernel<float><<<g1, kThreads, size_t(a.hidden) * 4, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("shared_gate_up_ref_kernel");
  const dim3 g2(unsigned(a.tokens), unsigned(ceil_div(a.hidden, kThreads)));
  shared_down_ref_kernel<<<g2, kThreads, size_t(a.inter) * 4, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("shared_down_ref_kernel");
}

}  // namespace nvfp4moe::cuda
