// sm90_nvfp4_prefill_gemm: the prefill (compute-bound) grouped NVFP4 GEMM.
//
// Same contract as grouped_gemm_ref (its GroupedGemmPlan: fused SwiGLU
// / routing-weight epilogues) and the SAME weights as the decode kernel
// sm90_nvfp4_decode_gemm (the fragment layout, fragment_layout.hpp), so a
// layer keeps one copy of its experts whatever the batch. Built for many
// tokens per expert:
//   * one CTA = 2 consumer warpgroups (3 at block_n <= 64, where the
//     dequantization bounds a stage and more warps hide it) + 1 producer
//     warpgroup, persistent over tiles of 8 m-tiles per consumer warpgroup
//     (128 weight rows each: 256 or 384 a tile) x block_n token positions of
//     one expert (one of kWgmmaWidths; TokenBlocks says which blocks a
//     launch takes), K in stages of 128;
//   * the producer warpgroup streams each stage into a ring: the m-tiles'
//     code runs and scale words by TMA (one box each), the operand rows
//     K-major in the 128-byte swizzle, by TMA for Down (consecutive
//     positions, plan.act_rows bounds them) and by 16-byte cp.async for
//     GateUp (tokens gathered by pair); the stage's full barrier counts the
//     TMA bytes and the cp.async arrivals. The operand rows must be in k-slot
//     order (operand_order.hpp: the fragment layout permutes K inside each
//     64-column chunk, and the dot product is invariant when both sides
//     agree);
//   * each consumer warpgroup dequantizes its A fragments exactly in
//     registers (11 integer ops per 8 codes, one BF16 multiply per two
//     values), one sub-step ahead of its wgmma.m64nNk16 (A from registers,
//     the tokens as N: "swap AB"); consumers free a stage through its empty
//     barrier;
//   * the epilogue applies g_act * g_w (and the layout's 2^8) in FP32, then
//     SwiGLU or the routing weight, and stores like the other kernels.
// The work list is built in the kernel from plan.offsets (experts x m-blocks
// x token blocks), so no host synchronisation and no extra launch.
//
// The FP8 form (Operand::Fp8, plan.act_fp8 set; layout/fp8_operand.hpp): for
// weights whose rows are E4M3 values times a power of two (w.fp8_rows) and
// the `fp8` activation mode. The same pipeline with 4 m-tiles per consumer
// warpgroup (one m64 tile), the operand E4M3 rows (one 128-byte swizzle
// row per position and stage) and their per-128-column scales in the ring,
// the A fragments converted to E4M3 in registers (fragment_dequant.cuh),
// wgmma.m64nNk32 E4M3 x E4M3 into a partial sum per stage, and acc += part *
// scale in FP32 per position (the promotion); the epilogue applies g_w * 2^E
// of each row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <ostream>

#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"
#include "cuda/layout/grouped_gemm_plan.hpp"

namespace nvfp4moe::cuda {

// The tile widths (wgmma N) of the kernel, widest first: the order of the
// Split launches.
// NOTES (measured on the H200): steps of 16 (eight widths) measured no
// faster than steps of 32 — below 128 columns a tile's cost barely follows
// its width.
constexpr int kWgmmaWidths[] = {128, 96, 64, 32};
constexpr bool is_wgmma_width(int width) {
  for (const int w : kWgmmaWidths)
    if (w == width) return true;
  return false;
}

// The wgmma width of a block with `rows` live positions under Split: the
// next multiple of 32.
constexpr int wgmma_tile_width(int rows) { return (rows + 31) / 32 * 32; }

// Which token blocks of each expert's rows a launch covers.
//   All: every block of block_n positions (an expert's last one may be
//     partial and still runs block_n wide).
//   Split: an expert with r rows is r / 128 full blocks of 128 and, when
//     r % 128 != 0, one last block of r % 128 rows, run at
//     wgmma_tile_width(r % 128). The launch with block_n W takes the last
//     blocks of width W and, for W = 128, the full blocks: the four
//     launches (kWgmmaWidths) together cover every block once, and a partial
//     last block leaves at most 31 tile columns idle instead of up to 127
//     (a narrower tile takes less time). One kernel cannot
//     switch widths per tile: the 128-wide accumulators leave ptxas no
//     registers for a second wgmma shape, and it serialises them.
enum class TokenBlocks : int32_t { All, Split };

// The operand form of a launch: BF16 rows (plan.act, BF16 wgmma) or E4M3
// rows (plan.act_fp8, FP8 wgmma).
enum class Operand : uint8_t { Bf16, Fp8 };
inline Operand prefill_operand(const GroupedGemmPlan& p) { return p.act_fp8 ? Operand::Fp8 : Operand::Bf16; }

struct Sm90PrefillGemmConfig {
  int block_n = 128;  // token positions per tile: one of kWgmmaWidths
  int grid = 0;       // persistent CTAs (0: one per SM)
  TokenBlocks blocks = TokenBlocks::All;
  // Programmatic dependent launch: the kernel may start on the SMs the
  // previous kernel in the stream frees while that one still runs, so the
  // previous kernel must not write anything this one reads (true between
  // the Split launches: same inputs, disjoint outputs). Either way the kernel
  // completes only after the previous one: what follows sees both.
  bool overlap_previous = false;
};
std::ostream& operator<<(std::ostream& os, const Sm90PrefillGemmConfig& c);

// Opts every instantiation in to the shared memory it needs for up to
// `local_experts` experts, on the current device (raising, never lowering, an
// earlier opt-in: layers of different sizes can share a process). Call before
// launching (e.g. at weight upload), not during stream capture.
void sm90_nvfp4_prefill_gemm_prepare(int64_t local_experts);

// Queues the TokenBlocks::Split launches of every width (kWgmmaWidths), each
// after the first overlapping the tail of the one before.
void sm90_nvfp4_prefill_gemm_split(const GroupedGemmPlan& plan, const FragmentWeights& w, cudaStream_t stream);

// Queues the GEMM of `plan` (its weights/geometry/tiles fields are unused;
// plan.offsets and plan.local_experts are required) on the fragment-layout
// weights `w` (any geometry fragment_geometry accepts). No host synchronisation;
// capturable in a CUDA graph.
void sm90_nvfp4_prefill_gemm(const GroupedGemmPlan& plan, const FragmentWeights& w, const Sm90PrefillGemmConfig& cfg,
                           cudaStream_t stream);

}  // namespace nvfp4moe::cuda
