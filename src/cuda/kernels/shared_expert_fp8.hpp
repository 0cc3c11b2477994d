// The block-scaled FP8 shared expert on its FP8 bytes (DeepSeek-V4: E4M3
// weights, one FP32 dequantization factor per 128 x 128 tile):
//   out[T, H] f32 = W2s . (silu(min(W1s x, L)) * clamp(W3s x, -L, L))
// with x and h in BF16 and FP32 sums, as the BF16 shared expert computes
// it. The weights are read once per forward as FP8 (half the bytes of their
// BF16 form) and turned into BF16 in registers exactly (every E4M3 value is
// a BF16 value).
//
// One kernel per projection, mma.sync m16n8k16 BF16 -> FP32, in two forms:
//   GEMV (up to 16 tokens) one m-tile (16 weight rows; gate/up: 8 gate
//         rows and the matching 8 up rows, so a lane holds gate and up of
//         one (row, token) and writes h directly) per CTA over all of K, the
//         4 warps taking every 4th 128-column K tile, each lane's 4 x 16
//         weight bytes (layout/fp8_fragment_layout: a warp's loads are
//         contiguous 512-byte pieces) and x from L1 in a register ring two
//         tiles ahead; E4M3 -> BF16 with integer operations; each tile's sums
//         times the tile scales of the lane's two row groups, added in FP32;
//         the warps' sums added in shared memory. Launched for programmatic
//         dependent launch: the first weight loads overlap the previous
//         kernel's tail.
//   split (more tokens, and any scales) 4 warps x 16 rows x up to 64 tokens
//         x a range of K tiles, x through a cp.async shared-memory ring
//         beyond 16 tokens; when the rows x token tiles leave SMs idle the K
//         tiles are split over gridDim.z CTAs, each writes its partial sums,
//         and the last to arrive (a counter per output block) adds the
//         splits in split order and runs the epilogue: deterministic.
// Token tiles are the fastest grid index, so the CTAs reading the same
// weight rows run together and share them through L2 when T > 64. Long
// batches with power-of-two scales go through fp8_fragments_to_bf16 and a
// BF16 GEMM instead (backend/device_shared_expert.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/layout/fp8_fragment_layout.hpp"
#include "cuda/layout/tensor_map.hpp"

