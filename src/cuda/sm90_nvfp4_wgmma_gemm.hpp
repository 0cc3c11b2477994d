// sm90_nvfp4_wgmma_gemm: the prefill (compute-bound) grouped NVFP4 GEMM.
//
// Same contract as sm90_nvfp4_grouped_gemm (its GroupedGemmPlan, the tile
// layout of the weights, the fused SwiGLU / routing-weight epilogues), built
// for many tokens per expert:
//   * one CTA = 2 consumer warpgroups + 1 producer warp, persistent over
//     tiles of 256 weight rows (two tile-layout chunks, one per consumer
//     warpgroup) x kBlockN token positions of one expert, K in steps of 64;
//   * the producer warp streams each K step into a ring of stages: the two
//     weight chunks by bulk copy (cp.async.bulk, complete_tx on the stage's
//     full barrier), the operand rows of the block's tokens gathered with
//     cp.async into a 128-byte-swizzled K-major tile (arrive.noinc on the
//     same barrier); consumers free a stage through its empty barrier;
//   * each consumer warpgroup dequantizes its chunk's A fragments exactly in
//     registers (tables, one BF16 multiply per two values) and issues
//     wgmma.m64nNk16 with A from registers and the tokens as N ("swap AB");
//   * the epilogue applies g_act * g_w in FP32, then SwiGLU (gate/up rows
//     are interleaved by the layout so one thread holds both) or the routing
//     weight, and stores like the simple kernel.
// The work list is built in the kernel from plan.offsets (experts x 256-row
// pairs x token blocks), so no host synchronisation and no extra launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <ostream>

#include "cuda/sm90_nvfp4_grouped_gemm.hpp"

namespace nvfp4moe::cuda {

struct Sm90WgmmaGemmConfig {
  int block_n = 128;  // token positions per tile: 64 or 128
  int grid = 0;       // persistent CTAs (0: one per SM)
};
std::ostream& operator<<(std::ostream& os, const Sm90WgmmaGemmConfig& c);

// Dynamic shared memory of one CTA.
size_t sm90_nvfp4_wgmma_gemm_smem_bytes(int block_n, int64_t local_experts);

// Opts every instantiation in to the shared memory it needs for up to
// `local_experts` experts, on the current device. Call once before launching
// (e.g. at weight upload): not during stream capture, so forwards stay
// graph-capturable.
void sm90_nvfp4_wgmma_gemm_prepare(int64_t local_experts);

// Queues the GEMM of `plan` (tile-layout weights; plan.offsets and
// plan.local_experts required, plan.tiles unused). No host synchronisation;
// capturable in a CUDA graph.
void sm90_nvfp4_wgmma_gemm(const GroupedGemmPlan& plan, const Sm90WgmmaGemmConfig& cfg, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
