// The shared expert of one MoE block, read from and written to a checkpoint
// in either layout: BF16 weights, or FP8 E4M3 weights with one factor per
// 128x128 tile (F8_E8M0 `scale` bytes as DeepSeek's release stores them, or F32
// `scale` / `weight_scale_inv`). DeepSeek-V4.1's FP8 with 32x32 blocks is read
// as its exact BF16 values (written back as BF16).
#pragma once

#include "checkpoint/moe_names.hpp"
#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe {

// Fills `out` from the block's shared_experts tensors and sets
// cfg.shared_intermediate from their shape: FP8 with 128x128 tiles as
// SharedExpertFormat::Fp8Block, FP8 with 32x32 blocks dequantized exactly to
// SharedExpertFormat::Bf16. Throws naming the tensor (and the index, for NaN
// weight bytes and NaN / non-positive scales).
void load_shared_expert(const ModelDir& dir, const MoeNames& names, MoeConfig& cfg, SharedExpertWeights& out);

// The block factors of the FP8 weight "<prefix>.weight" [N, K]: its `scale`
// or `weight_scale_inv`, F8_E8M0 (2^(b - 127)) or F32, one per 128 x 128
// block ([ceil(N/128), ceil(K/128)], DeepSeek-V4) or per 32 x 32 block
// (DeepSeek-V4.1), told by the shape; throws naming the tensor and the block
// for a NaN byte or a factor <= 0, and both shapes for any other.
struct Fp8BlockScales {
  int64_t block = SharedExpertWeights::kFp8Tile;  // rows and columns of one block
  std::vector<float> factors;                     // [ceil(N/block), ceil(K/block)] row-major
};
Fp8BlockScales read_block_scales(const ModelDir& dir, const std::string& prefix, int64_t N, int64_t K);

// Adds the shared expert's tensors to `st`; `s` must outlive st.write().
void append_shared_expert(SafetensorsWriter& st, const MoeNames& names, const SharedExpertWeights& s,
                          int64_t hidden, int64_t inter);

}  // namespace nvfp4moe
