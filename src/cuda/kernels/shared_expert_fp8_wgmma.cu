// shared_expert_fp8_wgmma (see shared_expert_fp8.hpp): the FP8 shared
// expert's wgmma form.
//
// Per projection one kernel; a CTA is one producer warp and two consumer
// warpgroups on 64 weight rows (4 m-tiles of the fragment layout, one per
// warp of a warpgroup) x kBlockN tokens x all of K, one CTA an SM:
//   producer  per stage (4, 2 or 1 consecutive K tiles for up to 32, 64
//             or 128 tokens): one bulk copy of the group's fragment blocks
//             (contiguous in the layout) and one 3-D TMA box of the tiles'
//             64-column chunks of x (128-byte swizzle) into a ring of ~216
//             KB, completing on the stage's full barrier (the weights under
//             L2's evict-first policy); launched for
//             programmatic dependent launch, it issues the weights of the
//             first stages before it waits for the kernel that writes x, so
//             that they overlap its tail;
//   consumers first the CTA's tile factors, as BF16 multipliers, into shared
//             memory (one global load each up front, not one on every K
//             tile's critical path); then both warpgroups take every stage,
//             warpgroup j the 64-column chunk j of each K tile: per two K
//             tiles each warp turns its 2 x 16 bytes of each into the A
//             fragments of 8 k16 steps in registers (E4M3 -> BF16 by integer
//             operations, the tile's power-of-two factor folded into the
//             BF16 multiply: exact), issues 8 wgmma m64nNk16 with B = x in
//             shared memory and waits for them; the stage is released by
//             both, so one stage of the ring is held while the rest stream
//             in; while one warpgroup converts, the other's wgmmas run;
//   epilogue  warpgroup 1 hands its FP32 sums to warpgroup 0 through shared
//             memory, which adds them to its own (a fixed order) and writes
//             h (gate/up, SwiGLU in registers) or out (down).
// No K split across CTAs: the partial-sum round trip through global memory
// and the second wave of CTAs it needs cost more than the SMs a projection
// of 96-112 row blocks leaves idle (measured on the H200).
// The fragment layout feeds mma step s of a 64-column chunk with logical
// columns 16t + 4s + q (lane quad t, q = 0..3) at k-slots 2t, 2t+1, 2t+8,
// 2t+9; wgmma reads B's k-slot j of step s from column 16s + j of the
// shared tile. So x is given in that permuted order (fp8_permute_columns),
// and the gate/up epilogue writes h permuted the same way for the down
// projection.
#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/dependent_launch.hpp"
#include "cuda/kernels/fp8_dequant.cuh"
#include "cuda/kernels/shared_expert_fp8.hpp"
#include "cuda/kernels/swiglu.cuh"
#include "cuda/layout/fp8_fragment_layout.hpp"
#include "cuda/layout/tensor_map.hpp"
#include "cuda/ptx/sm90_griddep.cuh"
#include "cuda/ptx/sm90_mbarrier.cuh"
#include "cuda/ptx/sm90_tma.cuh"
#include "cuda/ptx/sm90_wgmma.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kConsumerGroups = 2;  // warpgroups, one 64-column chunk of each K tile each
constexpr int kGroupThreads = 128;
constexpr int kConsumerThreads = kConsumerGroups * kGroupThreads;
constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
constexpr int kTileK = int(kFp8FragTileK);
constexpr int kTileWeights = int(kFp8FragGroup * kFp8FragTileBytes);  // one K tile of the CTA's m-tile group
// K tiles of the CTA's factor table in shared memory: K up to 16384.
constexpr int kMaxScaleTiles = 128;
constexpr int kScaleSlots = 8;  // 4 warps x (row lo, row hi) groups, the same for both warpgroups
constexpr int kRingBudget = 216 * 1024;
static_assert(kScaleSlots * kMaxScaleTiles % kConsumerThreads == 0, "whole rounds of factor loads");

