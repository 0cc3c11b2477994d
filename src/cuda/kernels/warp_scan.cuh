// Inclusive prefix sum over the 32 lanes of a warp (shuffles, all lanes
// active): the one scan the grouping, work-list and expert-parallel
// placement kernels share.
#pragma once

#include <cstdint>

namespace nvfp4moe::cuda {

// v of lanes 0..lane summed, for lane = this thread's lane.
template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v) {
  const int lane = int(threadIdx.x % 32);
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

}  // namespace nvfp4moe::cuda
