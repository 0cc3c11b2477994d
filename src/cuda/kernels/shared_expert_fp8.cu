// shared_expert_fp8 (see shared_expert_fp8.hpp).
#include "cuda/kernels/shared_expert_fp8.hpp"

#include <algorithm>
#include <cmath>

#include "cuda/cuda_check.hpp"
#include "cuda/dependent_launch.hpp"
#include "cuda/kernels/fp8_dequant.cuh"
#include "cuda/kernels/split_k_arrival.cuh"
#include "cuda/kernels/swiglu.cuh"
#include "cuda/layout/fp8_fragment_layout.hpp"
#include "cuda/ptx/sm80_mma_cp_async.cuh"
#include "cuda/ptx/sm90_griddep.cuh"
#include "cuda/ptx/sm90_ld_cvt.cuh"

namespace nvfp4moe::cuda {

namespace {

// How E4M3 becomes BF16 in registers (fp8_dequant.cuh): through the FP16
// conversion instruction, or with integer operations only.
enum class Fp8Convert : uint8_t { HalfFloat, Integer };

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileK = int(kFp8ScaleTile);  // K columns per pipeline step: one scale tile
constexpr int kChunkK = 64;                 // K columns of one mma pass: 16 per lane quad
constexpr int kChunks = kTileK / kChunkK;
constexpr int kTokenTile = 64;              // tokens of one CTA at most (8 n8 tiles)
constexpr int kXStride = kTileK + 8;        // BF16 per shared row: 272 bytes, conflict-free 16-byte reads
constexpr int kMaxSplits = 8;

// The projection one launch computes: gate/up (kSwiGlu, rows = 2 Is, h out)
// or down (rows = H, out f32).
struct Fp8Projection {
  const __nv_bfloat16* x;  // [T, K]
  int32_t tokens, K, rows, tiles_k;
  const uint8_t* w;        // fp8_fragment_layout.hpp: ceil(rows / 16) x tiles_k blocks of 2 KB
  const float* scale;      // [rows / 8, tiles_k]
  bool has_limit;
  float limit;
  __nv_bfloat16* h;        // gate/up: [T, rows / 2]
  float* out;              // down: [T, rows]
  float* partial;          // [splits, token tiles, 64, rows]
  int32_t* counters;       // [token tiles, row blocks]
};

// Rows of a CTA: 4 warps x (8 gate + 8 up) rows, or 4 x 16 down rows.
template <bool kSwiGlu>
constexpr int kBlockRows = kSwiGlu ? 32 : 64;

// The two weight rows of lane (g, t) of `warp` in row block rb (-1: past the end).
template <bool kSwiGlu>
__device__ __forceinline__ void lane_rows(const Fp8Projection& p, int rb, int warp, int g, int& lo, int& hi) {
  if constexpr (kSwiGlu) {
    const int half = p.rows / 2, r = rb * 32 + warp * 8;
    lo = r < half ? r + g : -1;
    hi = r < half ? half + r + g : -1;
  } else {
    const int r = rb * 64 + warp * 16;
    lo = r < p.rows ? r + g : -1;
    hi = r < p.rows ? r + 8 + g : -1;
  }
}

// Up to 16 tokens the x operand goes from global memory (L1) straight into
// registers, a stage ahead like the weights: no shared memory, no barrier,
// each warp streams on its own. Wider token tiles stage x in shared memory
// once for the CTA's 4 warps.
template <int kNT>
constexpr bool kXInRegisters = kNT <= 2;

// One K tile of a lane: chunk c's 16 bytes at columns 64c + 16t of its two
// rows, their tile scales, and (kXInRegisters) the same 16 columns of the
// lane's token g of each n8 tile, as two 16-byte pieces.
template <int kNT>
struct StageRegs {
  uint4 lo[kChunks], hi[kChunks];
  float scale_lo, scale_hi;
  uint4 x[kXInRegisters<kNT> ? kNT : 1][kChunks][2];
};

// m-tile u's K tile kt: chunk c's lo piece of every lane, then its hi
// piece, 512 contiguous bytes each.
template <int kNT>
__device__ __forceinline__ void load_weight_tile(const Fp8Projection& p, int u, int row_lo, int row_hi, int kt,
                                                 int lane, StageRegs<kNT>& w) {
  if (row_lo < 0) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) w.lo[c] = w.hi[c] = make_uint4(0u, 0u, 0u, 0u);
    w.scale_lo = w.scale_hi = 0.0f;
    return;
  }
  const uint8_t* base = p.w + fp8_fragment_block((p.rows + 15) / 16, p.tiles_k, u, kt) * kFp8FragTileBytes + lane * 16;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    w.lo[c] = ptx::ld_global_stream_v4(base + (2 * c) * 512);
    w.hi[c] = ptx::ld_global_stream_v4(base + (2 * c + 1) * 512);
  }
  w.scale_lo = __ldg(p.scale + int64_t(row_lo / 8) * p.tiles_k + kt);
  w.scale_hi = __ldg(p.scale + int64_t(row_hi / 8) * p.tiles_k + kt);
}

