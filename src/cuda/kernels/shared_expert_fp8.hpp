// The block-scaled FP8 shared expert on its FP8 bytes (DeepSeek-V4: E4M3
// weights, one FP32 dequantization factor per 128 x 128 tile):
//   out[T, H] f32 = W2s . (silu(min(W1s x, L)) * clamp(W3s x, -L, L))
// with x and h in BF16 and FP32 sums, as the BF16 shared expert computes
// it. The weights are read once per forward as FP8 (half the bytes of their
// BF16 form) and turned into BF16 in registers exactly (every E4M3 value is
// a BF16 value).
//
// One kernel per projection, mma.sync m16n8k16 BF16 -> FP32:
//   CTA   4 warps x 16 weight rows (gate/up: warp w takes 8 gate rows and
//         the matching 8 up rows, so a lane holds gate and up of one
//         (row, token) and writes h directly) x up to 64 tokens (the n side,
//         8 per mma) x a range of 128-column K tiles;
//   loop  per K tile: each lane's 4 x 16 weight bytes (layout/fp8_fragment_layout:
//         a warp's loads are contiguous 512-byte pieces) into a register
//         ring of stages ahead of the math, with x the same way from L1 up
//         to 16 tokens, or beyond through a cp.async shared-memory ring for
//         the CTA's 4 warps; the tile's partial sums are
//         multiplied by the tile scales of the lane's two row groups and
//         added (FP32);
//   split when the rows x token tiles leave SMs idle (decode), the K tiles
//         are split over gridDim.z CTAs; each writes its partial sums, and
//         the last to arrive (a counter per output block) adds the splits
//         in split order and runs the epilogue: the sums are deterministic.
// Token tiles are the fastest grid index, so the CTAs reading the same
// weight rows run together and share them through L2 when T > 64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace nvfp4moe::cuda {

constexpr int64_t kFp8ScaleTile = 128;   // rows and columns of one scale tile
constexpr int64_t kFp8ScaleGroup = 8;    // weight rows per entry of a group scale table
constexpr int64_t kFp8MaxSplitRows = 8;  // splits x token tiles (of 64) the workspace holds

struct SharedFp8Args {
  const __nv_bfloat16* x = nullptr;  // [T, H]
  int64_t tokens = 0, hidden = 0, inter = 0;
  const uint8_t* w13 = nullptr;      // E4M3 [2 Is, H] (gate rows, then up) as fp8_fragments(pairs)
  const float* w13_scale = nullptr;  // [2 Is / 8, ceil(H / 128)]: each 8-row group's tile scales
  const uint8_t* w2 = nullptr;       // E4M3 [H, Is] as fp8_fragments
  const float* w2_scale = nullptr;   // [H / 8, ceil(Is / 128)]
  bool has_limit = false;
  float limit = 0.0f;
  __nv_bfloat16* h = nullptr;        // scratch [T, Is]
  float* out = nullptr;              // [T, H]
  float* partial = nullptr;          // scratch [kFp8MaxSplitRows * 64, max(2 Is, H)]
  int32_t* counters = nullptr;       // scratch [shared_fp8_counters(H, Is)], zero before the first call
  int sms = 0;                       // SMs of the device (the split choice)
  int force_splits = 0;              // > 0: this many K splits (tests, benchmarks); 0: chosen
};

// H and Is multiples of 16 (the layer's contract); 16-byte aligned x and h.
bool shared_fp8_supports(const SharedFp8Args& a);
int64_t shared_fp8_counters(int64_t hidden, int64_t inter);
// The group scale table of one projection [rows, cols] (rows a multiple of
// 8): its tile scales [ceil(rows / 128), ceil(cols / 128)] repeated for
// each 8-row group, [rows / 8, ceil(cols / 128)]. The gate/up table is the
// gate's followed by the up's.
std::vector<float> fp8_group_scales(const std::vector<float>& tile_scale, int64_t rows, int64_t cols);

void shared_expert_fp8(const SharedFp8Args& a, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
