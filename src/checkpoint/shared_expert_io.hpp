// The shared expert of one MoE block, read from and written to a checkpoint
// in either layout: BF16 weights, or FP8 E4M3 weights with one factor per
// 128x128 tile (F8_E8M0 `scale` bytes as DeepSeek's release stores them, or F32
// `scale` / `weight_scale_inv`).
#pragma once

#include "checkpoint/moe_names.hpp"
#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe {

// Fills `out` from the block's shared_experts tensors and sets
// cfg.shared_intermediate from their shape. Throws naming the tensor (and
// the index, for NaN weight bytes and NaN / non-positive scales).
void load_shared_expert(const ModelDir& dir, const MoeNames& names, MoeConfig& cfg, SharedExpertWeights& out);

// The tile factors of the FP8 weight "<prefix>.weight" [N, K]: its `scale` or
// `weight_scale_inv`, F8_E8M0 (2^(b - 127)) or F32, [ceil(N/128), ceil(K/128)];
// throws naming the tensor and the tile for a NaN byte or a factor <= 0.
std::vector<float> read_tile_scales(const ModelDir& dir, const std::string& prefix, int64_t N, int64_t K);

// Adds the shared expert's tensors to `st`; `s` must outlive st.write().
void append_shared_expert(SafetensorsWriter& st, const MoeNames& names, const SharedExpertWeights& s,
                          int64_t hidden, int64_t inter);

}  // namespace nvfp4moe