// A stage holds kTiles consecutive K tiles: one bulk copy of the group's
// kTiles x 8 KB (contiguous in the fragment layout) and one TMA box of x's
// 2 kTiles chunks. Larger stages stream faster: with both warpgroups on
// every stage, 4 / 4 / 2 tiles at 16 / 32 / 64 tokens took V4-Pro 35.2 /
// 35.8 / 44.5 us where 2 / 2 / 1 took 40.4 / 42.4 / 47.0 (one H200 run);
// the ring's budget leaves 4 / 3 / 4 / 5 stages for 16 / 32 / 64 / 128
// tokens.
constexpr int stage_tiles(int block_n) { return block_n <= 32 ? 4 : block_n == 64 ? 2 : 1; }
template <int kBlockN, int kTiles>
struct Ring {
  static constexpr int kXChunk = kBlockN * 128;  // [kBlockN][64] BF16, 128-byte swizzled
  static constexpr int kXTile = 2 * kXChunk;
  static constexpr int kXStage = kTiles * kXTile;
  static constexpr int kWeightStage = kTiles * kTileWeights;  // [tile][m-tile][2 KB]
  static constexpr int kStageBytes = kXStage + kWeightStage;
  static constexpr int kStages = std::min(16, kRingBudget / kStageBytes);
  static_assert(kStages >= 2, "a stage for each warpgroup at least");
  static constexpr int kX = 0;
  static constexpr int kW = kX + kStages * kXStage;
  static constexpr int kFull = kW + kStages * kWeightStage;
  static constexpr int kEmpty = kFull + 8 * kStages;
  static constexpr int kMult = kEmpty + 8 * kStages;  // uint32 [kScaleSlots][kMaxScaleTiles]
  static constexpr int kBytes = kMult + kScaleSlots * kMaxScaleTiles * 4;
  static constexpr size_t smem() { return 1024 + size_t(kBytes); }  // + alignment of the base
  static_assert(kXChunk % 1024 == 0, "swizzled x chunks stay 1024-byte aligned");
  // The epilogue's hand-over of warpgroup 1's sums reuses the ring.
  static_assert(kGroupThreads * (kBlockN / 2) * 4 <= kStages * kStageBytes, "the hand-over fits the ring");
};
static_assert(Ring<16, stage_tiles(16)>::smem() <= 227 * 1024 && Ring<32, stage_tiles(32)>::smem() <= 227 * 1024 &&
                  Ring<64, stage_tiles(64)>::smem() <= 227 * 1024 && Ring<128, stage_tiles(128)>::smem() <= 227 * 1024,
              "within the opt-in limit");

struct WgmmaProjection {
  int32_t tokens, rows, tiles_k;
  const uint8_t* w;     // fragment layout
  const float* scale;   // group scale table [rows / 8, tiles_k], powers of two 2^-117 .. 2^7
  bool has_limit;
  float limit;
  __nv_bfloat16* h;     // gate/up: [T, rows / 2], columns permuted
  float* out;           // down: [T, rows]
};

// The physical column (within its 64-column chunk) of logical column l.
__device__ __forceinline__ int permuted_column(int l) {
  const int t = l / 16, s = (l % 16) / 4, q = l % 4;
  return 16 * s + (q < 2 ? 2 * t + q : 8 + 2 * t + q - 2);
}

// The group scale table row of factor slot `slot` (warp slot / 2, its row
// lo or hi group) of the CTA whose first m-tile is u0.
template <bool kSwiGlu>
__device__ __forceinline__ int scale_group(const WgmmaProjection& p, int u0, int slot) {
  const int u = u0 + slot / 2, hi = slot % 2;
  return kSwiGlu ? (hi ? p.rows / 16 + u : u) : 2 * u + hi;
}

// BF16x2 of 2^120 * factor for a power-of-two factor 2^e, e <= 7: the
// multiplier that turns e4m3x4_to_bf16x2's masked patterns into value * 2^e.
__device__ __forceinline__ uint32_t folded_multiplier(float factor) {
  const uint32_t bits = ((__float_as_uint(factor) >> 23) & 0xffu) + 120u;
  return (bits << 7) | (bits << 23);
}

template <int kBlockN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kBlockN / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kBlockN == 16)
    ptx::wgmma_m64n16k16_rs(d, a, desc);
  else if constexpr (kBlockN == 32)
    ptx::wgmma_m64n32k16_rs(d, a, desc);
  else if constexpr (kBlockN == 64)
    ptx::wgmma_m64n64k16_rs(d, a, desc);
  else
    ptx::wgmma_m64n128k16_rs(d, a, desc);
}