// The lane's x pieces of K tile kt (kXInRegisters): zero past T and K.
template <int kNT>
__device__ __forceinline__ void load_x_regs(const Fp8Projection& p, int token0, int kt, int g, int t,
                                            StageRegs<kNT>& w) {
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int token = token0 + n * 8 + g, col = kt * kTileK + c * kChunkK + 16 * t;
      const bool in = token < p.tokens && col < p.K;
      const __nv_bfloat16* src = p.x + int64_t(token) * p.K + col;
      w.x[n][c][0] = in ? ptx::ld_global_nc_v4(src) : make_uint4(0u, 0u, 0u, 0u);
      w.x[n][c][1] = in ? ptx::ld_global_nc_v4(src + 8) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// x[token0 + n, 128 kt + c] for the CTA's tokens into one shared buffer;
// tokens past T and columns past K are zero-filled.
template <int kNT>
__device__ __forceinline__ void load_x_tile(const Fp8Projection& p, int token0, int kt, __nv_bfloat16* xs) {
  constexpr int kPieces = kNT * 8 * (kTileK / 8);  // 16-byte pieces
  for (int i = int(threadIdx.x); i < kPieces; i += kThreads) {
    const int n = i / (kTileK / 8), col = (i % (kTileK / 8)) * 8, token = token0 + n, k = kt * kTileK + col;
    const bool in = token < p.tokens && k < p.K;
    ptx::cp_async_16(xs + n * kXStride + col, in ? p.x + int64_t(token) * p.K + k : p.x, in ? 16 : 0);
  }
  ptx::cp_async_commit();
}

// Independent accumulator chains of one tile: mma.sync waits for the
// previous mma on the same accumulator, so consecutive mmas go to different
// ones (kNT token tiles x kChains by step).
template <int kNT>
constexpr int kChains = kNT >= 4 ? 1 : 4 / kNT;

// acc += scale x (one K tile of the lane's rows against the CTA's tokens).
// Lane quad t feeds columns 16t..16t+15 of a chunk to mma step s as k-slots
// (2t, 2t+1, 2t+8, 2t+9) <- columns 16t + 4s + (0, 1, 2, 3), the same
// permutation for weights and x, so that both are read 16 bytes at a time.
template <int kNT, Fp8Convert kConv>
__device__ __forceinline__ void multiply_tile(const StageRegs<kNT>& w, const __nv_bfloat16* xs, int g, int t,
                                              float (&acc)[kNT][4]) {
  constexpr int C = kChains<kNT>;
  float tile[C][kNT][4];
#pragma unroll
  for (int ch = 0; ch < C; ++ch)
#pragma unroll
    for (int n = 0; n < kNT; ++n) tile[ch][n][0] = tile[ch][n][1] = tile[ch][n][2] = tile[ch][n][3] = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const uint32_t lo[4] = {w.lo[c].x, w.lo[c].y, w.lo[c].z, w.lo[c].w};
    const uint32_t hi[4] = {w.hi[c].x, w.hi[c].y, w.hi[c].z, w.hi[c].w};
    uint32_t a[4][4];
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if constexpr (kConv == Fp8Convert::Integer) {
        e4m3x4_to_bf16x2(lo[s], a[s][0], a[s][2]);
        e4m3x4_to_bf16x2(hi[s], a[s][1], a[s][3]);
      } else {
        a[s][0] = e4m3x2_to_bf16x2(uint16_t(lo[s]));
        a[s][1] = e4m3x2_to_bf16x2(uint16_t(hi[s]));
        a[s][2] = e4m3x2_to_bf16x2(uint16_t(lo[s] >> 16));
        a[s][3] = e4m3x2_to_bf16x2(uint16_t(hi[s] >> 16));
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // columns 16t + 8 half .. + 7: steps 2 half, 2 half + 1
      uint4 b[kNT];
#pragma unroll
      for (int n = 0; n < kNT; ++n) {
        if constexpr (kXInRegisters<kNT>)
          b[n] = w.x[n][c][half];
        else
          b[n] = *reinterpret_cast<const uint4*>(xs + (n * 8 + g) * kXStride + c * kChunkK + 16 * t + 8 * half);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int s = 2 * half + j;
#pragma unroll
        for (int n = 0; n < kNT; ++n)
          ptx::mma_m16n8k16_bf16(tile[s % C][n], a[s], j ? b[n].z : b[n].x, j ? b[n].w : b[n].y);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < kNT; ++n) {
    float v[4] = {tile[0][n][0], tile[0][n][1], tile[0][n][2], tile[0][n][3]};
#pragma unroll
    for (int ch = 1; ch < C; ++ch)
#pragma unroll
      for (int i = 0; i < 4; ++i) v[i] += tile[ch][n][i];
    acc[n][0] += v[0] * w.scale_lo;
    acc[n][1] += v[1] * w.scale_lo;
    acc[n][2] += v[2] * w.scale_hi;
    acc[n][3] += v[3] * w.scale_hi;
  }
}

// v: the lane's sums, (row lo, token 2t + j) in v[n][j] and (row hi, token
// 2t + j) in v[n][2 + j] of n8 tile n. Gate/up: row lo is a gate row, row hi
// its up row.
template <int kNT, bool kSwiGlu>
__device__ __forceinline__ void store_rows(const Fp8Projection& p, int token0, int row_lo, int row_hi, int t,
                                           const float (&v)[kNT][4]) {
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int token = token0 + n * 8 + 2 * t + j;
      if (token >= p.tokens) continue;
      if constexpr (kSwiGlu) {
        const int half = p.rows / 2;
        p.h[int64_t(token) * half + row_lo] =
            __float2bfloat16_rn(swiglu_limited(v[n][j], v[n][2 + j], p.has_limit, p.limit));
      } else {
        p.out[int64_t(token) * p.rows + row_lo] = v[n][j];
        p.out[int64_t(token) * p.rows + row_hi] = v[n][2 + j];
      }
    }
}

// Pipeline depth in K tiles: the weights of kStages - 1 tiles and their x
// tiles in flight while one is multiplied (register-bound at 64 tokens).
template <int kNT>
constexpr int kStages = kNT == 8 || kNT == 2 ? 2 : kNT == 1 ? 3 : 4;

template <int kNT>
constexpr size_t x_smem_bytes() {
  return kXInRegisters<kNT> ? 0 : size_t(kStages<kNT>) * kNT * 8 * kXStride * sizeof(__nv_bfloat16);
}
// Within the default 48 KB of dynamic shared memory: no opt-in to set per device.
static_assert(x_smem_bytes<4>() <= 48 * 1024 && x_smem_bytes<8>() <= 48 * 1024);

// grid (token tiles, row blocks, K splits); dynamic smem x_smem_bytes<kNT>().
template <int kNT, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads) shared_fp8_kernel(const Fp8Projection p) {
  constexpr Fp8Convert kConv = Fp8Convert::HalfFloat;  // measured faster here than the integer route at 64 tokens
  constexpr int S = kStages<kNT>;
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem);  // [S][kNT * 8][kXStride]
  constexpr int kXTile = kNT * 8 * kXStride;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int tile = int(blockIdx.x), rb = int(blockIdx.y), split = int(blockIdx.z), splits = int(gridDim.z);
  const int token0 = tile * kTokenTile;
  const int kt0 = int(int64_t(p.tiles_k) * split / splits), kt1 = int(int64_t(p.tiles_k) * (split + 1) / splits);
  int row_lo, row_hi;
  lane_rows<kSwiGlu>(p, rb, warp, g, row_lo, row_hi);
  const int u = rb * kWarps + warp;  // the warp's m-tile

  float acc[kNT][4];
