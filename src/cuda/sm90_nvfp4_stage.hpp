// sm90_nvfp4_stage: the fast path of activation staging — the same contract
// and the same bytes as quantize_activations / requantize_rows
// (quantize_act.hpp), built for bandwidth and for one-token latency. Two
// kernels, chosen on the host by what is asked for:
//   * the operand path (only the BF16 operand and g: the routed path's
//     staging and every requantization; BF16 or FP32 input, logical or
//     k-slot order): persistent CTAs, one row at a time each; a row arrives
//     in shared memory by one bulk copy (cp.async.bulk on an mbarrier),
//     issued one row ahead into a two-stage ring; thread i owns blocks i,
//     i + blockDim, ...: block maxima, one CTA barrier for the row maximum,
//     then each block quantized from shared memory and stored as 16-byte
//     units (k-slot rows regrouped in place by the 4 lanes of a chunk, with
//     __syncwarp only). 128-thread CTAs (7-8 per SM) when the rows outnumber
//     the SMs, else one thread per block (a single row's latency);
//   * the codes path (packed codes and/or linear / swizzled scales asked
//     for): one thread per 16-element block keeping its values in registers,
//     the next row's loads in flight while the current one is quantized,
//     two CTA barriers per row.
// Every byte comes from src/format/nvfp4_codec.hpp in the spec's order of
// operations (tests compare with the CPU quantizer and the simple kernels);
// max is order-free and NaN propagates as in the codecs.
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