// Chunk c (64 columns) of one K tile of the warp's m-tile (its 2 KB
// fragment block at `block`): the A fragments of 4 k16 steps, rows g (lo)
// and g + 8 (hi) times their tile factors.
__device__ __forceinline__ void convert_chunk(uint32_t block, int lane, int c, uint32_t mult_lo, uint32_t mult_hi,
                                              uint32_t (&a)[4][4]) {
  const uint32_t base = block + lane * 16;
  const uint4 lo = ptx::ld_shared_v4(base + (2 * c) * 512), hi = ptx::ld_shared_v4(base + (2 * c + 1) * 512);
  const uint32_t l[4] = {lo.x, lo.y, lo.z, lo.w}, h[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    e4m3x4_to_bf16x2(l[s], a[s][0], a[s][2], mult_lo);
    e4m3x4_to_bf16x2(h[s], a[s][1], a[s][3], mult_hi);
  }
}

// v[j * 4 + q]: rows g (q < 2) and g + 8, token 8 j + 2 t + q % 2 of the tile.
template <int kBlockN, bool kSwiGlu>
__device__ __forceinline__ void store_block(const WgmmaProjection& p, int token0, int u, int g, int t,
                                            const float (&v)[kBlockN / 2]) {
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int token = token0 + 8 * j + 2 * t + c;
      if (token >= p.tokens) continue;
      const float lo = v[4 * j + c], hi = v[4 * j + 2 + c];
      if constexpr (kSwiGlu) {
        const int i = 8 * u + g, half = p.rows / 2;
        p.h[int64_t(token) * half + (i / 64) * 64 + permuted_column(i % 64)] =
            __float2bfloat16_rn(swiglu_limited(lo, hi, p.has_limit, p.limit));
      } else {
        p.out[int64_t(token) * p.rows + 16 * u + g] = lo;
        p.out[int64_t(token) * p.rows + 16 * u + 8 + g] = hi;
      }
    }
}