#pragma unroll
  for (int n = 0; n < kNT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  // Tile j lives in ring slot (j - kt0) % S. With x in shared memory every
  // step commits one cp.async group (empty past the end), so "all but the
  // newest S - 1" is tile kt.
  constexpr bool kRegs = kXInRegisters<kNT>;
  StageRegs<kNT> ring[S];
  auto issue = [&](int kt, int slot) {
    if (kt < kt1) {
      if constexpr (kRegs)
        load_x_regs<kNT>(p, token0, kt, g, t, ring[slot]);
      else
        load_x_tile<kNT>(p, token0, kt, xs + slot * kXTile);
      load_weight_tile<kNT>(p, u, row_lo, row_hi, kt, lane, ring[slot]);
    } else if constexpr (!kRegs) {
      ptx::cp_async_commit();
    }
  };
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue(kt0 + s, s);
  for (int kt = kt0; kt < kt1; kt += S) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (kt + s >= kt1) break;
      issue(kt + s + S - 1, (s + S - 1) % S);
      if constexpr (!kRegs) {
        ptx::cp_async_wait<S - 1>();
        __syncthreads();
      }
      multiply_tile<kNT, kConv>(ring[s], xs + s * kXTile, g, t, acc);
      if constexpr (!kRegs) __syncthreads();  // slot s is refilled at the next step
    }
  }

  if (splits == 1) {
    if (row_lo >= 0) store_rows<kNT, kSwiGlu>(p, token0, row_lo, row_hi, t, acc);
    return;
  }
  // Split K: publish this split's sums; the last CTA of the output block
  // adds all splits in order.
  const int tiles = int(gridDim.x);
  auto slot = [&](int s, int n, int j) {
    return (int64_t((s * tiles + tile) * kTokenTile + n * 8 + 2 * t + j)) * p.rows;
  };
  if (row_lo >= 0) {
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        p.partial[slot(split, n, j) + row_lo] = acc[n][j];
        p.partial[slot(split, n, j) + row_hi] = acc[n][2 + j];
      }
  }
  if (!last_split_to_arrive(p.counters + int64_t(tile) * gridDim.y + rb, splits)) return;
  if (row_lo < 0) return;
  float sum[kNT][4];
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float lo = 0.0f, hi = 0.0f;
      for (int s = 0; s < splits; ++s) {
        lo += __ldcg(p.partial + slot(s, n, j) + row_lo);
        hi += __ldcg(p.partial + slot(s, n, j) + row_hi);
      }
      sum[n][j] = lo;
      sum[n][2 + j] = hi;
    }
  store_rows<kNT, kSwiGlu>(p, token0, row_lo, row_hi, t, sum);
}

