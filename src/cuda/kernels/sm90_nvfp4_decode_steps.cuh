// Pieces of the sm90_nvfp4_decode_gemm kernel: the unit scheduler, the
// dequantize-and-multiply step of one 64-column chunk, and the K-split
// reduction with the fused epilogues.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/kernels/fragment_dequant.cuh"
#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"
#include "cuda/kernels/swiglu.cuh"
#include "cuda/ptx/sm80_mma_cp_async.cuh"
#include "cuda/ptx/sm90_ld_cvt.cuh"
#include "cuda/ptx/sm90_mbarrier.cuh"
#include "cuda/ptx/sm90_tma.cuh"

namespace nvfp4moe::cuda {

struct Sm90DecodeGemmParams {
  GroupedGemmPlan plan;
  FragmentWeights w;
};

namespace mma_gemm {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
// Chunks per pipeline stage: 4 weight fragments per lane (2 KB a warp) in flight.
template <int kMTiles>
constexpr int kStageChunksOf = 4 / kMTiles;
// One slot of the activation ring: a 16-byte load of every lane of a warp.
constexpr uint32_t kActSlot = 32 * 16;
// One stage of the activation ring (every warp's slots), in bytes.
template <int kNTiles, int kMTiles>
constexpr uint32_t kActRingStage = uint32_t(kWarps) * kStageChunksOf<kMTiles> * kNTiles * 2 * kActSlot;

// Operand row of a position (GateUp: the token; Down: the position).
template <Projection P>
__device__ __forceinline__ int32_t operand_row(const GroupedGemmPlan& plan, int32_t pos) {
  return P == Projection::GateUp ? plan.pair_of_pos[pos] / plan.top_k : pos;
}

// One unit of work: one token group (8 * kNTiles positions) of one item
// (kMTiles m-tiles of one work tile). Items: work tile fastest, then m-group,
// strided over the persistent CTAs.
struct Unit {
  int64_t item;
  int first;
  GemmTile tile;
};

template <Projection P, int kNTiles, int kMTiles>
struct Scheduler {
  static constexpr int kPositions = 8 * kNTiles;

  // Where a lane reads its K quarter of a unit.
  struct Operands {
    int64_t et[kMTiles];  // expert * m_tiles + m-tile
    const __nv_bfloat16* act[kNTiles];
    int live;
  };

  const GroupedGemmPlan& plan;
  int64_t m_tiles, k_chunks, chunk0, items;
  int num_tiles, lane;

  __device__ Scheduler(const Sm90DecodeGemmParams& p, int warp, int lane_)
      : plan(p.plan), m_tiles(p.w.geometry.m_tiles), k_chunks(p.w.geometry.k_chunks), lane(lane_) {
    chunk0 = warp * (k_chunks / kWarps);
    num_tiles = *plan.num_tiles;
    items = plan_selected(plan) ? (m_tiles / kMTiles) * num_tiles : 0;
  }

  __device__ bool valid(const Unit& u) const { return u.item < items; }

  __device__ Unit first_unit() const {
    Unit u{int64_t(blockIdx.x), 0, GemmTile{}};
    if (u.item < items) u.tile = plan.tiles[u.item % num_tiles];
    return u;
  }

  __device__ Unit next(const Unit& u) const {
    Unit v = u;
    if (u.first + kPositions < u.tile.rows) {
      v.first += kPositions;
    } else {
      v.item += gridDim.x;
      v.first = 0;
      if (v.item < items) v.tile = plan.tiles[v.item % num_tiles];
    }
    return v;
  }

  __device__ int64_t m_tile(const Unit& u, int m) const { return (u.item / num_tiles) * kMTiles + m; }

  __device__ Operands operands(const Unit& u) const {
    Operands o;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) o.et[m] = int64_t(u.tile.expert) * m_tiles + m_tile(u, m);
    o.live = min(kPositions, u.tile.rows - u.first);
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int q = min(8 * n + g, o.live - 1);  // padding lanes repeat a live row, never store
      const int32_t row = operand_row<P>(plan, u.tile.begin + u.first + q);
      o.act[n] = plan.act + int64_t(row) * plan.ld_act + chunk0 * kMmaChunkK + 16 * t;
    }
    return o;
  }
};

