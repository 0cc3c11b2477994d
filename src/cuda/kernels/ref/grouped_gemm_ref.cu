// grouped_gemm_ref (see the header): the correctness-first kernel.
//
// CTA: 4 warps, a 128-row weight tile x 64 positions, K in steps of 64 through
// a 3-stage cp.async pipeline. Each warp owns 32 weight rows (2 m16 tiles) x
// 64 positions (8 n8 tiles). Weight fragments are dequantized from shared
// memory with a 256-entry table (code byte -> two BF16 values) and one packed
// BF16 multiply by the block scale: exact.
#include <cuda_bf16.h>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/ref/grouped_gemm_ref.hpp"
#include "cuda/kernels/swiglu.cuh"
#include "cuda/kernels/tile_dequant.cuh"
#include "cuda/ptx/sm80_mma_cp_async.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kStages = 3;
constexpr int kBRow = kTileK + 8;  // BF16 per operand row in shared memory: +16 B kills bank conflicts
constexpr int kBStageBytes = kGemmTileTokens * kBRow * 2;
constexpr int kStageBytes = kTileBytes + kBStageBytes;
static_assert(kTileBytes % 16 == 0 && kStageBytes % 16 == 0, "stages must keep 16-byte alignment for cp.async");
static_assert(kTileN == 32 * (kThreads / 32), "each warp owns 32 weight rows");
static_assert(kGemmTileTokens == 64, "each warp covers 8 n8 tiles of positions");
static_assert(kBRow % 8 == 0, "operand rows are whole 16-byte chunks");

// Epilogue: alpha = g_act * g_w in FP32, then SwiGLU (GateUp) or the
// routing weight (Down). Accumulator (mi, ni, c) of this lane is weight row
// warp * 32 + mi * 16 + grp (+ 8 for c >= 2), position column ni * 8 + 2 tig + c % 2.
template <Projection P>
__device__ __forceinline__ void store_tile_ref(const GroupedGemmPlan& plan, const GemmTile& tile, int64_t n_tile,
                                               int warp, int grp, int tig, const float* pos_g, const int32_t* pos_pair,
                                               const float (&acc)[2][8][4]) {
  if constexpr (P == Projection::GateUp) {
    const float gw_gate = plan.w_global[tile.expert * 2], gw_up = plan.w_global[tile.expert * 2 + 1];
    const float L = plan.limit;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const int64_t i = n_tile * (kTileN / 2) + (warp * 2 + mi) * 8 + grp;
      if (i >= plan.n_valid) continue;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int col = ni * 8 + 2 * tig + cc;
          if (col >= tile.rows) continue;
          const float gate = acc[mi][ni][cc] * (pos_g[col] * gw_gate);
          const float up = acc[mi][ni][2 + cc] * (pos_g[col] * gw_up);
          plan.h_out[int64_t(tile.begin + col) * plan.ld_h + i] = swiglu_limited(gate, up, plan.has_limit, L);
        }
    }
  } else {
    const float gw = plan.w_global[tile.expert];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t n = n_tile * kTileN + warp * 32 + mi * 16 + half * 8 + grp;
        if (n >= plan.n_valid) continue;
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            const int col = ni * 8 + 2 * tig + cc;
            if (col >= tile.rows) continue;
            const int32_t pair = pos_pair[col];
            const float o = acc[mi][ni][half * 2 + cc] * (pos_g[col] * gw);
            pair_row(plan.y_pair, pair, plan.n_valid).store(n, o * plan.topk_weights[pair]);
          }
      }
  }
}

