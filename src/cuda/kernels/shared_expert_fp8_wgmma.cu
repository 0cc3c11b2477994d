// shared_expert_fp8_wgmma (see shared_expert_fp8.hpp): the FP8 shared
// expert's wgmma form, for 17 tokens and more.
//
// Per projection one kernel; a CTA is one producer warp and one consumer
// warpgroup on 64 weight rows (4 m-tiles of the fragment layout, one per
// warp) x kBlockN tokens x a range of 128-column K tiles:
//   producer  per K tile: the 4 m-tiles' 2 KB fragment blocks (bulk copies)
//             and the two 64-column chunks of x (TMA, 128-byte swizzle) into
//             a ring of stages, completing on the stage's full barrier;
//   consumer  per K tile: each warp turns its 4 x 16 bytes into the A
//             fragments of 8 k16 steps in registers (E4M3 -> BF16 by integer
//             operations, the tile's power-of-two factor folded into the
//             BF16 multiply: exact), then 8 wgmma m64nNk16 with B = x in
//             shared memory, and releases the stage once they are done;
//   epilogue  the accumulators (FP32 over all of K) -> h (gate/up, SwiGLU in
//             registers) or out (down); when K is split over gridDim.z, the
//             splits' sums go to a workspace and the last CTA of an output
//             block adds them in split order.
// The fragment layout feeds mma step s of a 64-column chunk with logical
// columns 16t + 4s + q (lane quad t, q = 0..3) at k-slots 2t, 2t+1, 2t+8,
// 2t+9; wgmma reads B's k-slot j of step s from column 16s + j of the
// shared tile. So x is given in that permuted order (fp8_permute_columns),
// and the gate/up epilogue writes h permuted the same way for the down
// projection.
#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/fp8_dequant.cuh"
#include "cuda/kernels/shared_expert_fp8.hpp"
#include "cuda/kernels/split_k_arrival.cuh"
#include "cuda/kernels/swiglu.cuh"
#include "cuda/layout/fp8_fragment_layout.hpp"
#include "cuda/layout/tensor_map.hpp"
#include "cuda/ptx/sm90_mbarrier.cuh"
#include "cuda/ptx/sm90_tma.cuh"
#include "cuda/ptx/sm90_wgmma.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kConsumerThreads = 128;
constexpr int kThreads = kConsumerThreads + 32;  // + the producer warp
constexpr int kBlockRows = 64;                   // 4 m-tiles
constexpr int kTileK = int(kFp8FragTileK);
constexpr int kWeightStage = 4 * int(kFp8FragTileBytes);
constexpr int kMaxSplits = 4;

template <int kBlockN>
struct Ring {
  static constexpr int kXChunk = kBlockN * 128;  // [kBlockN][64] BF16, 128-byte swizzled
  static constexpr int kXStage = 2 * kXChunk;
  static constexpr int kStageBytes = kXStage + kWeightStage;
  // ~100 KB (two CTAs an SM) up to 64 tokens, ~200 KB at 128.
  static constexpr int kStages = std::min(8, (kBlockN == 128 ? 200 : 100) * 1024 / kStageBytes);
  static constexpr int kX = 0;
  static constexpr int kW = kX + kStages * kXStage;
  static constexpr int kFull = kW + kStages * kWeightStage;
  static constexpr int kEmpty = kFull + 8 * kStages;
  static constexpr int kBytes = kEmpty + 8 * kStages;
  static constexpr size_t smem() { return 1024 + size_t(kBytes); }  // + alignment of the base
  static_assert(kXChunk % 1024 == 0, "swizzled x chunks stay 1024-byte aligned");
};

struct WgmmaProjection {
  int32_t tokens, K, rows, tiles_k;
  const uint8_t* w;     // fragment layout
  const float* scale;   // group scale table [rows / 8, tiles_k], powers of two 2^-117 .. 2^7
  bool has_limit;
  float limit;
  __nv_bfloat16* h;     // gate/up: [T, rows / 2], columns permuted
  float* out;           // down: [T, rows]
  float* partial;       // [splits, token tiles, kBlockN, rows]
  int32_t* counters;    // [token tiles, row blocks]
};

// The physical column (within its 64-column chunk) of logical column l.
__device__ __forceinline__ int permuted_column(int l) {
  const int t = l / 16, s = (l % 16) / 4, q = l % 4;
  return 16 * s + (q < 2 ? 2 * t + q : 8 + 2 * t + q - 2);
}

