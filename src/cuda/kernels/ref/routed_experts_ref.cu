// routed_gate_up_ref and routed_down_ref (see routed_experts_ref.hpp).
#include "cuda/kernels/ref/routed_experts_ref.hpp"

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/swiglu.cuh"
#include "format/mxfp4_codec.hpp"

namespace nvfp4moe::cuda {

namespace {

using fmt::e2m1_value;
using fmt::e4m3_value;
using fmt::kBlock;

constexpr int kThreads = 128;

// sum_k a[k] * value(w_k) * s(w block), the weight row given as packed codes
// and linear scales (NVFP4: UE4M3 per 16; MXFP4: UE8M0 per 32, 2^(b - 127));
// a is the staged row (shared memory).
__device__ __forceinline__ float dot_weight_row(const float* a, const uint8_t* codes, const uint8_t* scales,
                                                int64_t k, bool mxfp4) {
  float acc = 0.0f;
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const float s = mxfp4 ? fmt::ue8m0_value(scales[b / 2]) : e4m3_value(scales[b]);
    float part = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlock / 2; ++i) {
      const uint8_t byte = codes[b * 8 + i];
      part += a[b * kBlock + 2 * i] * e2m1_value(byte & 15) + a[b * kBlock + 2 * i + 1] * e2m1_value(byte >> 4);
    }
    acc += part * s;
  }
  return acc;
}

// grid (positions_max, ceil(I / kThreads)); dynamic smem: H floats.
__global__ void routed_gate_up_ref_kernel(RoutedExpertsRefArgs a, float* h) {
  extern __shared__ float row[];
  const int32_t pos = blockIdx.x;
  if (pos >= *a.live_positions) return;
  const int64_t H = a.hidden, I = a.inter;
  const int64_t x = a.pair_of_pos[pos] / a.top_k;
  const int32_t e = a.expert_of_pos[pos];
  for (int64_t k = threadIdx.x; k < H; k += blockDim.x) {
    const uint8_t byte = a.x_codes[x * (H / 2) + k / 2];
    row[k] = e2m1_value((k & 1) ? (byte >> 4) : (byte & 15)) * e4m3_value(a.x_scales[x * (H / 16) + k / 16]);
  }
  __syncthreads();
  const int64_t i = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (i >= I) return;
  const int64_t gate_row = int64_t(e) * 2 * I + i, up_row = gate_row + I, kb = a.mxfp4 ? H / 32 : H / 16;
  const float gate = dot_weight_row(row, a.w13_codes + gate_row * (H / 2), a.w13_scales + gate_row * kb, H, a.mxfp4) *
                     (a.x_g[x] * a.w13_global[2 * e]);
  const float up = dot_weight_row(row, a.w13_codes + up_row * (H / 2), a.w13_scales + up_row * kb, H, a.mxfp4) *
                   (a.x_g[x] * a.w13_global[2 * e + 1]);
  h[int64_t(pos) * I + i] = swiglu_limited(gate, up, a.has_limit, a.limit);
}

// grid (positions_max, ceil(H / kThreads)); dynamic smem: I floats.
__global__ void routed_down_ref_kernel(RoutedExpertsRefArgs a, const __nv_bfloat16* h_deq, int64_t ld,
                                       const float* h_g, PairOutput y_pair) {
  extern __shared__ float row[];
  const int32_t pos = blockIdx.x;
  if (pos >= *a.live_positions) return;
  const int64_t H = a.hidden, I = a.inter;
  const int32_t e = a.expert_of_pos[pos], pair = a.pair_of_pos[pos];
  for (int64_t k = threadIdx.x; k < I; k += blockDim.x) row[k] = __bfloat162float(h_deq[int64_t(pos) * ld + k]);
  __syncthreads();
  const int64_t n = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (n >= H) return;
  const int64_t wrow = int64_t(e) * H + n;
  const float o = dot_weight_row(row, a.w2_codes + wrow * (I / 2), a.w2_scales + wrow * (a.mxfp4 ? I / 32 : I / 16), I,
                                 a.mxfp4) *
                  (h_g[pos] * a.w2_global[e]);
  pair_row(y_pair, pair, H).store(n, a.pair_weights[pair] * o);
}

}  // namespace

void routed_experts_ref_prepare(int64_t hidden, int64_t inter) {
  allow_smem_at_least(routed_gate_up_ref_kernel, size_t(hidden) * 4);
  allow_smem_at_least(routed_down_ref_kernel, size_t(inter) * 4);
}

void routed_gate_up_ref(const RoutedExpertsRefArgs& a, float* h, cudaStream_t stream) {
  if (a.positions_max <= 0) return;
  const dim3 grid(unsigned(a.positions_max), unsigned(ceil_div(a.inter, kThreads)));
  routed_gate_up_ref_kernel<<<grid, kThreads, size_t(a.hidden) * 4, stream>>>(a, h);
  NVFP4_CUDA_CHECK_LAUNCH("routed_gate_up_ref_kernel");
}

void routed_down_ref(const RoutedExpertsRefArgs& a, const __nv_bfloat16* h_deq, int64_t ld, const float* h_g,
                     const PairOutput& y_pair, cudaStream_t stream) {
  if (a.positions_max <= 0) return;
  const dim3 grid(unsigned(a.positions_max), unsigned(ceil_div(a.hidden, kThreads)));
  routed_down_ref_kernel<<<grid, kThreads, size_t(a.inter) * 4, stream>>>(a, h_deq, ld, h_g, y_pair);
  NVFP4_CUDA_CHECK_LAUNCH("routed_down_ref_kernel");
}

}  // namespace nvfp4moe::cuda
