// shared_expert_ref (see shared_expert_ref.hpp).
#include "cuda/kernels/ref/shared_expert_ref.hpp"

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/swiglu.cuh"
#include "format/nvfp4_codec.hpp"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 128;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

// Weight (row, k) of a [rows, K] projection: BF16, or E4M3 x its tile scale.
__device__ __forceinline__ float weight(const __nv_bfloat16* wb, const uint8_t* wq, const float* scale,
                                        const Fp8FragmentGeometry& geo, int64_t K, int64_t row, int64_t k) {
  if (!wq) return __bfloat162float(wb[row * K + k]);
  return fmt::e4m3_value(wq[fp8_fragment_offset(geo, row, k)]) * scale[(row / 8) * ((K + 127) / 128) + k / 128];
}

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
    gate += row[k] * weight(a.w13, a.w13_fp8, a.w13_scale, a.w13_geometry, H, i, k);
    up += row[k] * weight(a.w13, a.w13_fp8, a.w13_scale, a.w13_geometry, H, Is + i, k);
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
  for (int64_t k = 0; k < Is; ++k) acc += row[k] * weight(a.w2, a.w2_fp8, a.w2_scale, a.w2_geometry, Is, n, k);
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