// Weight chunks a warp prefetches into L2 for its first unit, after the stage
// it loads into registers: 8 KB of codes a warp, ~17 MB over a grid of 528
// CTAs, a third of the L2 cache. Defining NVFP4MOE_DECODE_PREFETCH_CHUNKS
// changes it (0: none), for A/B runs.
#ifndef NVFP4MOE_DECODE_PREFETCH_CHUNKS
#define NVFP4MOE_DECODE_PREFETCH_CHUNKS 16
#endif
constexpr int64_t kPrefetchChunks = NVFP4MOE_DECODE_PREFETCH_CHUNKS;
static_assert(kPrefetchChunks % 4 == 0, "prefetches cover whole scale words at one or two m-tiles");

// Lane 0 of a warp prefetches into L2 the next kPrefetchChunks / kMTiles
// chunks (codes and their scale words) of its K range of each m-tile of a
// unit, beyond the first stage. Issued before the grid waits for the previous
// kernel, they stream while that kernel finishes and the first stage is
// still in flight.
template <int kMTiles>
__device__ __forceinline__ void prefetch_unit_weights(const FragmentWeights& w, const int64_t (&et)[kMTiles],
                                                      int64_t k_chunks, int64_t chunk0, int lane) {
  constexpr int64_t kStageChunks = kStageChunksOf<kMTiles>;
  if (lane != 0) return;
  const int64_t first = kStageChunks, last = min(k_chunks / kWarps, first + kPrefetchChunks / kMTiles);
  if (last <= first) return;  // an even count of whole scale words: both bounds are even
  const int scale_bytes_per_chunk = w.geometry.scale_lanes * 4 / kMmaScaleChunks;
#pragma unroll
  for (int m = 0; m < kMTiles; ++m) {
    const int64_t chunk = et[m] * k_chunks + chunk0 + first;
    ptx::prefetch_bulk_l2(w.codes + chunk * kFragBytes, uint32_t((last - first) * kFragBytes));
    ptx::prefetch_bulk_l2(w.scales + chunk * scale_bytes_per_chunk, uint32_t((last - first) * scale_bytes_per_chunk));
  }
}

// The activation operand of kStageChunks chunks from `chunk` (relative to
// the lane's K start), 16 contiguous BF16 per lane, chunk and n8 tile, copied
// into the lane's slots of one ring stage (slot (j * kNTiles + n) * 2 + h,
// kActSlot bytes apart: a warp's reads of a slot are conflict-free), as one
// cp.async group.
template <int kNTiles, int kStageChunks>
__device__ __forceinline__ void fetch_acts(const __nv_bfloat16* const (&act)[kNTiles], int live, int64_t chunk,
                                           uint32_t slots) {
#pragma unroll
  for (int j = 0; j < kStageChunks; ++j)
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
      if (8 * n < live)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          ptx::cp_async_16_shared_l1(slots + ((j * kNTiles + n) * 2 + h) * kActSlot,
                                     act[n] + (chunk + j) * kMmaChunkK + 8 * h);
  ptx::cp_async_commit();
}

// The activation operand of chunk `chunk` (relative to the lane's K start)
// straight from global memory: 16 contiguous BF16 per lane and n8 tile.
template <int kNTiles>
__device__ __forceinline__ void load_acts(const __nv_bfloat16* const (&act)[kNTiles], int live, int64_t chunk,
                                          uint4 (&b)[kNTiles][2]) {
#pragma unroll
  for (int n = 0; n < kNTiles; ++n)
    if (8 * n < live) {
      b[n][0] = ptx::ld_global_nc_v4(act[n] + chunk * kMmaChunkK);
      b[n][1] = ptx::ld_global_nc_v4(act[n] + chunk * kMmaChunkK + 8);
    }
}