// Decode, up to 16 tokens: one m-tile (16 weight rows) per CTA over all of
// K, its kGemvWarps warps taking every kGemvWarps-th K tile each, and the
// warps' sums added in shared memory: no split-K workspace, no second pass,
// and a grid of one CTA per m-tile (gate/up Is / 8, down H / 16) to spread
// over the SMs. kStages - 1 K tiles (2 KB of weights each a warp, and x)
// are in flight while one is multiplied; launch_gemv picks the stages and
// warps so that the grid fits the SMs in one wave. Launched for
// programmatic dependent launch, a CTA issues its first weight loads before
// it waits for the previous kernel (whose output it reads as x), so that
// they overlap that kernel's tail (2-3 us of a V4-Pro forward).
template <int kNT, bool kSwiGlu, int kStages, int kGemvWarps>
__global__ void __launch_bounds__(32 * kGemvWarps) shared_fp8_gemv_kernel(const Fp8Projection p) {
  static_assert(kXInRegisters<kNT>, "the GEMV form reads x into registers (up to 16 tokens)");
  static_assert(kStages == 2 || kStages == 3, "kStages: 2 or 3 register stages");
  static_assert(kGemvWarps == 3 || kGemvWarps == 4, "kGemvWarps: 3 or 4 warps over K");
  constexpr int S = kStages;
  constexpr Fp8Convert kConv = Fp8Convert::Integer;  // measured faster here than the FP16 route
  __shared__ float sums[kGemvWarps][kNT][4][32];
  ptx::griddep_launch_dependents();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int u = int(blockIdx.x);
  const int row_lo = kSwiGlu ? 8 * u + g : 16 * u + g;
  const int row_hi = kSwiGlu ? p.rows / 2 + 8 * u + g : 16 * u + 8 + g;
  const int tiles = p.tiles_k > warp ? (p.tiles_k - warp + kGemvWarps - 1) / kGemvWarps : 0;  // this warp's K tiles

  float acc[kNT][4];
#pragma unroll
  for (int n = 0; n < kNT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  StageRegs<kNT> ring[S];
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < tiles) load_weight_tile<kNT>(p, u, row_lo, row_hi, warp + kGemvWarps * s, lane, ring[s]);
  ptx::griddep_wait();
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < tiles) load_x_regs<kNT>(p, 0, warp + kGemvWarps * s, g, t, ring[s]);
  for (int i = 0; i < tiles; i += S) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (i + s >= tiles) break;
      const int next = i + s + S - 1, slot = (s + S - 1) % S;
      if (next < tiles) {
        load_x_regs<kNT>(p, 0, warp + kGemvWarps * next, g, t, ring[slot]);
        load_weight_tile<kNT>(p, u, row_lo, row_hi, warp + kGemvWarps * next, lane, ring[slot]);
      }
      multiply_tile<kNT, kConv>(ring[s], nullptr, g, t, acc);
    }
  }
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int j = 0; j < 4; ++j) sums[warp][n][j][lane] = acc[n][j];
  __syncthreads();
  if (warp != 0) return;
  float v[kNT][4];
