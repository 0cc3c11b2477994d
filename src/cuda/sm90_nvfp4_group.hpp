// sm90_nvfp4_group: the same contract and results as group_pairs
// (grouping.hpp) — offsets, work list, permutation (positions inside a group
// in atomic order), ids_out, error word — with the per-expert scan and the
// work list built by the whole block rather than by one thread.
#pragma once

#include <cuda_runtime.h>

#include "cuda/grouping.hpp"

namespace nvfp4moe::cuda {

void sm90_nvfp4_group(const GroupingArgs& args, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
