// Combine and element-wise kernels (see combine.hpp).
#include <algorithm>
#include <cstdint>
#include "cuda/combine.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/swiglu.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSlotBatch = 8;   // slots whose loads are in flight together
constexpr int kMaxVectorSlots = 64;  // top_k the vector kernel takes: its live flags are one 64-bit mask

// Scalar reference: one element per thread. Used when rows are not 16-byte
// aligned or H % 4 != 0, and by the tests as the reference of the vector kernel.
__global__ void combine_ref_kernel(CombineArgs a) {
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

// CTA (t, s) sums token t's columns 4 c for c = s * kThreads + tid, stepping
// by gridDim.y * kThreads, 4 columns per thread and step. The slots' live
// flags are read once per thread, into a bit mask; then the loads of up to
// kSlotBatch slots are issued together (predicated, independent) before they
// are summed in slot order, so each thread has many loads in flight instead
// of a chain of flag -> row loads per slot (the reference kernel's latency
// bound). Same sums, same order, same rounding as combine_ref_kernel.
__global__ void __launch_bounds__(kThreads) combine_kernel(CombineArgs a) {
  const int64_t t = blockIdx.x;
  const int64_t cols4 = a.hidden / 4, step = int64_t(gridDim.y) * kThreads;
  const float4* yp = reinterpret_cast<const float4*>(a.y_pair) + t * a.top_k * cols4;
  const float4* sh = a.shared ? reinterpret_cast<const float4*>(a.shared) + t * cols4 : nullptr;
  uint2* out = reinterpret_cast<uint2*>(a.y + t * a.hidden);
  uint64_t live_slots = 0;  // bit j: slot j computed here
  for (int j = 0; j < a.top_k; ++j) live_slots |= uint64_t(a.pos_of_pair[t * a.top_k + j] >= 0) << j;
  for (int64_t c = int64_t(blockIdx.y) * kThreads + threadIdx.x; c < cols4; c += step) {
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j0 = 0; j0 < a.top_k; j0 += kSlotBatch) {
      float4 v[kSlotBatch];
      bool live[kSlotBatch];
#pragma unroll
      for (int j = 0; j < kSlotBatch; ++j) {
        live[j] = (live_slots >> (j0 + j)) & 1u;  // j0 + j <= 63: bits at and above top_k are 0
        if (live[j]) v[j] = __ldcs(yp + int64_t(j0 + j) * cols4 + c);  // read once: do not keep in L2
      }
#pragma unroll
      for (int j = 0; j < kSlotBatch; ++j)
        if (live[j]) {
          sum.x += v[j].x;
          sum.y += v[j].y;
          sum.z += v[j].z;
          sum.w += v[j].w;
        }
    }
    if (sh) {
      const float4 s = sh[c];
      sum.x += s.x;
      sum.y += s.y;
      sum.z += s.z;
      sum.w += s.w;
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(sum.x, sum.y), hi = __floats2bfloat162_rn(sum.z, sum.w);
    out[c] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
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

bool combine_vectorized(const CombineArgs& a) {
  return a.hidden % 4 == 0 && a.top_k <= kMaxVectorSlots && aligned_to(a.y_pair, 16) &&
         (!a.shared || aligned_to(a.shared, 16)) && aligned_to(a.y, 8);
}

void combine_slots_ref(const CombineArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return;
  NVFP4_CHECK(a.tokens <= 65535, "combine_slots_ref: token count ", a.tokens, " above the grid limit 65535");
  const dim3 grid(unsigned(ceil_div(a.hidden, kThreads)), unsigned(a.tokens));
  combine_ref_kernel<<<grid, kThreads, 0, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("combine_ref_kernel");
}

void combine_slots(const CombineArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return;
  NVFP4_CHECK(a.top_k > 0 && a.hidden > 0, "combine_slots: top_k ", a.top_k, " and hidden ", a.hidden,
              " must be positive");
  if (!combine_vectorized(a)) return combine_slots_ref(a, stream);
  NVFP4_CHECK(a.tokens <= int64_t(INT32_MAX), "combine_slots: token count ", a.tokens, " above the grid limit");
  const int64_t splits = combine_column_splits(a.tokens, a.hidden, kThreads);
  combine_kernel<<<dim3(unsigned(a.tokens), unsigned(splits)), kThreads, 0, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("combine_kernel");
}

// NOTES (bench/NOTES.md, session 8): with one CTA per token, a decode
// batch's few CTAs walked H / 1024 column steps one load round trip after
// another (7 at H = 7168: 7.5 us of the graph at T = 1; 3.9 us split).
int64_t combine_column_splits(int64_t tokens, int64_t hidden, int threads) {
  const int64_t steps = ceil_div(hidden / 4, threads);
  return std::max<int64_t>(1, std::min(steps, ceil_div(2 * sm_count(), std::max<int64_t>(1, tokens))));
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
