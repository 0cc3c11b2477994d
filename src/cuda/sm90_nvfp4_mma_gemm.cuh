// sm90_nvfp4_mma_gemm kernel (see sm90_nvfp4_mma_gemm.hpp for the design).
//
// CTA: 4 warps on ONE item — kMTiles m16 weight tiles x (8 * kNTiles) token
// positions of one work tile — each warp a quarter of K. Per stage a lane has
// kDepth stages of kFragsInFlight 16-byte weight fragments in flight (the
// next ones), loaded while the current stage is dequantized and multiplied.
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

template <Projection P, int kNTiles, int kMTiles, int kDepth, int kMinBlocks>
__global__ void __launch_bounds__(mma_gemm::kThreads, kMinBlocks)
    sm90_nvfp4_mma_gemm_kernel(const __grid_constant__ Sm90MmaGemmParams params) {
  using namespace mma_gemm;
  static_assert(kNTiles == 1 || kNTiles == 2 || kNTiles == 4, "kNTiles: 1, 2 or 4 n8 token tiles per item");
  static_assert(kMTiles == 1 || kMTiles == 2, "kMTiles: 1 or 2 m16 weight tiles per item");
  static_assert(kDepth == 1 || kDepth == 2, "kDepth: 1 or 2 stages in flight");
  static_assert(kGemmTileTokens % (8 * kNTiles) == 0, "token groups must tile a work tile");
  constexpr int kStageChunks = kFragsInFlight / kMTiles;
  static_assert(kStageChunks % kMmaScaleChunks == 0, "a stage must cover whole scale words");
  constexpr int kPositions = 8 * kNTiles;
  constexpr int kAcc = kMTiles * kNTiles * 4;

  // Shared memory: the partial sums of warps 1..3 (K split inside the CTA).
  __shared__ float partial[kWarps - 1][kAcc][32];

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

  // Scheduler: persistent CTAs; work tile fastest so neighbouring CTAs share m-groups.
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const GemmTile tile = plan.tiles[item % num_tiles];
    const int64_t mg = item / num_tiles;

    // Weight fragment and scale pointers of this lane, from its K quarter.
    const uint4* wp[kMTiles];
    const uint32_t* sp[kMTiles];
#pragma unroll
    for (int m = 0; m < kMTiles; ++m) {
      const int64_t et = int64_t(tile.expert) * m_tiles + mg * kMTiles + m;
      wp[m] = reinterpret_cast<const uint4*>(w.codes) + (et * k_chunks + chunk0) * 32 + lane;
      sp[m] = reinterpret_cast<const uint32_t*>(w.scales) + (et * (k_chunks / kMmaScaleChunks) + chunk0 / kMmaScaleChunks) * 32 + lane;
    }

    // Token groups of the tile; a second group re-reads the weights from L2.
    for (int first = 0; first < tile.rows; first += kPositions) {
      const int live = min(kPositions, tile.rows - first);
      const __nv_bfloat16* act[kNTiles];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const int q = min(8 * n + g, live - 1);  // padding lanes repeat a live row, never store
        const int32_t row = operand_row<P>(plan, tile.begin + first + q);
        act[n] = plan.act + int64_t(row) * plan.ld_act + chunk0 * kMmaChunkK + 16 * t;
      }

      float acc[kMTiles][kNTiles][4];
#pragma unroll
      for (int m = 0; m < kMTiles; ++m)
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[m][n][c] = 0.0f;

      // Pipeline: a ring of kDepth stages in flight while stage st is computed.
      uint4 frag[kDepth][kMTiles][kStageChunks];
      uint32_t scl[kDepth][kMTiles][kStageChunks / kMmaScaleChunks];
      auto load_stage = [&](int d, int64_t st) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
          for (int j = 0; j < kStageChunks; ++j)
            frag[d][m][j] = ptx::ld_global_stream_v4(wp[m] + (st * kStageChunks + j) * 32);
#pragma unroll
          for (int j = 0; j < kStageChunks / kMmaScaleChunks; ++j)
            scl[d][m][j] = ptx::ld_global_stream_u32(sp[m] + (st * (kStageChunks / kMmaScaleChunks) + j) * 32);
        }
      };