// grid (token tiles, row blocks of 64); dynamic smem Ring<kBlockN, kTiles>::smem().
template <int kBlockN, int kTiles, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads, 1) shared_fp8_wgmma_kernel(const WgmmaProjection p,
                                                                       const __grid_constant__ CUtensorMap x_map) {
  using R = Ring<kBlockN, kTiles>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (ptx::smem_addr(smem_raw) + 1023u) & ~1023u;
  unsigned char* const smem = smem_raw + (base - ptx::smem_addr(smem_raw));
  uint32_t* const mult = reinterpret_cast<uint32_t*>(smem + R::kMult);
  // The next kernel of the stream may start placing its CTAs once every CTA
  // here has started: it waits (griddep_wait) before it touches our output.
  ptx::griddep_launch_dependents();
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int tile = int(blockIdx.x), token0 = tile * kBlockN, u0 = int(blockIdx.y) * 4;
  const int tiles_k = p.tiles_k, stages_k = (tiles_k + kTiles - 1) / kTiles;
  const uint32_t full = base + R::kFull, empty = base + R::kEmpty;
  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) {
      ptx::mbarrier_init(full + 8 * s, 1);
      ptx::mbarrier_init(empty + 8 * s, kConsumerThreads / 32);  // lane 0 of each consumer warp
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  if (warp == kConsumerThreads / 32) {  // producer
    if (lane == 0) {
      ptx::prefetch_tensor_map(&x_map);
      // The weights are read once, so L2 evicts them before x and h, which
      // every CTA reads. NOTES (measured on an H100, device time, V4-Pro
      // T = 1 / 8 / 16 / 32 / 64, three rounds): 32.0-32.1 / 32.3-32.4 /
      // 32.2-32.4 / 32.7-32.9 / 38.1-38.3 us against 33.0-33.3 / 33.4-33.5 /
      // 33.1-33.2 / 34.4 / 38.9-39.3 with the default policy; the GEMV form's
      // register loads lost 0.5-1 % with the same hint.
      const uint64_t evict_first = ptx::l2_policy_evict_first();
      // Stage i: K tiles [kTiles i, min(kTiles (i + 1), tiles_k)).
      // The group's K tiles [kt, kt + n) are one contiguous run of n x 8 KB
      // (fp8_fragment_layout.hpp): one bulk copy a stage.
      auto load_weights = [&](int i, int stage) {
        const int kt = i * kTiles, n = std::min(kTiles, tiles_k - kt);
        const uint32_t bar = full + 8 * stage;
        ptx::mbarrier_arrive_expect_tx(bar, uint32_t(n * kTileWeights + R::kXStage));
        ptx::cp_async_bulk_shared_global(base + R::kW + stage * R::kWeightStage,
                                         p.w + fp8_fragment_block(p.rows / 16, tiles_k, u0, kt) * kFp8FragTileBytes,
                                         uint32_t(n * kTileWeights), bar, evict_first);
      };
      // The stage's 2 n x chunks in one 3-D box (make_fp8_wgmma_maps); past
      // K its chunks read as zeros and count toward the transaction.
      auto load_x = [&](int i, int stage) {
        ptx::tma_load_3d(base + R::kX + stage * R::kXStage, &x_map, full + 8 * stage, 0, token0, 2 * i * kTiles);
      };
      // The first stages are empty: their weights go out before x exists.
      const int first = std::min(int(R::kStages), stages_k);
      for (int i = 0; i < first; ++i) load_weights(i, i);
      ptx::griddep_wait();
      for (int i = 0; i < first; ++i) load_x(i, i);
      for (int i = first; i < stages_k; ++i) {
        const int stage = i % R::kStages;
        ptx::mbarrier_wait_parity(empty + 8 * stage, uint32_t((i / R::kStages) & 1) ^ 1u);
        load_weights(i, stage);
        load_x(i, stage);
      }
    }
    return;  // the epilogue's barriers count the consumer warps only
  }

  // Consumers: warpgroup wg, its warp wl owns m-tile u0 + wl.
  const int wg = warp / 4, wl = warp % 4, tid = int(threadIdx.x) % kGroupThreads;
  const int g = lane / 4, t = lane % 4, u = u0 + wl;
  {  // all loads first, then the stores: one memory latency, not one per round
    constexpr int kRounds = kScaleSlots * kMaxScaleTiles / kConsumerThreads;
    float factor[kRounds];
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int i = int(threadIdx.x) + r * kConsumerThreads, slot = i / tiles_k, kt = i % tiles_k;
      factor[r] = i < kScaleSlots * tiles_k
                      ? __ldg(p.scale + int64_t(scale_group<kSwiGlu>(p, u0, slot)) * tiles_k + kt)
                      : 1.0f;
    }
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int i = int(threadIdx.x) + r * kConsumerThreads;
      if (i < kScaleSlots * tiles_k) mult[(i / tiles_k) * kMaxScaleTiles + i % tiles_k] = folded_multiplier(factor[r]);
    }
  }
  ptx::named_barrier_sync(1, kConsumerThreads);
  const uint32_t* mult_lo = mult + (2 * wl) * kMaxScaleTiles;
  const uint32_t* mult_hi = mult + (2 * wl + 1) * kMaxScaleTiles;

  float acc[kBlockN / 2];
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {
    acc[i] = 0.0f;
    ptx::wgmma_fence_operand(acc[i]);
  }
  // Both warpgroups take every stage, warpgroup wg the 64-column chunk wg
  // of each of its K tiles, and release it together: only one stage of the
  // ring is held while the others stream in. Per two K tiles: convert, 8
  // wgmmas (4 for a last odd tile), wait. (Converting the next tiles while
  // these wgmmas run, with two A buffers, made ptxas serialize every
  // wgmma: C7513; the other warpgroup fills that gap.)
  uint32_t a[2][4][4];
  for (int i = 0; i < stages_k; ++i) {
    const int stage = i % R::kStages, kt0 = i * kTiles, n = std::min(kTiles, tiles_k - kt0);
    ptx::mbarrier_wait_parity(full + 8 * stage, uint32_t((i / R::kStages) & 1));
    const uint32_t w_stage = base + R::kW + stage * R::kWeightStage + wl * uint32_t(kFp8FragTileBytes);
    const uint32_t x_stage = base + R::kX + stage * R::kXStage + wg * R::kXChunk;
#pragma unroll
    for (int j = 0; j < kTiles; j += 2) {
      if (j >= n) break;
      const bool pair = j + 1 < n;
      convert_chunk(w_stage + j * uint32_t(kTileWeights), lane, wg, mult_lo[kt0 + j], mult_hi[kt0 + j], a[0]);
      if (pair)
        convert_chunk(w_stage + (j + 1) * uint32_t(kTileWeights), lane, wg, mult_lo[kt0 + j + 1],
                      mult_hi[kt0 + j + 1], a[1]);
      const uint64_t desc = ptx::smem_desc_k_major_sw128(x_stage + j * R::kXTile);
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < 4; ++k) wgmma_rs<kBlockN>(acc, a[0][k], ptx::smem_desc_advance(desc, k * 32));
      if (pair) {
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_rs<kBlockN>(acc, a[1][k], ptx::smem_desc_advance(desc, R::kXTile + k * 32));
      }
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<0>();
    }
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(empty + 8 * stage);
  }
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) ptx::wgmma_fence_operand(acc[i]);

  // Warpgroup 1's sums to warpgroup 0 through the ring (every stage has been
  // consumed once both warpgroups are here), added in a fixed order.
  float* const handover = reinterpret_cast<float*>(smem);  // [kBlockN / 2][kGroupThreads]
  ptx::named_barrier_sync(1, kConsumerThreads);
  if (wg == 1) {
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) handover[i * kGroupThreads + tid] = acc[i];
  }
  ptx::named_barrier_sync(1, kConsumerThreads);
  if (wg == 1) return;
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) acc[i] += handover[i * kGroupThreads + tid];
  // The previous kernel of the stream may still read the buffer written
  // below (h, out) until it completes.
  ptx::griddep_wait();
  store_block<kBlockN, kSwiGlu>(p, token0, u, g, t, acc);
}