// One chunk's activation operand back from the lane's slots (fetch_acts).
template <int kNTiles>
__device__ __forceinline__ void read_acts(int live, uint32_t slots, uint4 (&b)[kNTiles][2]) {
#pragma unroll
  for (int n = 0; n < kNTiles; ++n)
    if (8 * n < live) {
      b[n][0] = ptx::ld_shared_v4(slots + (2 * n) * kActSlot);
      b[n][1] = ptx::ld_shared_v4(slots + (2 * n + 1) * kActSlot);
    }
}

// Dequantize one 16-byte fragment (4 k-steps of one m-tile) with its scale
// pair and multiply it into two accumulator chains (even / odd k-steps).
template <int kNTiles>
__device__ __forceinline__ void mma_chunk(const uint4& frag, uint32_t scale_pair, const uint4 (&b)[kNTiles][2], int live,
                                          float (&acc0)[kNTiles][4], float (&acc1)[kNTiles][4]) {
  uint32_t a[4][4];
  dequant_fragment_chunk(frag, scale_pair, a);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
      if (8 * n < live)
        ptx::mma_m16n8k16_bf16((s & 1) ? acc1[n] : acc0[n], a[s], part(b[n][s / 2], 2 * (s % 2)),
                               part(b[n][s / 2], 2 * (s % 2) + 1));
  }
}

// Sum of the 4 warps' K quarters through `partial` (one barrier), then the
// epilogue, its slots (m, n, column parity) spread over the warps:
//   GateUp: h[pos, i] = silu(min(gate, L)) * clamp(up, -L, L)
//   Down:   y_pair[pair, row] = w_j * alpha * acc
// with alpha = g_act * g_w * 2^8 (the fragment scaling) in FP32.
template <Projection P, int kNTiles, int kMTiles>
__device__ __forceinline__ void reduce_and_store(const Scheduler<P, kNTiles, kMTiles>& sch, const Unit& u, int live,
                                                 float (&acc)[2][kMTiles][kNTiles][4],
                                                 float (*partial)[kMTiles * kNTiles * 4][32], int warp, int lane) {
  const GroupedGemmPlan& plan = sch.plan;
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int m = 0; m < kMTiles; ++m)
#pragma unroll
    for (int n = 0; n < kNTiles; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[warp][(m * kNTiles + n) * 4 + c][lane] = acc[0][m][n][c] + acc[1][m][n][c];
  __syncthreads();
  for (int e = warp; e < kMTiles * kNTiles * 2; e += kWarps) {
    const int cc = e % 2, n = (e / 2) % kNTiles, m = e / (2 * kNTiles);
    const int q = 8 * n + 2 * t + cc;
    if (q >= live) continue;
    float lo = 0.0f, hi = 0.0f;  // rows g (gate / down row) and g + 8 (up / down row + 8)
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      lo += partial[v][(m * kNTiles + n) * 4 + cc][lane];
      hi += partial[v][(m * kNTiles + n) * 4 + 2 + cc][lane];
    }
    const int64_t mt = sch.m_tile(u, m);
    const int32_t pos = u.tile.begin + u.first + q;
    if constexpr (P == Projection::GateUp) {
      const float ga = plan.act_g[operand_row<P>(plan, pos)];
      const float gate = lo * (ga * plan.w_global[u.tile.expert * 2] * kFragEpilogue);
      const float up = hi * (ga * plan.w_global[u.tile.expert * 2 + 1] * kFragEpilogue);
      plan.h_out[int64_t(pos) * plan.ld_h + mt * 8 + g] = swiglu_limited(gate, up, plan.has_limit, plan.limit);
    } else {
      const int32_t pair = plan.pair_of_pos[pos];
      const float alpha = plan.act_g[pos] * plan.w_global[u.tile.expert] * kFragEpilogue;
      const float wj = plan.topk_weights[pair];
      const PairRow y = pair_row(plan.y_pair, pair, plan.n_valid);
      y.store(mt * kMmaTileRows + g, lo * alpha * wj);
      y.store(mt * kMmaTileRows + g + 8, hi * alpha * wj);
    }
  }
}

}  // namespace mma_gemm
}  // namespace nvfp4moe::cuda
