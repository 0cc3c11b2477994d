// A kernel launch for programmatic dependent launch (sm_90): the kernel may
// start while the previous kernel of the stream still runs; it must execute
// griddepcontrol.wait (ptx/sm90_griddep.cuh) before it touches what that
// kernel writes or reads. With `overlap` false it is an ordinary launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "cuda/cuda_check.hpp"

namespace nvfp4moe::cuda {

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                      bool overlap, Args&&... args) {
  cudaLaunchConfig_t lc{};
  lc.gridDim = grid;
  lc.blockDim = block;
  lc.dynamicSmemBytes = smem;
  lc.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = &attr;
  lc.numAttrs = overlap ? 1 : 0;
  NVFP4_CUDA_CHECK(cudaLaunchKernelEx(&lc, kernel, std::forward<Args>(args)...));
}

}  // namespace nvfp4moe::cuda
