// sm90_nvfp4_mma_gemm kernel (see sm90_nvfp4_mma_gemm.hpp for the design).
//
// CTA: 4 warps on ONE unit — kMTiles m16 weight tiles x (8 * kNTiles) token
// positions of one work tile — each warp a quarter of K. A lane keeps one
// stage of kFragsInFlight 16-byte weight fragments in flight (the next one),
// loaded while the current stage is dequantized and multiplied; the last
// stage of a unit prefetches the first stage of the CTA's next unit, so the
// stream does not drain between units.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/ptx/sm80_mma_cp_async.cuh"
#include "cuda/ptx/sm90_ld_cvt.cuh"
#include "cuda/sm90_nvfp4_mma_gemm.hpp"

namespace nvfp4moe::cuda {

struct Sm90MmaGemmParams {
  GroupedGemmPlan plan;
  MmaWeights w;
};

namespace mma_gemm {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kFragsInFlight = 4;  // 16-byte weight fragments per lane per stage (2 KB a warp)

// Component r (compile-time after unrolling) of a 16-byte register group.
__device__ __forceinline__ uint32_t part(const uint4& v, int r) {
  return r == 0 ? v.x : r == 1 ? v.y : r == 2 ? v.z : v.w;
}

// A lane's scale pair (rows g, g + 8; low byte row g) -> BF16x2 multipliers
// s * 2^118 in both halves. cvt e4m3x2 -> f16x2 is exact, so is the rest.
__device__ __forceinline__ void scale_multipliers(uint32_t pair, uint32_t& row_g, uint32_t& row_g8) {
  const uint32_t h2 = ptx::cvt_e4m3x2_to_f16x2(uint16_t(pair & 0xffffu));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
  const float a = f.x * kFragScaleBoost, b = f.y * kFragScaleBoost;
  row_g = ptx::cvt_bf16x2_from_f32(a, a);
  row_g8 = ptx::cvt_bf16x2_from_f32(b, b);
}

// Operand row of a position (GateUp: the token; Down: the position).
template <Projection P>
__device__ __forceinline__ int32_t operand_row(const GroupedGemmPlan& plan, int32_t pos) {
  return P == Projection::GateUp ? plan.pair_of_pos[pos] / plan.top_k : pos;
}

}  // namespace mma_gemm

template <Projection P, int kNTiles, int kMTiles, int kMinBlocks>
__global__ void __launch_bounds__(mma_gemm::kThreads, kMinBlocks)
    sm90_nvfp4_mma_gemm_kernel(const __grid_constant__ Sm90MmaGemmParams params) {
  using namespace mma_gemm;
  static_assert(kNTiles == 1 || kNTiles == 2 || kNTiles == 4, "kNTiles: 1, 2 or 4 n8 token tiles per item");
  static_assert(kMTiles == 1 || kMTiles == 2, "kMTiles: 1 or 2 m16 weight tiles per item");
  static_assert(kGemmTileTokens % (8 * kNTiles) == 0, "token groups must tile a work tile");
  constexpr int kStageChunks = kFragsInFlight / kMTiles;
  static_assert(kStageChunks % kMmaScaleChunks == 0, "a stage must cover whole scale words");
  constexpr int kPositions = 8 * kNTiles;
  constexpr int kAcc = kMTiles * kNTiles * 4;
  constexpr int kEpilogueSlots = kMTiles * kNTiles * 2;  // (m, n, column parity) pairs of accumulators

  // Shared memory: every warp's partial sums (K split inside the CTA), two
  // buffers alternating by unit so one barrier per unit suffices.
  __shared__ float partial[2][kWarps][kAcc][32];

  const GroupedGemmPlan& plan = params.plan;
  const MmaWeights& w = params.w;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int64_t m_tiles = w.geometry.m_tiles, k_chunks = w.geometry.k_chunks;
  const int64_t m_groups = m_tiles / kMTiles;
  const int64_t warp_chunks = k_chunks / kWarps;
  const int64_t stages = warp_chunks / kStageChunks;
  const int64_t chunk0 = warp * warp_chunks;
  const int num_tiles = *plan.num_tiles;
  const int64_t items = m_groups * num_tiles;

  // Scheduler: persistent CTAs over items (work tile fastest, then m-group);
  // a unit is one token group of an item.
  struct Unit {
    int64_t item;
    int first;
    GemmTile tile;
  };
  struct Operands {
    const uint4* wp[kMTiles];
    const uint32_t* sp[kMTiles];
    const __nv_bfloat16* act[kNTiles];
    int live;
  };
  auto next_unit = [&](const Unit& u) {
    Unit v = u;
    if (u.first + kPositions < u.tile.rows) {
      v.first += kPositions;
    } else {
      v.item += gridDim.x;
      v.first = 0;
      if (v.item < items) v.tile = plan.tiles[v.item % num_tiles];
    }
    return v;
  };
  auto operands = [&](const Unit& u) {
    Operands o;
    const int64_t mg = u.item / num_tiles;
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      const int64_t et = int64_t(u.tile.expert) * m_tiles + mg * kMTiles + m;
      o.wp[m] = reinterpret_cast<const uint4*>(w.codes) + (et * k_chunks + chunk0) * 32 + lane;
      o.sp[m] = reinterpret_cast<const uint32_t*>(w.scales) +
                (et * (k_chunks / kMmaScaleChunks) + chunk0 / kMmaScaleChunks) * 32 + lane;
    }
    o.live = min(kPositions, u.tile.rows - u.first);
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const int q = min(8 * n + g, o.live - 1);  // padding lanes repeat a live row, never store
      const int32_t row = operand_row<P>(plan, u.tile.begin + u.first + q);
      o.act[n] = plan.act + int64_t(row) * plan.ld_act + chunk0 * kMmaChunkK + 16 * t;
    }
    return o;
  };

  Unit u{int64_t(blockIdx.x), 0, GemmTile{}};
  if (u.item >= items) return;
  u.tile = plan.tiles[u.item % num_tiles];
  Operands op = operands(u);

  // Pipeline: the fragments of the next stage (of this unit or the next one).
  uint4 frag[kMTiles][kStageChunks];
  uint32_t scl[kMTiles][kStageChunks / kMmaScaleChunks];
  auto load_stage = [&](const Operands& o, int64_t st) {
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
      for (int j = 0; j < kStageChunks; ++j) frag[m][j] = ptx::ld_global_stream_v4(o.wp[m] + (st * kStageChunks + j) * 32);
#pragma unroll
      for (int j = 0; j < kStageChunks / kMmaScaleChunks; ++j)
        scl[m][j] = ptx::ld_global_stream_u32(o.sp[m] + (st * (kStageChunks / kMmaScaleChunks) + j) * 32);
    }
  };
  load_stage(op, 0);

  for (int parity = 0;; parity ^= 1) {
    const Unit nu = next_unit(u);
    const bool has_next = nu.item < items;
    const Operands nop = has_next ? operands(nu) : op;

    // Two accumulator chains (even / odd k-steps) halve the mma dependency chain.
    float acc[2][kMTiles][kNTiles][4];
#pragma unroll
    for (int c2 = 0; c2 < 2; ++c2)
#pragma unroll
      for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[c2][m][n][c] = 0.0f;

    for (int64_t st = 0; st < stages; ++st) {
      uint4 cur[kMTiles][kStageChunks];
      uint32_t cur_s[kMTiles][kStageChunks / kMmaScaleChunks];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
        for (int j = 0; j < kStageChunks; ++j) cur[m][j] = frag[m][j];
#pragma unroll
        for (int j = 0; j < kStageChunks / kMmaScaleChunks; ++j) cur_s[m][j] = scl[m][j];
      }
      if (st + 1 < stages) {
        load_stage(op, st + 1);
      } else if (has_next) {
        load_stage(nop, 0);
      }

#pragma unroll
      for (int j = 0; j < kStageChunks; ++j) {
        const int64_t chunk = st * kStageChunks + j;
        uint4 b[kNTiles][2];
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
          if (8 * n < op.live) {
            b[n][0] = ptx::ld_global_nc_v4(op.act[n] + chunk * kMmaChunkK);
            b[n][1] = ptx::ld_global_nc_v4(op.act[n] + chunk * kMmaChunkK + 8);
          }
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          uint32_t s_g, s_g8;
          scale_multipliers(cur_s[m][j / kMmaScaleChunks] >> (16 * (j % kMmaScaleChunks)), s_g, s_g8);
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            uint32_t a[4];
            unpack_fragment_word(part(cur[m][j], s), a);
            a[0] = ptx::mul_bf16x2(a[0], s_g);
            a[1] = ptx::mul_bf16x2(a[1], s_g8);
            a[2] = ptx::mul_bf16x2(a[2], s_g);
            a[3] = ptx::mul_bf16x2(a[3], s_g8);
#pragma unroll
            for (int n = 0; n < kNTiles; ++n)
              if (8 * n < op.live)
                ptx::mma_m16n8k16_bf16(acc[s & 1][m][n], a, part(b[n][s / 2], 2 * (s % 2)),
                                       part(b[n][s / 2], 2 * (s % 2) + 1));
          }
        }
      }
    }

    // Reduce the K quarters through shared memory; the epilogue slots
    // (m, n, column parity) are spread over the 4 warps.