#pragma unroll
  for (int n = 0; n < kNT; ++n)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[n][j] = sums[0][n][j][lane];
#pragma unroll
      for (int w = 1; w < kGemvWarps; ++w) v[n][j] += sums[w][n][j][lane];
    }
  store_rows<kNT, kSwiGlu>(p, 0, row_lo, row_hi, t, v);
}

// The kernel of a shape (all four share one signature).
template <int kNT, bool kSwiGlu>
auto gemv_kernel(Fp8GemvShape s) {
  if (s.warps == 4)
    return s.stages == 3 ? shared_fp8_gemv_kernel<kNT, kSwiGlu, 3, 4> : shared_fp8_gemv_kernel<kNT, kSwiGlu, 2, 4>;
  return s.stages == 3 ? shared_fp8_gemv_kernel<kNT, kSwiGlu, 3, 3> : shared_fp8_gemv_kernel<kNT, kSwiGlu, 2, 3>;
}

// The grid is one CTA per m-tile (V4-Pro: 384 gate/up, 448 down; V4-Flash:
// 256 each), all meant to stream at once: a CTA that waits for a second
// wave doubles its m-tile's time. A thread takes 155 registers with three
// stages at one n8 tile and 208 at two, 116-119 and 157 with two stages, so
// an SM holds 3 / 2 four-warp CTAs with three stages, 4 / 3 with two, and
// 5 / 4 three-warp CTAs with two stages. The launcher takes the
// first of (4 warps, 3 stages), (4, 2), (3, 2) whose grid fits in one wave
// (else (4, 2)): V4-Pro's down grid at 9-16 tokens runs three-warp CTAs.
// NOTES (H100, GEMV device time, V4-Pro T = 1 / 8 / 12 / 16): four warps,
// two stages 27.6 / 27.8 / 30.9 / 31.7 us against 28.9 / 29.0 / 34.7 / 35.2
// for three stages; V4-Flash, whose grids fit with three, lost 2-4 % with
// two. Three-warp down CTAs at 12 / 16 tokens: 28.8-29.0 / 29.2 against
// 31.1-31.4 / 31.6-31.7; at 1 / 8 tokens, where four-warp CTAs of two
// stages fit, three-warp ones lost ~3 % (V4-Flash ~4 %). Four and five
// stages (two CTAs an SM) gained nothing: V4-Pro T = 1 / 8 31.4-32.6 us
// against 27.3-27.8 with two, V4-Flash 14.3-16.1 against 14.4-15.0 with
// three.
template <int kNT, bool kSwiGlu>
Fp8GemvShape choose_gemv_shape(int64_t m_tiles) {
  for (const Fp8GemvShape c : {Fp8GemvShape{.warps = 4, .stages = 3}, Fp8GemvShape{.warps = 4, .stages = 2},
                                 Fp8GemvShape{.warps = 3, .stages = 2}})
    if (m_tiles <= resident_ctas(gemv_kernel<kNT, kSwiGlu>(c), 32 * c.warps, 0)) return c;
  return Fp8GemvShape{};
}

