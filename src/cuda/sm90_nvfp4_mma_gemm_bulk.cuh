// sm90_nvfp4_mma_gemm, bulk-copy kernel: the same units, fragments and
// epilogues as the register-direct kernel, but the weight stream goes through
// the copy engine. Each warp owns a ring of kBulkRing shared-memory stages
// (2 chunks of kMTiles m-tiles: 1152 B each) and keeps kBulkRing - 1 of them
// in flight with cp.async.bulk completing on one mbarrier per stage, so the
// bytes in flight per SM no longer depend on registers (~110 KB vs 32 KB).
// Lane 0 of the warp refills a stage once the warp has consumed it; the
// lookahead runs into the next unit of the CTA.
#pragma once

#include "cuda/ptx/sm90_mbarrier_bulk.cuh"
#include "cuda/sm90_nvfp4_mma_common.cuh"

namespace nvfp4moe::cuda {

namespace mma_gemm {
constexpr int kBulkRing = 6;         // stages per warp ring (kBulkRing - 1 in flight while one is read)
constexpr int kBulkStageChunks = 2;  // = kMmaScaleChunks: one scale word per m-tile and stage
constexpr int kBulkCodeBytes = kBulkStageChunks * 32 * 16;
constexpr int kBulkScaleBytes = 32 * 4;
template <int kMTiles>
constexpr int bulk_stage_bytes() {
  return kMTiles * (kBulkCodeBytes + kBulkScaleBytes);
}
template <int kMTiles>
constexpr int bulk_smem_bytes() {
  return kWarps * kBulkRing * bulk_stage_bytes<kMTiles>() + kWarps * kBulkRing * 8;
}
}  // namespace mma_gemm

template <Projection P, int kNTiles, int kMTiles, int kMinBlocks>
__global__ void __launch_bounds__(mma_gemm::kThreads, kMinBlocks)
    sm90_nvfp4_mma_gemm_bulk_kernel(const __grid_constant__ Sm90MmaGemmParams params) {
  using namespace mma_gemm;
  static_assert(kNTiles == 1 || kNTiles == 2 || kNTiles == 4, "kNTiles: 1, 2 or 4 n8 token tiles per item");
  static_assert(kMTiles == 1 || kMTiles == 2, "kMTiles: 1 or 2 m16 weight tiles per item");
  static_assert(kBulkStageChunks == kMmaScaleChunks, "one scale word per m-tile and stage");
  static_assert(bulk_stage_bytes<kMTiles>() % 16 == 0, "bulk copies move multiples of 16 bytes");
  using Sched = Scheduler<P, kNTiles, kMTiles>;
  constexpr int kStageBytes = bulk_stage_bytes<kMTiles>();

  // Shared memory: per warp a ring of stages [codes of each m-tile | scale
  // words of each m-tile], then the full_ barriers; the partial sums.
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ float partial[2][kWarps][kMTiles * kNTiles * 4][32];

  const MmaWeights& w = params.w;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const Sched sch(params, warp, lane);
  const int64_t stages = (sch.k_chunks / kWarps) / kBulkStageChunks;
  const uint32_t ring = ptx::smem_addr(smem) + uint32_t(warp * kBulkRing * kStageBytes);
  const uint32_t full_ = ptx::smem_addr(smem) + uint32_t(kWarps * kBulkRing * kStageBytes + warp * kBulkRing * 8);

  Unit u = sch.first_unit();
  if (!sch.valid(u)) return;
  if (lane == 0) {
    for (int r = 0; r < kBulkRing; ++r) ptx::mbarrier_init(full_ + 8 * r, 1);
    ptx::fence_mbarrier_init();
  }
  __syncwarp();
  typename Sched::Operands op = sch.operands(u);

  // Producer (lane 0): stage st of a unit into ring slot `slot`.
  auto issue = [&](const typename Sched::Operands& o, int64_t st, int slot) {
    const uint32_t bar = full_ + 8 * slot, dst = ring + uint32_t(slot * kStageBytes);
    ptx::mbarrier_arrive_expect_tx(bar, kStageBytes);
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      const uint8_t* c = w.codes + ((o.et[m] * sch.k_chunks + sch.chunk0 + st * kBulkStageChunks) * 32) * 16;
      const uint8_t* s = w.scales + ((o.et[m] * (sch.k_chunks / kMmaScaleChunks) + sch.chunk0 / kMmaScaleChunks + st) * 32) * 4;
      ptx::cp_async_bulk_g2s(dst + m * kBulkCodeBytes, c, kBulkCodeBytes, bar);
      ptx::cp_async_bulk_g2s(dst + kMTiles * kBulkCodeBytes + m * kBulkScaleBytes, s, kBulkScaleBytes, bar);
    }
  };
  if (lane == 0)
    for (int r = 0; r < kBulkRing; ++r) issue(op, r, r);  // the host checks kBulkRing <= stages

  int64_t gs = 0;  // stages consumed by this warp
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

    for (int64_t st = 0; st < stages; ++st, ++gs) {
      const int slot = int(gs % kBulkRing);
      const uint32_t base = ring + uint32_t(slot * kStageBytes);
      uint4 b[kNTiles][2];
      load_acts<kNTiles>(op.act, op.live, st * kBulkStageChunks, b);  // in flight during the wait
      ptx::mbarrier_wait_parity(full_ + 8 * slot, uint32_t((gs / kBulkRing) & 1));
      uint32_t sc[kMTiles];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) sc[m] = ptx::ld_shared_u32(base + kMTiles * kBulkCodeBytes + m * kBulkScaleBytes + lane * 4);
#pragma unroll
      for (int j = 0; j < kBulkStageChunks; ++j) {
        if (j > 0) load_acts<kNTiles>(op.act, op.live, st * kBulkStageChunks + j, b);
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          const uint4 frag = ptx::ld_shared_v4(base + m * kBulkCodeBytes + j * 512 + lane * 16);
          mma_chunk<kNTiles>(frag, sc[m] >> (16 * j), b, op.live, acc[0][m], acc[1][m]);
        }
      }
      // The warp has consumed the slot (its values fed the mma above): refill it.
      __syncwarp();
      if (lane == 0) {
        const int64_t ahead = st + kBulkRing;
        if (ahead < stages) {
          issue(op, ahead, slot);
        } else if (has_next) {
          issue(nop, ahead - stages, slot);
        }
      }
    }

    reduce_and_store<P, kNTiles, kMTiles>(sch, u, op.live, acc, partial[parity], warp, lane);
    if (!has_next) break;
    u = nu;
    op = nop;
  }
}

}  // namespace nvfp4moe::cuda
