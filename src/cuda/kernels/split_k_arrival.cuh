// The arrival of a CTA at its output block when K is split over gridDim.z
// (the FP8 shared-expert kernels): every thread calls it after writing its
// split's partial sums; it returns true in the CTA that arrived last, which
// then adds the splits in split order (deterministic sums) and finds the
// counter reset for the next launch.
#pragma once

#include <cstdint>

namespace nvfp4moe::cuda {

__device__ __forceinline__ bool last_split_to_arrive(int32_t* counter, int splits) {
  __shared__ int is_last;
  __threadfence();  // this CTA's partial sums, visible before its arrival
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == splits - 1;
  __syncthreads();
  if (!is_last) return false;
  __threadfence();  // the other splits' sums, visible to this CTA's reads
  if (threadIdx.x == 0) *counter = 0;
  return true;
}

}  // namespace nvfp4moe::cuda