// BF16x2 of 2^120 * factor for a power-of-two factor 2^e, e <= 7: the
// multiplier that turns e4m3x4_to_bf16x2's masked patterns into value * 2^e.
__device__ __forceinline__ uint32_t folded_multiplier(float factor) {
  const uint32_t bits = ((__float_as_uint(factor) >> 23) & 0xffu) + 120u;
  return (bits << 7) | (bits << 23);
}

template <int kBlockN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kBlockN / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kBlockN == 32)
    ptx::wgmma_m64n32k16_rs(d, a, desc);
  else if constexpr (kBlockN == 64)
    ptx::wgmma_m64n64k16_rs(d, a, desc);
  else
    ptx::wgmma_m64n128k16_rs(d, a, desc);
}

// One K tile of the warp's m-tile: 8 k16 steps of A fragments, rows g (lo)
// and g + 8 (hi) times their tile factors.
__device__ __forceinline__ void convert_tile(uint32_t w_stage, int warp, int lane, uint32_t mult_lo, uint32_t mult_hi,
                                             uint32_t (&a)[8][4]) {
  const uint32_t base = w_stage + warp * uint32_t(kFp8FragTileBytes) + lane * 16;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const uint4 lo = ptx::ld_shared_v4(base + (2 * c) * 512), hi = ptx::ld_shared_v4(base + (2 * c + 1) * 512);
    const uint32_t l[4] = {lo.x, lo.y, lo.z, lo.w}, h[4] = {hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      e4m3x4_to_bf16x2(l[s], a[4 * c + s][0], a[4 * c + s][2], mult_lo);
      e4m3x4_to_bf16x2(h[s], a[4 * c + s][1], a[4 * c + s][3], mult_hi);
    }
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

// grid (token tiles, row blocks of 64, K splits); dynamic smem Ring<kBlockN>::smem().
template <int kBlockN, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads) shared_fp8_wgmma_kernel(const WgmmaProjection p,
                                                                    const __grid_constant__ CUtensorMap x_map) {
  using R = Ring<kBlockN>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t base = (ptx::smem_addr(smem_raw) + 1023u) & ~1023u;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int tile = int(blockIdx.x), rb = int(blockIdx.y), split = int(blockIdx.z), splits = int(gridDim.z);
  const int token0 = tile * kBlockN, u0 = rb * 4;
  const int kt0 = int(int64_t(p.tiles_k) * split / splits), kt1 = int(int64_t(p.tiles_k) * (split + 1) / splits);
  const uint32_t full = base + R::kFull, empty = base + R::kEmpty;
  if (threadIdx.x == 0) {
    for (int s = 0; s < R::kStages; ++s) {
      ptx::mbarrier_init(full + 8 * s, 1);
      ptx::mbarrier_init(empty + 8 * s, 4);  // lane 0 of each consumer warp
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  float acc[kBlockN / 2];
  const int g = lane / 4, t = lane % 4, u = u0 + warp;  // (the producer warp's u, rows: unused)
  const int row_lo = kSwiGlu ? 8 * u + g : 16 * u + g;
  const int row_hi = kSwiGlu ? p.rows / 2 + 8 * u + g : 16 * u + 8 + g;
  if (warp == 4) {  // producer
    if (lane == 0) {
      ptx::prefetch_tensor_map(&x_map);
      int stage = 0;
      uint32_t phase = 0;
      for (int kt = kt0; kt < kt1; ++kt) {
        ptx::mbarrier_wait_parity(empty + 8 * stage, phase ^ 1);
        const uint32_t bar = full + 8 * stage;
        ptx::mbarrier_arrive_expect_tx(bar, uint32_t(kWeightStage + R::kXStage));
        for (int i = 0; i < 4; ++i)
          ptx::cp_async_bulk_shared_global(base + R::kW + stage * kWeightStage + i * uint32_t(kFp8FragTileBytes),
                                           p.w + (int64_t(u0 + i) * p.tiles_k + kt) * kFp8FragTileBytes,
                                           uint32_t(kFp8FragTileBytes), bar);
        for (int c = 0; c < 2; ++c)
          ptx::tma_load_2d(base + R::kX + stage * R::kXStage + c * R::kXChunk, &x_map, bar, kt * kTileK + 64 * c,
                           token0);
        if (++stage == R::kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
  } else {  // consumers: warp w owns m-tile u0 + w
    const float* scale_lo = p.scale + int64_t(row_lo / 8) * p.tiles_k;
    const float* scale_hi = p.scale + int64_t(row_hi / 8) * p.tiles_k;
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) {
      acc[i] = 0.0f;
      ptx::wgmma_fence_operand(acc[i]);
    }
    // Per K tile: convert, 8 wgmmas, wait, release the stage. (Converting
    // the next tile while this one's wgmmas run, with two A buffers, made
    // ptxas serialize every wgmma: C7513.) A second CTA on the SM (up to 64
    // tokens) fills the tensor cores meanwhile.
    uint32_t a[8][4];
    int stage = 0;
    uint32_t phase = 0;
    for (int kt = kt0; kt < kt1; ++kt) {
      const uint32_t mlo = folded_multiplier(__ldg(scale_lo + kt)), mhi = folded_multiplier(__ldg(scale_hi + kt));
      ptx::mbarrier_wait_parity(full + 8 * stage, phase);
      convert_tile(base + R::kW + stage * kWeightStage, warp, lane, mlo, mhi, a);
      const uint64_t desc = ptx::smem_desc_k_major_sw128(base + R::kX + stage * R::kXStage);
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < 8; ++k)
        wgmma_rs<kBlockN>(acc, a[k], ptx::smem_desc_advance(desc, (k / 4) * R::kXChunk + (k % 4) * 32));
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<0>();
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(empty + 8 * stage);
      if (++stage == R::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) ptx::wgmma_fence_operand(acc[i]);
    if (splits == 1) {
      store_block<kBlockN, kSwiGlu>(p, token0, u, g, t, acc);
      return;
    }
    const int tiles = int(gridDim.x);
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t col = int64_t((split * tiles + tile) * kBlockN + 8 * j + 2 * t + c) * p.rows;
        p.partial[col + row_lo] = acc[4 * j + c];
        p.partial[col + row_hi] = acc[4 * j + 2 + c];
      }
  }
  if (splits == 1) return;
  // Split K: the last CTA of the output block adds the splits in order.
  if (!last_split_to_arrive(p.counters + int64_t(tile) * gridDim.y + rb, splits) || warp == 4) return;
  const int tiles = int(gridDim.x);
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float lo = 0.0f, hi = 0.0f;
      for (int s = 0; s < splits; ++s) {
        const int64_t col = int64_t((s * tiles + tile) * kBlockN + 8 * j + 2 * t + c) * p.rows;
        lo += __ldcg(p.partial + col + row_lo);
        hi += __ldcg(p.partial + col + row_hi);
      }
      acc[4 * j + c] = lo;
      acc[4 * j + 2 + c] = hi;
    }
  store_block<kBlockN, kSwiGlu>(p, token0, u, g, t, acc);
}

// xp[t, 64 c + p] = x[t, 64 c + l] for the permuted column p of l.
__global__ void permute_columns_kernel(const __nv_bfloat16* x, int64_t tokens, int32_t cols, __nv_bfloat16* xp) {
  const int64_t n = tokens * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t l = int32_t(i % cols);
    xp[i - l + (l / 64) * 64 + permuted_column(l % 64)] = x[i];
  }
}

constexpr int kWidths[3] = {32, 64, 128};

template <int kBlockN, bool kSwiGlu>
void launch(const WgmmaProjection& p, const CUtensorMap& map, int splits_wanted, int sms, cudaStream_t stream) {
  using R = Ring<kBlockN>;
  const int tiles = int(ceil_div(p.tokens, kBlockN));
  const int blocks = int(ceil_div(kSwiGlu ? p.rows / 2 : p.rows, kBlockRows / (kSwiGlu ? 2 : 1)));
  // Fewer CTAs than SMs leave HBM idle: split K (the workspace holds
  // kFp8MaxSplitRows x 64 token rows of partial sums).
  int splits = splits_wanted > 0 ? splits_wanted : int64_t(tiles) * blocks < int64_t(sms) * 3 / 2 ? kMaxSplits : 1;
  splits = std::max(1, std::min({splits, kMaxSplits, p.tiles_k, int(kFp8MaxSplitRows * 64 / (tiles * kBlockN))}));
  shared_fp8_wgmma_kernel<kBlockN, kSwiGlu>
      <<<dim3(unsigned(tiles), unsigned(blocks), unsigned(splits)), kThreads, R::smem(), stream>>>(p, map);
  NVFP4_CUDA_CHECK_LAUNCH(kSwiGlu ? "shared_fp8_wgmma_kernel<gate/up>" : "shared_fp8_wgmma_kernel<down>");
}

template <bool kSwiGlu>
void launch_width(const WgmmaProjection& p, const CUtensorMap (&maps)[3], int splits, int sms, cudaStream_t stream) {
  if (p.tokens <= 32)
    launch<32, kSwiGlu>(p, maps[0], splits, sms, stream);
  else if (p.tokens <= 64)
    launch<64, kSwiGlu>(p, maps[1], splits, sms, stream);
  else
    launch<128, kSwiGlu>(p, maps[2], splits, sms, stream);
}

template <int kBlockN>
void allow_smem() {
  allow_smem_at_least(shared_fp8_wgmma_kernel<kBlockN, true>, Ring<kBlockN>::smem());
  allow_smem_at_least(shared_fp8_wgmma_kernel<kBlockN, false>, Ring<kBlockN>::smem());
}

}  // namespace