namespace nvfp4moe::cuda {

constexpr int64_t kFp8ScaleTile = 128;   // rows and columns of one scale tile
constexpr int64_t kFp8ScaleGroup = 8;    // weight rows per entry of a group scale table
constexpr int64_t kFp8MaxSplitRows = 8;  // splits x token tiles (of 64) the workspace holds

// Which kernels run (Auto: the wgmma form from kFp8WgmmaMinTokens tokens
// where shared_fp8_wgmma_supports, else the GEMV form up to 16 tokens and
// the split form beyond; the others for tests and benchmarks).
enum class Fp8SharedPath : uint8_t { Auto, Split, Gemv, Wgmma };
// The GEMV form up to 16 tokens (two n8 tiles), the wgmma form from 17.
// NOTES (device time, nvfp4moe_shared_expert_bench): with two register
// stages the GEMV form is the faster one at 12 and 16 tokens on both cards,
// V4-Pro 27.1 / 28.1 us against 28.9 / 28.7 on an H200 (2026-12-07) and
// 30.7-31.7 against 32.1-33.4 on an H100; V4-Flash 14.6 / 15.2 against
// 19.6 / 19.7 on the H200.
constexpr int64_t kFp8WgmmaMinTokens = 17;

// The wgmma form's TMA maps of its x_perm and h scratch (widths 16, 32, 64,
// 128), built once for buffers of max_tokens rows; building them also
// raises the kernels' shared-memory opt-in on the current device.
constexpr int kFp8WgmmaWidths = 4;
struct Fp8WgmmaMaps {
  CUtensorMap x[kFp8WgmmaWidths], h[kFp8WgmmaWidths];
  int64_t max_tokens = 0;
};
Fp8WgmmaMaps make_fp8_wgmma_maps(const __nv_bfloat16* x_perm, const __nv_bfloat16* h, int64_t max_tokens,
                                 int64_t hidden, int64_t inter);

// The GEMV form's CTA (up to 16 tokens, one CTA per m-tile of 16 rows):
// warps over K and register stages. Unless forced, the first of (4, 3),
// (4, 2), (3, 2) whose grid the device holds at once; (4, 2) if none does.
struct Fp8GemvShape {
  int warps = 4, stages = 2;
};
// The unforced shapes of one layer's GEMV launches on the current device,
// of[gate_up][n8_tiles - 1], found once (shared_fp8_gemv_shapes: an
// occupancy query per candidate) so that a launch asks the driver nothing.
struct Fp8GemvShapes {
  Fp8GemvShape of[2][2];
};

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
  int force_gemv_stages = 0;         // 2 or 3: the GEMV form's register stages (tests); 0: chosen
  int force_gemv_warps = 0;          // 3 or 4: the GEMV form's warps a CTA (tests); 0: chosen
  Fp8SharedPath path = Fp8SharedPath::Auto;
  bool scales_fold = false;          // every tile factor a power of two 2^-117 .. 2^7 (the wgmma form)
  __nv_bfloat16* x_perm = nullptr;   // scratch [T, H] (the wgmma form: x in its column order)
  const Fp8WgmmaMaps* wgmma_maps = nullptr;  // of x_perm and h (the wgmma form)
  const Fp8GemvShapes* gemv_shapes = nullptr;  // the device's GEMV shapes; null: found at each launch
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
// The GEMV shapes of a layer of H = hidden, Is = inter on the current device.
Fp8GemvShapes shared_fp8_gemv_shapes(int64_t hidden, int64_t inter);
// The shape of `a`'s gate/up (gate_up) or down launch on the current device:
// the entry of a.gemv_shapes (or of shared_fp8_gemv_shapes found now), then
// the forced fields.
Fp8GemvShape shared_fp8_gemv_shape(const SharedFp8Args& a, bool gate_up);
// Whether shared_expert_fp8 runs the wgmma form for `a`.
bool shared_fp8_uses_wgmma(const SharedFp8Args& a);

// The wgmma form (kernels/shared_expert_fp8_wgmma.cu): one producer warp and
// two consumer warpgroups (each a 64-column chunk of every K tile) per 64
// rows x up to 128 tokens x all of K, weights by bulk copy and x by TMA
// through a shared-memory ring, A fragments converted in registers with the tile factor folded in.
// H and Is multiples of 64 up to 16384, scales_fold, x_perm given; it takes
// no K split (force_splits, partial and counters are the split form's).
bool shared_fp8_wgmma_supports(const SharedFp8Args& a);
void shared_expert_fp8_wgmma(const SharedFp8Args& a, cudaStream_t stream);

// m-tiles [m_tile0, m_tile0 + m_tiles) of one projection in the fragment
// layout, times their tile scales, as row-major BF16 [fp8_chunk_rows(g,
// m_tiles), g.cols]: gate/up, the chunk's gate rows 8 m_tile0 .. then its up
// rows Is + 8 m_tile0 ..; down, rows 16 m_tile0 .. (clipped at g.rows). The
// prefill path hands them to a BF16 GEMM. Exact where the scales are powers
// of two (fp8_scales_are_powers_of_two), which is when it is used.
void fp8_fragments_to_bf16(const uint8_t* w, const Fp8FragmentGeometry& g, const float* group_scale, int64_t m_tile0,
                           int64_t m_tiles, __nv_bfloat16* out, cudaStream_t stream);
int64_t fp8_chunk_rows(const Fp8FragmentGeometry& g, int64_t m_tiles);
// Whether every tile scale is a power of two 2^e, -117 <= e <= max_exponent
// (its E4M3 multiples are all normal BF16 values for max_exponent 118; the
// wgmma form folds 2^(120 + e) into a BF16 multiplier, which needs e <= 7).
// DeepSeek-V4's F8_E8M0 scales of real weights are.
bool fp8_scales_are_powers_of_two(const std::vector<float>& tile_scale, int max_exponent = 118);

}  // namespace nvfp4moe::cuda
