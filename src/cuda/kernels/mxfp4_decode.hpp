// MXFP4 weights on the GPU, for `nvfp4moe convert --device cuda`
// (docs/checkpoints.md, "convert"): DeepSeek's packed E2M1 codes [N, K/2]
// (element 2i in the low nibble) with one UE8M0 byte per 32 elements
// [N, K/32], the codec of src/format/mxfp4_codec.hpp.
//
//   * mxfp4_decode_bf16: every element as BF16, value(q) * 2^(b - 127):
//     exact (at most 3 significant bits, in BF16's exponent range; bytes
//     above 0xFC are refused when the weight is read), so the NVFP4
//     quantizer sees the values the host's dequantize_mxfp4_rows gives;
//   * mxfp4_max_scale_byte: the largest non-zero scale byte (0 if none),
//     the lossless cast's k_max + 127;
//   * mxfp4_keep_exact_blocks: the lossless cast's exact half. With
//     g = 2^m, every 16-block of MX block j with delta = b_j - 127 - m in
//     [-9, 8] gets its 8 code bytes unchanged and the E4M3 scale 2^delta;
//     the other blocks keep what the quantizer wrote. Counts the blocks kept.
// All of them are queued on `stream` with no host synchronisation; device
// pointers, rows dense.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nvfp4moe::cuda {

void mxfp4_decode_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, __nv_bfloat16* out,
                       cudaStream_t stream);

// *max_byte (device) = the largest of the n bytes that is not 0, or 0.
void mxfp4_max_scale_byte(const uint8_t* scales, int64_t n, unsigned* max_byte, cudaStream_t stream);

// nv_codes [rows, cols/2], nv_scales [rows, cols/16] as the quantizer left
// them under g = 2^m; *exact_blocks (device) is set to the blocks kept.
void mxfp4_keep_exact_blocks(const uint8_t* mx_codes, const uint8_t* mx_scales, int64_t rows, int64_t cols, int m,
                             uint8_t* nv_codes, uint8_t* nv_scales, unsigned long long* exact_blocks,
                             cudaStream_t stream);

}  // namespace nvfp4moe::cuda
