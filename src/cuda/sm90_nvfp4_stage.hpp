// sm90_nvfp4_stage: the fast path of activation staging — the same contract
// and the same bytes as quantize_activations / requantize_rows
// (quantize_act.hpp), built for bandwidth and for one-token latency:
//   * one CTA per row and one thread per 16-element block, the block's values
//     loaded once with 16-byte loads and kept in registers (the row amax, the
//     block amax and the quantization all reuse them: one read of x);
//   * the row amax is a warp-shuffle + shared-memory reduction of the block
//     amaxes (max is order-free, NaN propagates as in the codecs);
//   * codes, scale bytes and the BF16 operand written with vector stores.
// Every byte comes from src/format/nvfp4_codec.hpp in the spec's order of
// operations (tests compare with the CPU quantizer and the simple kernels).
#pragma once

#include <cuda_runtime.h>

#include "cuda/quantize_act.hpp"

namespace nvfp4moe::cuda {

// Rows up to 16 * 1024 columns, PerRow or Static scope, 16-byte aligned rows.
bool sm90_nvfp4_stage_supports(const QuantizeActArgs& a);
void sm90_nvfp4_stage(const QuantizeActArgs& a, cudaStream_t stream);

bool sm90_nvfp4_requant_supports(const RequantRowsArgs& a);
void sm90_nvfp4_requant(const RequantRowsArgs& a, cudaStream_t stream);

// What callers that only want the bytes use: the fast kernel where it
// applies, else quantize_activations / requantize_rows (the same bytes).
void stage_activations(const QuantizeActArgs& a, cudaStream_t stream);
void stage_requantized_rows(const RequantRowsArgs& a, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
