// sm90_nvfp4_wgmma_gemm: the prefill (compute-bound) grouped NVFP4 GEMM.
//
// Same contract as sm90_nvfp4_grouped_gemm (its GroupedGemmPlan: fused SwiGLU
// / routing-weight epilogues) and the SAME weights as the decode kernel
// sm90_nvfp4_mma_gemm (the fragment layout, sm90_nvfp4_mma_layout.hpp), so a
// layer keeps one copy of its experts whatever the batch. Built for many
// tokens per expert:
//   * one CTA = 2 consumer warpgroups + 1 producer warpgroup, persistent over
//     tiles of 16 m-tiles (256 weight rows, 8 m-tiles per consumer
//     warpgroup) x kBlockN token positions of one expert, K in stages of 128;
//   * the producer warpgroup streams each stage into a ring with 16-byte
//     cp.async (arrive.noinc on the stage's full barrier): the m-tiles' code
//     runs and scale words, and the operand rows of the block's tokens,
//     K-major in the 128-byte swizzle. The operand rows must be in k-slot
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
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <ostream>

#include "cuda/sm90_nvfp4_grouped_gemm.hpp"
#include "cuda/sm90_nvfp4_mma_gemm.hpp"

namespace nvfp4moe::cuda {

// Which token blocks of each expert's rows a launch covers. All: every block
// of block_n. Wide128 (block_n 128) and Tail64 (block_n 64) split the work of
// one expert with r rows in two launches that together cover it once: the
// 128-wide blocks, except that a last block of at most 64 rows (r % 128 in
// 1..64) goes to Tail64 at 64 wide. A partial last block then leaves at most
// 63 tile columns empty instead of up to 127, and a 64-wide tile costs about
// 0.7 of a 128-wide one (bench/NOTES.md).
enum class TokenBlocks : int32_t { All, Wide128, Tail64 };

struct Sm90WgmmaGemmConfig {
  int block_n = 128;  // token positions per tile: 64 or 128
  int grid = 0;       // persistent CTAs (0: one per SM)
  TokenBlocks blocks = TokenBlocks::All;
};
std::ostream& operator<<(std::ostream& os, const Sm90WgmmaGemmConfig& c);

// Opts every instantiation in to the shared memory it needs for up to
// `local_experts` experts, on the current device (raising, never lowering, an
// earlier opt-in: layers of different sizes can share a process). Call before
// launching (e.g. at weight upload), not during stream capture.
void sm90_nvfp4_wgmma_gemm_prepare(int64_t local_experts);

// Queues the GEMM of `plan` (its weights/geometry/tiles fields are unused;
// plan.offsets and plan.local_experts are required) on the fragment-layout
// weights `w` (any geometry mma_geometry accepts). No host synchronisation;
// capturable in a CUDA graph.
void sm90_nvfp4_wgmma_gemm(const GroupedGemmPlan& plan, const MmaWeights& w, const Sm90WgmmaGemmConfig& cfg,
                           cudaStream_t stream);

}  // namespace nvfp4moe::cuda