// GEMV m-tiles of one projection: gate/up 8 gate + 8 up rows each, down 16 rows.
int64_t gemv_m_tiles(int64_t hidden, int64_t inter, bool gate_up) {
  return gate_up ? inter / 8 : ceil_div(hidden, 16);
}

template <int kNT, bool kSwiGlu>
void launch_gemv(const Fp8Projection& p, Fp8GemvShape s, cudaStream_t stream) {
  const dim3 grid(unsigned(kSwiGlu ? p.rows / 16 : ceil_div(p.rows, 16)));  // one CTA per m-tile
  launch_dependent(gemv_kernel<kNT, kSwiGlu>(s), grid, dim3(32 * s.warps), 0, stream, true, p);
}

template <int kNT, bool kSwiGlu>
void launch_split(const Fp8Projection& p, dim3 grid, cudaStream_t stream) {
  shared_fp8_kernel<kNT, kSwiGlu><<<grid, kThreads, x_smem_bytes<kNT>(), stream>>>(p);
}

template <bool kSwiGlu>
void launch_projection(const Fp8Projection& p, int n8_tiles, const SharedFp8Args& a, cudaStream_t stream) {
  const int tiles = int(ceil_div(p.tokens, kTokenTile));
  const bool gemv = a.path == Fp8SharedPath::Gemv || (a.path == Fp8SharedPath::Auto && n8_tiles <= 2);
  if (gemv) {
    const Fp8GemvShape s = shared_fp8_gemv_shape(a, kSwiGlu);  // checks T <= 16 and the forced fields
    if (n8_tiles == 1)
      launch_gemv<1, kSwiGlu>(p, s, stream);
    else
      launch_gemv<2, kSwiGlu>(p, s, stream);
    NVFP4_CUDA_CHECK_LAUNCH(kSwiGlu ? "shared_fp8_gemv_kernel<gate/up>" : "shared_fp8_gemv_kernel<down>");
    return;
  }
  const int blocks = int(ceil_div(kSwiGlu ? p.rows / 2 : p.rows, kBlockRows<kSwiGlu>));
  // A grid of fewer than two CTAs per SM leaves HBM idle: split K in four
  // (measured best on the H200 for V4-Pro and -Flash from 1 to 16 tokens;
  // more splits only add partial sums). The workspace holds
  // kFp8MaxSplitRows token tiles of them.
  int splits = a.force_splits > 0 ? a.force_splits : int64_t(tiles) * blocks < 2 * int64_t(a.sms) ? 4 : 1;
  splits = std::max(1, std::min({splits, kMaxSplits, p.tiles_k, int(kFp8MaxSplitRows / tiles)}));
  const dim3 grid{unsigned(tiles), unsigned(blocks), unsigned(splits)};
  switch (n8_tiles) {
    case 1: launch_split<1, kSwiGlu>(p, grid, stream); break;
    case 2: launch_split<2, kSwiGlu>(p, grid, stream); break;
    case 4: launch_split<4, kSwiGlu>(p, grid, stream); break;
    default: launch_split<8, kSwiGlu>(p, grid, stream); break;
  }
  NVFP4_CUDA_CHECK_LAUNCH(kSwiGlu ? "shared_fp8_kernel<gate/up>" : "shared_fp8_kernel<down>");
}

}  // namespace

bool shared_fp8_supports(const SharedFp8Args& a) {
  return a.tokens >= 0 && a.hidden > 0 && a.inter > 0 && a.hidden % 16 == 0 && a.inter % 16 == 0 &&
         2 * a.inter < (int64_t(1) << 30) && a.hidden < (int64_t(1) << 30) && a.tokens < (int64_t(1) << 30) &&
         aligned_to(a.x, 16) && aligned_to(a.w13, 16) && aligned_to(a.w2, 16) && aligned_to(a.h, 16);
}