// xp[t, 64 c + p] = x[t, 64 c + l] for the permuted column p of l, 8
// columns a thread: logical columns 4q' .. 4q' + 3 go to two BF16 pairs
// (permuted_column keeps pairs 2t, 2t + 1 together), so one 16-byte load
// becomes four 4-byte stores. cols is a multiple of 64.
__global__ void permute_columns_kernel(const __nv_bfloat16* x, int64_t tokens, int32_t cols, __nv_bfloat16* xp) {
  ptx::griddep_launch_dependents();
  ptx::griddep_wait();  // x is the previous kernel's output
  const int64_t n = tokens * cols / 8;
  const uint4* src = reinterpret_cast<const uint4*>(x);
  uint32_t* dst = reinterpret_cast<uint32_t*>(xp);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = src[i];
    const int64_t l0 = 8 * i, chunk = l0 - l0 % 64;  // flat index of the chunk's column 0
    const int l = int(l0 % 64);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) dst[(chunk + permuted_column(l + 2 * j)) / 2] = w[j];
  }
}

constexpr int kWidths[kFp8WgmmaWidths] = {16, 32, 64, 128};

template <int kBlockN, int kTiles, bool kSwiGlu>
void launch_tiles(const WgmmaProjection& p, const CUtensorMap& map, cudaStream_t stream) {
  const int tiles = int(ceil_div(p.tokens, kBlockN));
  const int blocks = (kSwiGlu ? p.rows / 2 : p.rows) / (kSwiGlu ? 32 : 64);  // 64 weight rows a CTA
  launch_dependent(shared_fp8_wgmma_kernel<kBlockN, kTiles, kSwiGlu>, dim3(unsigned(tiles), unsigned(blocks)),
                   dim3(kThreads), Ring<kBlockN, kTiles>::smem(), stream, true, p, map);
  NVFP4_CUDA_CHECK_LAUNCH(kSwiGlu ? "shared_fp8_wgmma_kernel<gate/up>" : "shared_fp8_wgmma_kernel<down>");
}

template <int kBlockN, bool kSwiGlu>
void launch(const WgmmaProjection& p, const CUtensorMap& map, cudaStream_t stream) {
  launch_tiles<kBlockN, stage_tiles(kBlockN), kSwiGlu>(p, map, stream);
}

template <bool kSwiGlu>
void launch_width(const WgmmaProjection& p, const CUtensorMap (&maps)[kFp8WgmmaWidths], cudaStream_t stream) {
  if (p.tokens <= 16)
    launch<16, kSwiGlu>(p, maps[0], stream);
  else if (p.tokens <= 32)
    launch<32, kSwiGlu>(p, maps[1], stream);
  else if (p.tokens <= 64)
    launch<64, kSwiGlu>(p, maps[2], stream);
  else
    launch<128, kSwiGlu>(p, maps[3], stream);
}