Fp8WgmmaMaps make_fp8_wgmma_maps(const __nv_bfloat16* x_perm, const __nv_bfloat16* h, int64_t max_tokens,
                                 int64_t hidden, int64_t inter) {
  NVFP4_CHECK(max_tokens > 0 && hidden % 64 == 0 && inter % 64 == 0, "make_fp8_wgmma_maps: T=", max_tokens,
              " H=", hidden, " Is=", inter, " (H and Is multiples of 64)");
  Fp8WgmmaMaps m;
  for (int i = 0; i < 3; ++i) {
    const uint32_t width = uint32_t(kWidths[i]);
    m.x[i] = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x_perm, {uint64_t(hidden), uint64_t(max_tokens)},
                             {uint64_t(hidden) * 2}, {64, width}, CU_TENSOR_MAP_SWIZZLE_128B);
    m.h[i] = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, h, {uint64_t(inter), uint64_t(max_tokens)},
                             {uint64_t(inter) * 2}, {64, width}, CU_TENSOR_MAP_SWIZZLE_128B);
  }
  m.max_tokens = max_tokens;
  allow_smem<32>();
  allow_smem<64>();
  allow_smem<128>();
  return m;
}

bool shared_fp8_wgmma_supports(const SharedFp8Args& a) {
  return a.scales_fold && a.x_perm != nullptr && a.wgmma_maps != nullptr && a.tokens <= a.wgmma_maps->max_tokens &&
         a.hidden % 64 == 0 && a.inter % 64 == 0 && a.tokens > 0 &&
         aligned_to(a.x, 16) && aligned_to(a.h, 16) && aligned_to(a.x_perm, 16) && a.tokens < (int64_t(1) << 30);
}

