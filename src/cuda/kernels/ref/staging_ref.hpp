// The reference staging kernels (kernels/staging.hpp has the contract): one
// thread per 16-value block, every byte from format/nvfp4_codec.hpp. They
// also serve what the fast path does not take (ActScope::PerTensor, rows
// over 16 * 1024 columns, unaligned rows); tests compare both byte for byte.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/staging.hpp"

namespace nvfp4moe::cuda {

// Queues the staging on `stream` (memsets included); no host synchronisation.
void quantize_activations_ref(const QuantizeActArgs& args, cudaStream_t stream);
void requantize_rows_ref(const RequantRowsArgs& args, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