#pragma unroll
      for (int d = 0; d < kDepth; ++d)
        if (d < stages) load_stage(d, d);
      for (int64_t st0 = 0; st0 < stages; st0 += kDepth) {
#pragma unroll
        for (int d = 0; d < kDepth; ++d) {
          const int64_t st = st0 + d;
          if (st >= stages) break;
          uint4 cur[kMTiles][kStageChunks];
          uint32_t cur_s[kMTiles][kStageChunks / kMmaScaleChunks];
#pragma unroll
          for (int m = 0; m < kMTiles; ++m) {
#pragma unroll
            for (int j = 0; j < kStageChunks; ++j) cur[m][j] = frag[d][m][j];
#pragma unroll
            for (int j = 0; j < kStageChunks / kMmaScaleChunks; ++j) cur_s[m][j] = scl[d][m][j];
          }
          if (st + kDepth < stages) load_stage(d, st + kDepth);

#pragma unroll
          for (int j = 0; j < kStageChunks; ++j) {
            const int64_t chunk = st * kStageChunks + j;
            uint4 b[kNTiles][2];
#pragma unroll
            for (int n = 0; n < kNTiles; ++n)
              if (8 * n < live) {
                b[n][0] = ptx::ld_global_nc_v4(act[n] + chunk * kMmaChunkK);
                b[n][1] = ptx::ld_global_nc_v4(act[n] + chunk * kMmaChunkK + 8);
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
                  if (8 * n < live)
                    ptx::mma_m16n8k16_bf16(acc[m][n], a, part(b[n][s / 2], 2 * (s % 2)),
                                           part(b[n][s / 2], 2 * (s % 2) + 1));
              }
            }
          }
        }
      }

      // Reduce the K quarters: warps 1..3 -> shared memory -> warp 0.
      if (warp > 0) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m)
#pragma unroll
          for (int n = 0; n < kNTiles; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c) partial[warp - 1][(m * kNTiles + n) * 4 + c][lane] = acc[m][n][c];
      }
      __syncthreads();
      if (warp == 0) {
#pragma unroll
        for (int m = 0; m < kMTiles; ++m)
#pragma unroll
          for (int n = 0; n < kNTiles; ++n)
#pragma unroll
            for (int c = 0; c < 4; ++c)
#pragma unroll
              for (int v = 0; v < kWarps - 1; ++v) acc[m][n][c] += partial[v][(m * kNTiles + n) * 4 + c][lane];

        // Epilogue: alpha = g_act * g_w * 2^8 (the fragment scaling), FP32.
#pragma unroll
        for (int m = 0; m < kMTiles; ++m) {
          const int64_t mt = mg * kMTiles + m;
#pragma unroll
          for (int n = 0; n < kNTiles; ++n)
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
              const int q = 8 * n + 2 * t + cc;
              if (q >= live) continue;
              const int32_t pos = tile.begin + first + q;
              if constexpr (P == Projection::GateUp) {
                const float ga = plan.act_g[operand_row<P>(plan, pos)];
                const int64_t i = mt * 8 + g;
                float gate = acc[m][n][cc] * (ga * plan.w_global[tile.expert * 2] * kFragEpilogue);
                float up = acc[m][n][2 + cc] * (ga * plan.w_global[tile.expert * 2 + 1] * kFragEpilogue);
                if (plan.has_limit) {  // written so that NaN propagates (fminf would drop it)
                  const float L = plan.limit;
                  gate = gate > L ? L : gate;
                  up = up > L ? L : (up < -L ? -L : up);
                }
                plan.h_out[int64_t(pos) * plan.ld_h + i] = gate / (1.0f + expf(-gate)) * up;
              } else {
                const int32_t pair = plan.pair_of_pos[pos];
                const float alpha = plan.act_g[pos] * plan.w_global[tile.expert] * kFragEpilogue;
                const float wj = plan.topk_weights[pair];
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                  const int64_t row = mt * kMmaTileRows + 8 * half + g;
                  plan.y_pair[int64_t(pair) * plan.n_valid + row] = acc[m][n][2 * half + cc] * alpha * wj;
                }
              }
            }
        }
      }
      __syncthreads();  // `partial` is reused by the next token group / item
    }
  }
}

}  // namespace nvfp4moe::cuda