Fp8GemvShape shared_fp8_gemv_shape(const SharedFp8Args& a, bool gate_up) {
  NVFP4_CHECK(a.tokens <= 16, "shared_expert_fp8: the GEMV form takes up to 16 tokens, not ", a.tokens);
  NVFP4_CHECK(a.force_gemv_stages == 0 || a.force_gemv_stages == 2 || a.force_gemv_stages == 3,
              "shared_expert_fp8: the GEMV form has 2 or 3 register stages, not ", a.force_gemv_stages);
  NVFP4_CHECK(a.force_gemv_warps == 0 || a.force_gemv_warps == 3 || a.force_gemv_warps == 4,
              "shared_expert_fp8: the GEMV form has 3 or 4 warps a CTA, not ", a.force_gemv_warps);
  const Fp8GemvShapes table = a.gemv_shapes ? *a.gemv_shapes : shared_fp8_gemv_shapes(a.hidden, a.inter);
  Fp8GemvShape s = table.of[gate_up][a.tokens <= 8 ? 0 : 1];
  if (a.force_gemv_warps > 0) s.warps = a.force_gemv_warps;
  if (a.force_gemv_stages > 0) s.stages = a.force_gemv_stages;
  return s;
}

Fp8GemvShapes shared_fp8_gemv_shapes(int64_t hidden, int64_t inter) {
  const int64_t gate_up = gemv_m_tiles(hidden, inter, true), down = gemv_m_tiles(hidden, inter, false);
  Fp8GemvShapes t;
  t.of[0][0] = choose_gemv_shape<1, false>(down);
  t.of[0][1] = choose_gemv_shape<2, false>(down);
  t.of[1][0] = choose_gemv_shape<1, true>(gate_up);
  t.of[1][1] = choose_gemv_shape<2, true>(gate_up);
  return t;
}

int64_t shared_fp8_counters(int64_t hidden, int64_t inter) {
  return kFp8MaxSplitRows * std::max(ceil_div(inter, kBlockRows<true>), ceil_div(hidden, kBlockRows<false>));
}

std::vector<float> fp8_group_scales(const std::vector<float>& tile_scale, int64_t rows, int64_t cols) {
  const int64_t tiles_k = ceil_div(cols, kFp8ScaleTile), groups = rows / kFp8ScaleGroup;
  NVFP4_CHECK(rows % kFp8ScaleGroup == 0 && int64_t(tile_scale.size()) == ceil_div(rows, kFp8ScaleTile) * tiles_k,
              "fp8_group_scales: ", tile_scale.size(), " tile scales for a [", rows, ", ", cols, "] projection");
  std::vector<float> table(size_t(groups * tiles_k));
  for (int64_t gr = 0; gr < groups; ++gr)
    for (int64_t kt = 0; kt < tiles_k; ++kt)
      table[size_t(gr * tiles_k + kt)] = tile_scale[size_t((gr * kFp8ScaleGroup / kFp8ScaleTile) * tiles_k + kt)];
  return table;
}

bool shared_fp8_uses_wgmma(const SharedFp8Args& a) {
  return a.path == Fp8SharedPath::Wgmma ||
         (a.path == Fp8SharedPath::Auto && a.tokens >= kFp8WgmmaMinTokens &&
          shared_fp8_wgmma_supports(a));
}

void shared_expert_fp8(const SharedFp8Args& a, cudaStream_t stream) {
  NVFP4_CHECK(shared_fp8_supports(a), "shared_expert_fp8: unsupported T=", a.tokens, " H=", a.hidden, " Is=", a.inter,
              " (H and Is multiples of 16, 16-byte aligned x, weights and h)");
  if (a.tokens == 0) return;
  if (shared_fp8_uses_wgmma(a)) {
    shared_expert_fp8_wgmma(a, stream);
    return;
  }
  const int n8 = a.tokens <= 8 ? 1 : a.tokens <= 16 ? 2 : a.tokens <= 32 ? 4 : 8;
  const int32_t T = int32_t(a.tokens), H = int32_t(a.hidden), Is = int32_t(a.inter);
  const Fp8Projection gate_up{.x = a.x, .tokens = T, .K = H, .rows = 2 * Is, .tiles_k = int32_t(ceil_div(H, kTileK)),
                              .w = a.w13, .scale = a.w13_scale, .has_limit = a.has_limit, .limit = a.limit,
                              .h = a.h, .out = nullptr, .partial = a.partial, .counters = a.counters};
  const Fp8Projection down{.x = a.h, .tokens = T, .K = Is, .rows = H, .tiles_k = int32_t(ceil_div(Is, kTileK)),
                           .w = a.w2, .scale = a.w2_scale, .has_limit = false, .limit = 0.0f,
                           .h = nullptr, .out = a.out, .partial = a.partial, .counters = a.counters};
  launch_projection<true>(gate_up, n8, a, stream);
  launch_projection<false>(down, n8, a, stream);
}

