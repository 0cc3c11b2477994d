// combine_slots_ref: the reference of combine_slots (kernels/combine.hpp),
// one output element per thread, the same sums in the same order. Also what
// combine_slots runs when its vector kernel does not apply.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/combine.hpp"

namespace nvfp4moe::cuda {

void combine_slots_ref(const CombineArgs& args, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