template <int kBlockN>
void allow_smem() {
  constexpr int n = stage_tiles(kBlockN);
  allow_smem_at_least(shared_fp8_wgmma_kernel<kBlockN, n, true>, Ring<kBlockN, n>::smem());
  allow_smem_at_least(shared_fp8_wgmma_kernel<kBlockN, n, false>, Ring<kBlockN, n>::smem());
}

}  // namespace

Fp8WgmmaMaps make_fp8_wgmma_maps(const __nv_bfloat16* x_perm, const __nv_bfloat16* h, int64_t max_tokens,
                                 int64_t hidden, int64_t inter) {
  NVFP4_CHECK(max_tokens > 0 && hidden % 64 == 0 && inter % 64 == 0, "make_fp8_wgmma_maps: T=", max_tokens,
              " H=", hidden, " Is=", inter, " (H and Is multiples of 64)");
  Fp8WgmmaMaps m;
  // x_perm [T, H] and h [T, Is] as [chunks of 64 columns][T][64]: a
  // stage's box of 2 stage_tiles chunks lands as the ring's [chunk][token][64].
  for (int i = 0; i < kFp8WgmmaWidths; ++i) {
    const uint32_t width = uint32_t(kWidths[i]), chunk_count = uint32_t(2 * stage_tiles(kWidths[i]));
    m.x[i] = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x_perm,
                             {64, uint64_t(max_tokens), uint64_t(hidden / 64)}, {uint64_t(hidden) * 2, 128},
                             {64, width, chunk_count}, CU_TENSOR_MAP_SWIZZLE_128B);
    m.h[i] = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, h, {64, uint64_t(max_tokens), uint64_t(inter / 64)},
                             {uint64_t(inter) * 2, 128}, {64, width, chunk_count}, CU_TENSOR_MAP_SWIZZLE_128B);
  }
  m.max_tokens = max_tokens;
  allow_smem<16>();
  allow_smem<32>();
  allow_smem<64>();
  allow_smem<128>();
  return m;
}

bool shared_fp8_wgmma_supports(const SharedFp8Args& a) {
  return a.scales_fold && a.x_perm != nullptr && a.wgmma_maps != nullptr && a.tokens <= a.wgmma_maps->max_tokens &&
         a.hidden % 64 == 0 && a.inter % 64 == 0 && a.tokens > 0 && a.hidden <= kMaxScaleTiles * kTileK &&
         a.inter <= kMaxScaleTiles * kTileK &&
         aligned_to(a.x, 16) && aligned_to(a.h, 16) && aligned_to(a.x_perm, 16) && a.tokens < (int64_t(1) << 30);
}

void shared_expert_fp8_wgmma(const SharedFp8Args& a, cudaStream_t stream) {
  NVFP4_CHECK(shared_fp8_wgmma_supports(a), "shared_expert_fp8_wgmma: unsupported T=", a.tokens, " H=", a.hidden,
              " Is=", a.inter, " (H and Is multiples of 64 up to 16384, power-of-two tile factors 2^-117 .. 2^7, x_perm and maps for ",
              "at least T tokens)");
  const int32_t T = int32_t(a.tokens), H = int32_t(a.hidden), Is = int32_t(a.inter);
  launch_dependent(permute_columns_kernel, dim3(unsigned(std::min<int64_t>(ceil_div(a.tokens * a.hidden / 8, 256), 132 * 8))),
                   dim3(256), 0, stream, true, a.x, a.tokens, H, a.x_perm);
  NVFP4_CUDA_CHECK_LAUNCH("permute_columns_kernel");
  const WgmmaProjection gate_up{.tokens = T, .rows = 2 * Is, .tiles_k = int32_t(ceil_div(H, kTileK)),
                                .w = a.w13, .scale = a.w13_scale, .has_limit = a.has_limit, .limit = a.limit,
                                .h = a.h, .out = nullptr};
  launch_width<true>(gate_up, a.wgmma_maps->x, stream);
  const WgmmaProjection down{.tokens = T, .rows = H, .tiles_k = int32_t(ceil_div(Is, kTileK)),
                             .w = a.w2, .scale = a.w2_scale, .has_limit = false, .limit = 0.0f,
                             .h = nullptr, .out = a.out};
  launch_width<false>(down, a.wgmma_maps->h, stream);
}

}  // namespace nvfp4moe::cuda