#pragma unroll
    for (int m = 0; m < kMTiles; ++m)
#pragma unroll
      for (int n = 0; n < kNTiles; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          partial[parity][warp][(m * kNTiles + n) * 4 + c][lane] = acc[0][m][n][c] + acc[1][m][n][c];
    __syncthreads();
    for (int e = warp; e < kEpilogueSlots; e += kWarps) {
      const int cc = e % 2, n = (e / 2) % kNTiles, m = e / (2 * kNTiles);
      const int q = 8 * n + 2 * t + cc;
      if (q >= op.live) continue;
      float lo = 0.0f, hi = 0.0f;  // rows g (gate / down row) and g + 8 (up / down row + 8)
#pragma unroll
      for (int v = 0; v < kWarps; ++v) {
        lo += partial[parity][v][(m * kNTiles + n) * 4 + cc][lane];
        hi += partial[parity][v][(m * kNTiles + n) * 4 + 2 + cc][lane];
      }
      // Epilogue: alpha = g_act * g_w * 2^8 (the fragment scaling), FP32.
      const int64_t mt = (u.item / num_tiles) * kMTiles + m;
      const int32_t pos = u.tile.begin + u.first + q;
      if constexpr (P == Projection::GateUp) {
        const float ga = plan.act_g[operand_row<P>(plan, pos)];
        float gate = lo * (ga * plan.w_global[u.tile.expert * 2] * kFragEpilogue);
        float up = hi * (ga * plan.w_global[u.tile.expert * 2 + 1] * kFragEpilogue);
        if (plan.has_limit) {  // written so that NaN propagates (fminf would drop it)
          const float L = plan.limit;
          gate = gate > L ? L : gate;
          up = up > L ? L : (up < -L ? -L : up);
        }
        plan.h_out[int64_t(pos) * plan.ld_h + mt * 8 + g] = gate / (1.0f + expf(-gate)) * up;
      } else {
        const int32_t pair = plan.pair_of_pos[pos];
        const float alpha = plan.act_g[pos] * plan.w_global[u.tile.expert] * kFragEpilogue;
        const float wj = plan.topk_weights[pair];
        float* yrow = plan.y_pair + int64_t(pair) * plan.n_valid + mt * kMmaTileRows + g;
        yrow[0] = lo * alpha * wj;
        yrow[8] = hi * alpha * wj;
      }
    }
    if (!has_next) break;
    u = nu;
    op = nop;
  }
}

}  // namespace nvfp4moe::cuda