// The reference reads top to bottom on purpose (~90 lines): metadata, a
// three-stage cp.async pipeline over K, mma.sync on table-dequantized
// fragments, then store_tile_ref.
template <Projection P>
__global__ void __launch_bounds__(kThreads) grouped_gemm_ref_kernel(GroupedGemmPlan plan) {
  // Shared memory: pipeline stages, dequant tables, per-position metadata.
  __shared__ __align__(128) uint8_t stages[kStages * kStageBytes];
  __shared__ TileDequantTables tables;
  __shared__ int32_t pos_row[kGemmTileTokens];   // operand row, -1 = padding
  __shared__ int32_t pos_pair[kGemmTileTokens];  // (Down) pair index
  __shared__ float pos_g[kGemmTileTokens];

  if (int(blockIdx.x) >= *plan.num_tiles || !plan_selected(plan)) return;
  const GemmTile tile = plan.tiles[blockIdx.x];
  const int64_t n_tile = blockIdx.y;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, grp = lane >> 2, tig = lane & 3;

  // Tables and metadata.
  fill_tile_dequant_tables(tables, tid, kThreads);
  if (tid < kGemmTileTokens) {
    const bool live = tid < tile.rows;
    const int32_t pos = tile.begin + tid;
    const int32_t pair = live ? plan.pair_of_pos[pos] : -1;
    const int32_t row = !live ? -1 : (P == Projection::GateUp ? pair / plan.top_k : pos);
    pos_row[tid] = row;
    pos_pair[tid] = pair;
    pos_g[tid] = live ? plan.act_g[row] : 0.0f;
  }
  __syncthreads();

  const int64_t k_steps = plan.geometry.k_steps;
  const uint8_t* w_src = plan.weights + (int64_t(tile.expert) * plan.geometry.n_tiles + n_tile) * k_steps * kTileBytes;

  auto load_stage = [&](int stage, int64_t ks) {
    uint8_t* st = stages + stage * kStageBytes;
    const uint8_t* src = w_src + ks * kTileBytes;
    for (int c = tid; c < kTileBytes / 16; c += kThreads) ptx::cp_async_16(st + c * 16, src + c * 16, 16);
    // Only the tile's live positions (a prefix): padding rows were zeroed once.
    __nv_bfloat16* b = reinterpret_cast<__nv_bfloat16*>(st + kTileBytes);
    for (int c = tid; c < tile.rows * (kTileK / 8); c += kThreads) {
      const int r = c >> 3, q = c & 7;
      ptx::cp_async_16(b + r * kBRow + q * 8, plan.act + int64_t(pos_row[r]) * plan.ld_act + ks * kTileK + q * 8, 16);
    }
  };

  // Padding positions: zero their operand rows in every stage once (no
  // per-step loads for them; their columns are dropped by the epilogue).
  for (int i = tid; i < kStages * kGemmTileTokens * (kBRow / 8); i += kThreads) {
    const int stage = i / (kGemmTileTokens * (kBRow / 8)), rest = i % (kGemmTileTokens * (kBRow / 8));
    const int r = rest / (kBRow / 8), q = rest % (kBRow / 8);
    if (r >= tile.rows)
      *reinterpret_cast<uint4*>(stages + stage * kStageBytes + kTileBytes + (r * kBRow + q * 8) * 2) = make_uint4(0, 0, 0, 0);
  }

  float acc[2][8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 8; ++ni)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[mi][ni][c] = 0.0f;

  // Pipeline prologue.
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_steps) load_stage(s, s);
    ptx::cp_async_commit();
  }

  for (int64_t ks = 0; ks < k_steps; ++ks) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();  // stage ks landed for all; stage ks-1 free for the prefetch below
    const int64_t pf = ks + kStages - 1;
    if (pf < k_steps) load_stage(int(pf % kStages), pf);
    ptx::cp_async_commit();

    const uint8_t* st = stages + int(ks % kStages) * kStageBytes;
    const __nv_bfloat16* b = reinterpret_cast<const __nv_bfloat16*>(st + kTileBytes);
#pragma unroll
    for (int c = 0; c < kTileK / 16; ++c) {
      uint32_t a[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) dequant_tile_fragment(st, warp * 32 + mi * 16 + grp, c, tig, tables, a[mi]);
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        if (ni * 8 >= tile.rows) break;  // block-uniform: decode tiles skip empty n8 tiles
        const __nv_bfloat16* br = b + (ni * 8 + grp) * kBRow + c * 16 + 2 * tig;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(br);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(br + 8);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) ptx::mma_m16n8k16_bf16(acc[mi][ni], a[mi], b0, b1);
      }
    }
  }
  ptx::cp_async_wait<0>();

  store_tile_ref<P>(plan, tile, n_tile, warp, grp, tig, pos_g, pos_pair, acc);
}

}  // namespace

void grouped_gemm_ref(const GroupedGemmPlan& p, cudaStream_t stream) {
  NVFP4_CHECK(p.geometry.n_tiles > 0 && p.geometry.k_steps > 0, "grouped gemm: empty geometry n_tiles=",
              p.geometry.n_tiles, " k_steps=", p.geometry.k_steps);
  NVFP4_CHECK(p.ld_act >= p.geometry.k_steps * kTileK && p.ld_act % 8 == 0, "grouped gemm: operand row stride ",
              p.ld_act, " must be a multiple of 8 and >= K padded ", p.geometry.k_steps * kTileK);
  NVFP4_CHECK(p.geometry.n_tiles <= 65535, "grouped gemm: too many n tiles ", p.geometry.n_tiles);
  if (p.max_tiles == 0) return;
  const dim3 grid(unsigned(p.max_tiles), unsigned(p.geometry.n_tiles));
  if (p.projection == Projection::GateUp) {
    NVFP4_CHECK(p.h_out && p.ld_h >= p.n_valid, "grouped gemm (gate/up): h output missing or ld_h ", p.ld_h,
                " < I=", p.n_valid);
    grouped_gemm_ref_kernel<Projection::GateUp><<<grid, kThreads, 0, stream>>>(p);
  } else {
    NVFP4_CHECK(p.y_pair.given() && p.topk_weights, "grouped gemm (down): y_pair and topk_weights are required");
    grouped_gemm_ref_kernel<Projection::Down><<<grid, kThreads, 0, stream>>>(p);
  }
  NVFP4_CUDA_CHECK_LAUNCH("grouped_gemm_ref_kernel");
}

}  // namespace nvfp4moe::cuda
