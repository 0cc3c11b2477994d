// combine_slots (see combine.hpp).
#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/dependent_launch.hpp"
#include "cuda/kernels/combine.hpp"
#include "cuda/kernels/ref/combine_ref.hpp"
#include "cuda/ptx/sm90_griddep.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSlotBatch = 8;   // slots whose loads are in flight together
constexpr int kMaxVectorSlots = 64;  // top_k the vector kernel takes: its live flags are one 64-bit mask

// CTA (t, s) sums token t's columns 4 c for c = s * kThreads + tid, stepping
// by gridDim.y * kThreads, 4 columns per thread and step. The slots' live
// flags are read once per thread, into a bit mask; then the loads of up to
// kSlotBatch slots are issued together (predicated, independent) before they
// are summed in slot order, so each thread has many loads in flight instead
// of a chain of flag -> row loads per slot (the reference kernel's latency
// bound). Same sums, same order, same rounding as combine_ref_kernel.
__global__ void __launch_bounds__(kThreads) combine_kernel(CombineArgs a) {
  // Launched to overlap the kernel before it: wait for it before any access.
  ptx::griddep_launch_dependents();
  ptx::griddep_wait();
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

}  // namespace

bool combine_vectorized(const CombineArgs& a) {
  return a.hidden % 4 == 0 && a.top_k <= kMaxVectorSlots && aligned_to(a.y_pair, 16) &&
         (!a.shared || aligned_to(a.shared, 16)) && aligned_to(a.y, 8);
}

void combine_slots(const CombineArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return;
  NVFP4_CHECK(a.top_k > 0 && a.hidden > 0, "combine_slots: top_k ", a.top_k, " and hidden ", a.hidden,
              " must be positive");
  if (!combine_vectorized(a)) return combine_slots_ref(a, stream);
  NVFP4_CHECK(a.tokens <= int64_t(INT32_MAX), "combine_slots: token count ", a.tokens, " above the grid limit");
  const int64_t splits = combine_column_splits(a.tokens, a.hidden, kThreads);
  launch_dependent(combine_kernel, dim3(unsigned(a.tokens), unsigned(splits)), dim3(kThreads), 0, stream, true, a);
}

// NOTES (measured on the H200): with one CTA per token, a decode
// batch's few CTAs walked H / 1024 column steps one load round trip after
// another (7 at H = 7168: 7.5 us of the graph at T = 1; 3.9 us split).
int64_t combine_column_splits(int64_t tokens, int64_t hidden, int threads) {
  const int64_t steps = ceil_div(hidden / 4, threads);
  return std::max<int64_t>(1, std::min(steps, ceil_div(2 * sm_count(), std::max<int64_t>(1, tokens))));
}

}  // namespace nvfp4moe::cuda