void shared_expert_fp8_wgmma(const SharedFp8Args& a, cudaStream_t stream) {
  NVFP4_CHECK(shared_fp8_wgmma_supports(a), "shared_expert_fp8_wgmma: unsupported T=", a.tokens, " H=", a.hidden,
              " Is=", a.inter, " (H and Is multiples of 64, power-of-two tile factors 2^-117 .. 2^7, x_perm and maps for ",
              "at least T tokens)");
  const int32_t T = int32_t(a.tokens), H = int32_t(a.hidden), Is = int32_t(a.inter);
  permute_columns_kernel<<<unsigned(std::min<int64_t>(ceil_div(a.tokens * a.hidden, 256), 132 * 16)), 256, 0,
                           stream>>>(a.x, a.tokens, H, a.x_perm);
  NVFP4_CUDA_CHECK_LAUNCH("permute_columns_kernel");
  const WgmmaProjection gate_up{.tokens = T, .K = H, .rows = 2 * Is, .tiles_k = int32_t(ceil_div(H, kTileK)),
                                .w = a.w13, .scale = a.w13_scale, .has_limit = a.has_limit, .limit = a.limit,
                                .h = a.h, .out = nullptr, .partial = a.partial, .counters = a.counters};
  launch_width<true>(gate_up, a.wgmma_maps->x, a.force_splits, a.sms, stream);
  const WgmmaProjection down{.tokens = T, .K = Is, .rows = H, .tiles_k = int32_t(ceil_div(Is, kTileK)),
                             .w = a.w2, .scale = a.w2_scale, .has_limit = false, .limit = 0.0f,
                             .h = nullptr, .out = a.out, .partial = a.partial, .counters = a.counters};
  launch_width<false>(down, a.wgmma_maps->h, a.force_splits, a.sms, stream);
}

}  // namespace nvfp4moe::cuda
