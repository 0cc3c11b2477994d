// sm90_nvfp4_decode_gemm, register-direct kernel (see sm90_nvfp4_decode_gemm.hpp).
//
// CTA: 4 warps on ONE unit — kMTiles m16 weight tiles x (8 * kNTiles) token
// positions of one work tile — each warp a quarter of K. A lane keeps one
// stage in flight (the next one) while the current stage is dequantized and
// multiplied: 4 16-byte weight fragments in registers, and (kActRing) its
// activation operand by cp.async into its own slots of a two-stage
// shared-memory ring (no barrier: a lane reads only what it copied; without
// the ring, activations are loaded chunk by chunk). The last stage of a unit
// prefetches the first stage of the CTA's next unit, so neither stream drains
// between units. Launched to overlap the previous kernel, a CTA starts its
// first unit's weights before it waits for that kernel's outputs.
#pragma once

#include "cuda/kernels/sm90_nvfp4_decode_steps.cuh"
#include "cuda/ptx/sm90_griddep.cuh"

namespace nvfp4moe::cuda {

// Whether an item of kNTiles n8 tiles stages its activations through the
// shared-memory ring. NOTES (measured on the H200): it pays from 2 n8 tiles
// (5-15 %); with one, the direct loads were faster (by ~12 % at 1-8 tokens
// per expert). Defining NVFP4MOE_DECODE_RING_MIN_NTILES moves the switch.
#ifndef NVFP4MOE_DECODE_RING_MIN_NTILES
#define NVFP4MOE_DECODE_RING_MIN_NTILES 2
#endif
template <int kNTiles>
constexpr bool kActRing = kNTiles >= NVFP4MOE_DECODE_RING_MIN_NTILES;

// Dynamic shared memory of the activation ring: [2 stages][kWarps][chunk][n8 tile][half][lane] x 16 bytes.
template <int kNTiles, int kMTiles>
constexpr size_t act_ring_bytes() {
  return kActRing<kNTiles> ? size_t(2) * mma_gemm::kActRingStage<kNTiles, kMTiles> : 0;
}

// One function of ~100 lines on purpose: the stage in flight (frag, scl and
// the ring's next stage) is carried in registers from one stage to the next
// and from a unit's last stage into the next unit's first, which is the
// whole software pipeline; its steps (scheduler, activation loads, the
// dequantize-and-multiply of a chunk, the K-split reduction) are the
// functions of sm90_nvfp4_decode_steps.cuh.
template <Projection P, int kNTiles, int kMTiles, int kMinBlocks>
__global__ void __launch_bounds__(mma_gemm::kThreads, kMinBlocks)
    sm90_nvfp4_decode_gemm_kernel(const __grid_constant__ Sm90DecodeGemmParams params) {
  using namespace mma_gemm;
  static_assert(kNTiles == 1 || kNTiles == 2 || kNTiles == 4, "kNTiles: 1, 2 or 4 n8 token tiles per item");
  static_assert(kMTiles == 1 || kMTiles == 2, "kMTiles: 1 or 2 m16 weight tiles per item");
  static_assert(kGemmTileTokens % (8 * kNTiles) == 0, "token groups must tile a work tile");
  constexpr int kStageChunks = kStageChunksOf<kMTiles>;
  static_assert(kStageChunks % kMmaScaleChunks == 0, "a stage must cover whole scale words");
  using Sched = Scheduler<P, kNTiles, kMTiles>;

  // Shared memory: every warp's partial sums, two buffers alternating by unit;
  // the activation ring (act_ring_bytes), one 16-byte slot per lane and load.
  __shared__ float partial[2][kWarps][kMTiles * kNTiles * 4][32];
  extern __shared__ __align__(16) uint8_t act_ring[];
  constexpr uint32_t kRingStage = kActRingStage<kNTiles, kMTiles>;

  const FragmentWeights& w = params.w;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const Sched sch(params, warp, lane);
  const int64_t stages = (sch.k_chunks / kWarps) / kStageChunks;
  const uint4* codes = reinterpret_cast<const uint4*>(w.codes) + sch.chunk0 * 32 + lane;
  // Scale words: one a lane (NVFP4) or one per lane pair (MXFP4), fragment_layout.hpp.
  const int scale_lanes = w.geometry.scale_lanes;
  const uint32_t* scales = reinterpret_cast<const uint32_t*>(w.scales) + (sch.chunk0 / kMmaScaleChunks) * scale_lanes +
                           scale_word_of_lane(scale_lanes, lane);
  // This lane's slot of load (chunk j, tile n, half h) in ring stage b: ring + b * kRingStage + ((j * kNTiles + n) * 2 + h) * kActSlot.
  const uint32_t ring = ptx::smem_addr(act_ring) + uint32_t(warp) * (kRingStage / kWarps) + uint32_t(lane) * 16;

  // Programmatic dependent launch (GroupedGemmPlan::overlap_previous): until
  // griddep_wait only the work list and the weights are read, and every CTA
  // waits before it exits, so the grid completes after the previous one. The
  // next kernel is let in only as CTAs finish (launch_dependents at the end,
  // or the exit): let in at the start, it cost 6-8 us of a one-token forward
  // (H100).
  Unit u = sch.first_unit();
  if (!sch.valid(u)) {
    ptx::griddep_wait();
    return;
  }
  typename Sched::Operands op = sch.operands(u);

  // Pipeline: the weight fragments of the next stage (of this unit or the
  // next one) in registers, its activations in ring stage `buf ^ 1`.
  uint4 frag[kMTiles][kStageChunks];
  uint32_t scl[kMTiles][kStageChunks / kMmaScaleChunks];
  auto load_weights = [&](const typename Sched::Operands& o, int64_t st) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      const uint4* c = codes + (o.et[m] * sch.k_chunks + st * kStageChunks) * 32;
      const uint32_t* s =
          scales + (o.et[m] * (sch.k_chunks / kMmaScaleChunks) + st * (kStageChunks / kMmaScaleChunks)) * scale_lanes;
#pragma unroll
      for (int j = 0; j < kStageChunks; ++j) frag[m][j] = ptx::ld_global_stream_v4(c + j * 32);
#pragma unroll
      for (int j = 0; j < kStageChunks / kMmaScaleChunks; ++j) scl[m][j] = ptx::ld_global_stream_u32(s + j * scale_lanes);
    }
  };
  auto fetch_stage_acts = [&](const typename Sched::Operands& o, int64_t st, int buf) {
    if constexpr (kActRing<kNTiles>) fetch_acts<kNTiles, kStageChunks>(o.act, o.live, st * kStageChunks, ring + buf * kRingStage);
  };
  auto load_stage = [&](const typename Sched::Operands& o, int64_t st, int buf) {
    load_weights(o, st);
    fetch_stage_acts(o, st, buf);
  };
  // The first unit's weights start streaming before the wait: its first
  // stage into registers, the next chunks into L2.
  int buf = 0;
  load_weights(op, 0);
  prefetch_unit_weights<kMTiles>(w, op.et, sch.k_chunks, sch.chunk0, lane);
  ptx::griddep_wait();
  fetch_stage_acts(op, 0, buf);

  for (int parity = 0;; parity ^= 1) {
    const Unit nu = sch.next(u);
    const bool has_next = sch.valid(nu);
    const typename Sched::Operands nop = has_next ? sch.operands(nu) : op;

    float acc[2][kMTiles][kNTiles][4];
#pragma unroll
    for (int c2 = 0; c2 < 2; ++c2)
#pragma unroll
      for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[c2][m][n][c] = 0.0f;

    for (int64_t st = 0; st < stages; ++st, buf ^= 1) {
      uint4 cur[kMTiles][kStageChunks];
      uint32_t cur_s[kMTiles][kStageChunks / kMmaScaleChunks];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int j = 0; j < kStageChunks; ++j) cur[m][j] = frag[m][j];
#pragma unroll
        for (int j = 0; j < kStageChunks / kMmaScaleChunks; ++j) cur_s[m][j] = scl[m][j];
      }
      // The ring stage buf ^ 1 was last read by this lane in the previous
      // stage, whose mmas (issued before this point) consumed those reads.
      if (st + 1 < stages) {
        load_stage(op, st + 1, buf ^ 1);
      } else if (has_next) {
        load_stage(nop, 0, buf ^ 1);
      } else if constexpr (kActRing<kNTiles>) {
        ptx::cp_async_commit();  // an empty group keeps "all but the newest group done" = this stage
      }
      if constexpr (kActRing<kNTiles>) ptx::cp_async_wait<1>();
#pragma unroll
      for (int j = 0; j < kStageChunks; ++j) {
        uint4 b[kNTiles][2];
        if constexpr (kActRing<kNTiles>) {
          read_acts<kNTiles>(op.live, ring + buf * kRingStage + j * kNTiles * 2 * kActSlot, b);
        } else {
          load_acts<kNTiles>(op.act, op.live, st * kStageChunks + j, b);
        }
#pragma unroll
        for (int m = 0; m < kMTiles; ++m)
          mma_chunk<kNTiles>(cur[m][j], cur_s[m][j / kMmaScaleChunks] >> (16 * (j % kMmaScaleChunks)), b, op.live,
                             acc[0][m], acc[1][m]);
      }
    }

    reduce_and_store<P, kNTiles, kMTiles>(sch, u, op.live, acc, partial[parity], warp, lane);
    if (!has_next) break;
    u = nu;
    op = nop;
  }
  ptx::griddep_launch_dependents();
}

}  // namespace nvfp4moe::cuda