namespace {

// One thread per 16-byte piece, in layout order (the reads coalesce; each
// piece is 16 consecutive columns of one row, written as 32 bytes).
__global__ void fp8_fragments_to_bf16_kernel(const uint8_t* w, Fp8FragmentGeometry g, const float* group_scale,
                                             int32_t u0, int32_t m_tiles, __nv_bfloat16* out) {
  const int32_t k_tiles = int32_t(g.k_tiles()), cols = int32_t(g.cols), inter = int32_t(g.rows / 2);
  const int32_t n = m_tiles * k_tiles * 128;
  for (int32_t p = int32_t(blockIdx.x * blockDim.x + threadIdx.x); p < n; p += int32_t(gridDim.x * blockDim.x)) {
    const int32_t lane = p & 31, piece = (p >> 5) & 3, blk = p >> 7;
    const int32_t kt = blk % k_tiles, u = u0 + blk / k_tiles, c = piece >> 1, half = piece & 1;
    const int32_t k = kt * kTileK + c * 64 + (lane & 3) * 16, r = lane >> 2;
    int32_t row, local;
    if (g.pairs) {
      row = half * inter + 8 * u + r;
      local = half * 8 * m_tiles + 8 * (u - u0) + r;
    } else {
      row = 16 * u + 8 * half + r;
      local = row - 16 * u0;
    }
    if (k >= cols || row >= g.rows) continue;  // the layout's zero padding
    const uint4 v = ptx::ld_global_stream_v4(w + fp8_fragment_block(g.m_tiles(), k_tiles, u, kt) * kFp8FragTileBytes +
                                             (piece * 32 + lane) * 16);
    const float s = __ldg(group_scale + int64_t(row / 8) * k_tiles + kt);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = ptx::cvt_e4m3x2_to_f16x2(uint16_t(words[j])), hi = ptx::cvt_e4m3x2_to_f16x2(uint16_t(words[j] >> 16));
      const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
      const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
      o[2 * j] = ptx::cvt_bf16x2_from_f32(a.y * s, a.x * s);
      o[2 * j + 1] = ptx::cvt_bf16x2_from_f32(b.y * s, b.x * s);
    }
    uint4* dst = reinterpret_cast<uint4*>(out + int64_t(local) * cols + k);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

}  // namespace

int64_t fp8_chunk_rows(const Fp8FragmentGeometry& g, int64_t m_tiles) {
  return g.pairs ? 16 * m_tiles : std::min(16 * m_tiles, g.rows);
}

void fp8_fragments_to_bf16(const uint8_t* w, const Fp8FragmentGeometry& g, const float* group_scale, int64_t m_tile0,
                           int64_t m_tiles, __nv_bfloat16* out, cudaStream_t stream) {
  NVFP4_CHECK(g.cols % 16 == 0 && m_tile0 >= 0 && m_tiles >= 0 && m_tile0 + m_tiles <= g.m_tiles() &&
                  g.m_tiles() * g.k_tiles() * 128 < (int64_t(1) << 31),
              "fp8_fragments_to_bf16: m-tiles [", m_tile0, ", ", m_tile0 + m_tiles, ") of a [", g.rows, ", ", g.cols,
              "] projection of ", g.m_tiles());
  const int64_t n = m_tiles * g.k_tiles() * 128;
  if (n == 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>(ceil_div(n, 256), 132 * 8));
  fp8_fragments_to_bf16_kernel<<<blocks, 256, 0, stream>>>(w, g, group_scale, int32_t(m_tile0), int32_t(m_tiles), out);
  NVFP4_CUDA_CHECK_LAUNCH("fp8_fragments_to_bf16_kernel");
}

bool fp8_scales_are_powers_of_two(const std::vector<float>& tile_scale, int max_exponent) {
  for (const float s : tile_scale) {
    int e = 0;
    // E4M3 spans 2^-9 .. 448 < 2^9: every multiple stays a normal BF16 for 2^-117 <= s <= 2^118.
    if (!(s > 0.0f) || std::frexp(s, &e) != 0.5f || e - 1 < -117 || e - 1 > max_exponent) return false;
  }
  return true;
}

}  // namespace nvfp4moe::cuda
