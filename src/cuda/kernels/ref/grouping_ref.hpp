// group_pairs_ref: the reference of group_pairs (kernels/grouping.hpp), the
// same contract with the per-expert scan and the work list built by one
// thread. Tests compare the two.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/grouping.hpp"

namespace nvfp4moe::cuda {

void group_pairs_ref(const GroupingArgs& args, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
