// A kernel launch for programmatic dependent launch (sm_90): the kernel may
// start while the previous kernel of the stream still runs; it must execute
// griddepcontrol.wait (ptx/sm90_griddep.cuh) before it touches what that
// kernel writes or reads. With `overlap` false it is an ordinary launch.
//
// An SM keeps the split of its 256 KB between shared memory and L1 that the
// first kernel placed on it chose, until it is idle again: CTAs of the next
// kernel that join it while it runs get that split. A small kernel followed
// by one launched to overlap it (the decode GEMMs, which read their
// activation rows through L1) therefore asks for the largest L1
// (`prefer_l1`): on the H100, the decode GEMM's CTAs that joined the SMs of
// a staging kernel with the default split ran 10-15 % slower for the whole
// GEMM (docs/performance.md).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/cuda_check.hpp"

namespace nvfp4moe::cuda {

struct LaunchOverlap {
  bool with_previous = false;  // may start while the previous kernel runs
  bool prefer_l1 = false;      // the smallest shared-memory carveout that holds the kernel

  // A kernel of `ctas` CTAs whose successor is launched to overlap it (and
  // which overlaps its own predecessor when `with_previous`): the largest L1
  // where the grid is at most one CTA an SM; a larger grid was sized for the
  // residency of the default split.
  static LaunchOverlap ahead_of_overlap(bool with_previous, bool next_overlaps, int64_t ctas) {
    return {with_previous, next_overlaps && ctas <= sm_count()};
  }
};

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      LaunchOverlap overlap, Args&&... args) {
  cudaLaunchConfig_t lc{};
  lc.gridDim = grid;
  lc.blockDim = block;
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (overlap.with_previous) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (overlap.prefer_l1) {
    attrs[n].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
    attrs[n++].val.sharedMemCarveout = unsigned(cudaSharedmemCarveoutMaxL1);
  }
  lc.attrs = attrs;
  lc.numAttrs = n;
  NVFP4_CUDA_CHECK(cudaLaunchKernelEx(&lc, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      bool overlap, Args&&... args) {
  launch_dependent(kernel, grid, block, smem, stream, LaunchOverlap{overlap, false}, std::forward<Args>(args)...);
}

}  // namespace nvfp4moe::cuda
