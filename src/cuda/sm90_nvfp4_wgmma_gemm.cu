// sm90_nvfp4_wgmma_gemm (see the header): kernel, launcher, heuristic.
#include <cuda_bf16.h>

#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/ptx/sm90_mbarrier_bulk.cuh"
#include "cuda/ptx/sm90_wgmma.cuh"
#include "cuda/sm90_nvfp4_tile_dequant.cuh"
#include "cuda/sm90_nvfp4_wgmma_gemm.hpp"
#include "cuda/swiglu.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kConsumerWarpgroups = 2;
constexpr int kConsumerWarps = 4 * kConsumerWarpgroups;
constexpr int kProducerThreads = 128;                // a whole warpgroup, so that it can give registers away
constexpr int kThreads = 32 * kConsumerWarps + kProducerThreads;
// NOTES: 384 threads start with 168 registers each (the register file is
// split over 4 sub-partitions); the producer warpgroup drops to 64 (no spills
// at 64, some below) so that the
// consumers can hold 2 x 64 accumulators, the A fragments and addresses.
constexpr int kProducerRegisters = 64;
constexpr int kConsumerRegisters = 216;
constexpr int kActRowBytes = kTileK * 2;             // one K step of a token row: one 128-byte swizzle row
constexpr int kMaxLocalExperts = 4096;               // bounds the scheduler's shared arrays
static_assert(kActRowBytes == 128, "a K step of BF16 operand must fill one 128-byte swizzle row");
static_assert(kTileN == 2 * 64, "a consumer warpgroup owns one tile-layout chunk: two m64 wgmma tiles");

// Shared memory of one CTA, by named offsets from a 1024-byte aligned base.
template <int kBlockN>
struct Smem {
  static_assert(kBlockN == 64 || kBlockN == 128, "kBlockN: 64 or 128 token positions per tile");
  static constexpr int kStages = kBlockN == 128 ? 6 : 8;
  static constexpr int kActStage = kBlockN * kActRowBytes;        // swizzled [kBlockN][64] BF16
  static constexpr int kWeightStage = kConsumerWarpgroups * kTileBytes;
  static constexpr int kAct = 0;
  static constexpr int kWeight = kAct + kStages * kActStage;
  static constexpr int kFull = kWeight + kStages * kWeightStage;
  static constexpr int kEmpty = kFull + 8 * kStages;
  static constexpr int kTables = kEmpty + 8 * kStages;
  static constexpr int kRows = kTables + int(sizeof(TileDequantTables));
  static constexpr int kOffsets = kRows + 4 * kBlockN;
  static size_t bytes(int64_t local) { return 1024 + size_t(kOffsets) + 8 * size_t(local + 1); }
  static_assert(kActStage % 1024 == 0, "swizzled operand stages must stay 1024-byte aligned");
  static_assert(kWeightStage % 16 == 0 && kFull % 8 == 0, "bulk copies and barriers need their alignment");
};

// One tile of work: 2 chunks (256 weight rows) x up to kBlockN positions of one expert.
struct Tile {
  int32_t expert, chunk_pair, begin, rows;
};

// Tile t of the CTA-local work list: experts in order, then chunk pairs, then
// token blocks (fastest), so CTAs running at once share weights through L2.
// prefix[e] = tiles before expert e, prefix[local] = all tiles.
template <int kBlockN>
__device__ __forceinline__ Tile tile_at(int32_t t, const int32_t* offsets, const int32_t* prefix, int32_t local) {
  int32_t lo = 0, hi = local;  // last e with prefix[e] <= t (empty experts repeat a prefix value)
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (prefix[mid] <= t) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const int32_t count = offsets[lo + 1] - offsets[lo];
  const int32_t blocks = (count + kBlockN - 1) / kBlockN;
  const int32_t rem = t - prefix[lo];
  const int32_t block = rem % blocks;
  return Tile{lo, rem / blocks, offsets[lo] + block * kBlockN, min(kBlockN, count - block * kBlockN)};
}

template <int kBlockN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kBlockN / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kBlockN == 64) {
    ptx::wgmma_m64n64k16_rs(d, a, desc);
  } else {
    ptx::wgmma_m64n128k16_rs(d, a, desc);
  }
}

// Position of a stage ring shared by the producer and the consumers.
template <int kStages>
struct RingPosition {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
};

template <Projection P, int kBlockN>
__global__ void __launch_bounds__(kThreads, 1) sm90_nvfp4_wgmma_gemm_kernel(const __grid_constant__ GroupedGemmPlan plan) {
  using S = Smem<kBlockN>;
  constexpr int kStages = S::kStages;
  constexpr int kAccPerTile = kBlockN / 2;  // FP32 accumulators per thread and m64 tile

  if (!plan_selected(plan)) return;

  // Shared memory split.
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const uint32_t act_base = ptx::smem_addr(smem + S::kAct);
  uint8_t* weight_base = smem + S::kWeight;
  const uint32_t full_bar = ptx::smem_addr(smem + S::kFull);
  const uint32_t empty_bar = ptx::smem_addr(smem + S::kEmpty);
  TileDequantTables& tables = *reinterpret_cast<TileDequantTables*>(smem + S::kTables);
  int32_t* tile_rows = reinterpret_cast<int32_t*>(smem + S::kRows);
  const int32_t local = int32_t(plan.local_experts);
  int32_t* offsets = reinterpret_cast<int32_t*>(smem + S::kOffsets);
  int32_t* prefix = offsets + local + 1;

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t n_chunks = plan.geometry.n_tiles, k_steps = plan.geometry.k_steps;
  const int32_t chunk_pairs = int32_t((n_chunks + 1) / 2);

  // Tables, the group starts, the work list's prefix over experts (warp 0), barriers (thread 0).
  fill_tile_dequant_tables(tables, tid, kThreads);
  for (int e = tid; e <= local; e += kThreads) offsets[e] = plan.offsets[e];
  __syncthreads();
  if (warp == 0) {
    int32_t carry = 0;
    if (lane == 0) prefix[0] = 0;
    for (int32_t base = 0; base < local; base += 32) {
      const int32_t e = base + lane;
      int32_t v = e < local ? (offsets[e + 1] - offsets[e] + kBlockN - 1) / kBlockN * chunk_pairs : 0;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int32_t o = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += o;
      }
      if (e < local) prefix[e + 1] = carry + v;
      carry += __shfl_sync(0xffffffffu, v, 31);
    }
  }
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(full_bar + 8 * s, kProducerThreads + 1);  // every producer thread's cp.async + expect_tx
      ptx::mbarrier_init(empty_bar + 8 * s, kConsumerWarps);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  const int32_t total = prefix[local];

  if (warp >= kConsumerWarps) {
    // ---- producer: weights by bulk copy, operand rows gathered by cp.async ----
    ptx::setmaxnreg_dec<kProducerRegisters>();
    const int ptid = tid - 32 * kConsumerWarps;
    RingPosition<kStages> ring;
    for (int32_t t = blockIdx.x; t < total; t += gridDim.x) {
      const Tile tile = tile_at<kBlockN>(t, offsets, prefix, local);
      ptx::named_barrier_sync(1, kProducerThreads);  // the previous tile's copies were issued: rows may change
      for (int r = ptid; r < tile.rows; r += kProducerThreads)
        tile_rows[r] = P == Projection::GateUp ? plan.pair_of_pos[tile.begin + r] / plan.top_k : tile.begin + r;
      ptx::named_barrier_sync(1, kProducerThreads);
      const int64_t chunk0 = int64_t(tile.expert) * n_chunks + 2 * tile.chunk_pair;
      const int live_chunks = n_chunks - 2 * int64_t(tile.chunk_pair) >= 2 ? 2 : 1;
      for (int64_t ks = 0; ks < k_steps; ++ks, ring.advance()) {
        const uint32_t full = full_bar + 8 * ring.stage;
        ptx::mbarrier_wait_parity(empty_bar + 8 * ring.stage, ring.phase ^ 1);
        if (ptid == 0) {
          ptx::mbarrier_arrive_expect_tx(full, uint32_t(live_chunks * kTileBytes));
          for (int c = 0; c < live_chunks; ++c)
            ptx::cp_async_bulk_g2s(ptx::smem_addr(weight_base + ring.stage * S::kWeightStage + c * kTileBytes),
                                   plan.weights + ((chunk0 + c) * k_steps + ks) * kTileBytes, kTileBytes, full);
        }
        // Row r, 16-byte chunk q lands at chunk q ^ (r % 8) of its 128-byte row (the 128B swizzle).
        const uint32_t act_stage = act_base + ring.stage * S::kActStage;
        for (int i = ptid; i < tile.rows * 8; i += kProducerThreads) {
          const int r = i / 8, q = i % 8;
          ptx::cp_async_16_shared(act_stage + r * kActRowBytes + ((q ^ (r % 8)) * 16),
                                  plan.act + int64_t(tile_rows[r]) * plan.ld_act + ks * kTileK + q * 8);
        }
        ptx::cp_async_mbarrier_arrive_noinc(full);
      }
    }
    ptx::cp_async_wait<0>();
    return;
  }

  // ---- consumers: warpgroup wg owns chunk 2 * chunk_pair + wg of each tile ----
  ptx::setmaxnreg_inc<kConsumerRegisters>();
  const int wg = warp / 4, wwarp = warp % 4, grp = lane / 4, tig = lane % 4;
  RingPosition<kStages> ring;
  for (int32_t t = blockIdx.x; t < total; t += gridDim.x) {
    const Tile tile = tile_at<kBlockN>(t, offsets, prefix, local);
    const int64_t chunk = 2 * int64_t(tile.chunk_pair) + wg;
    const bool live = chunk < n_chunks;  // warpgroup-uniform

    float acc[2][kAccPerTile];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < kAccPerTile; ++i) {
        acc[j][i] = 0.0f;
        ptx::wgmma_fence_operand(acc[j][i]);
      }

    for (int64_t ks = 0; ks < k_steps; ++ks, ring.advance()) {
      ptx::mbarrier_wait_parity(full_bar + 8 * ring.stage, ring.phase);
      if (live) {
        ptx::fence_proxy_async_shared();  // the gathered rows (cp.async) -> wgmma's reads
        const uint8_t* w = weight_base + ring.stage * S::kWeightStage + wg * kTileBytes;
        uint32_t a[2][kTileK / 16][4];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int kk = 0; kk < kTileK / 16; ++kk) dequant_tile_fragment(w, 64 * j + 16 * wwarp + grp, kk, tig, tables, a[j][kk]);
        const uint32_t act_stage = act_base + ring.stage * S::kActStage;
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kTileK / 16; ++kk)
#pragma unroll
          for (int j = 0; j < 2; ++j) wgmma_rs<kBlockN>(acc[j], a[j][kk], ptx::smem_desc_k_major_sw128(act_stage + kk * 32));
        ptx::wgmma_commit_group();
        ptx::wgmma_wait_group<0>();
      }
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(empty_bar + 8 * ring.stage);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < kAccPerTile; ++i) ptx::wgmma_fence_operand(acc[j][i]);
    if (!live) continue;

    // ---- epilogue: accumulator (j, 8 n + 2 tig + c) rows 64 j + 16 wwarp + grp (+ 8) ----
    if constexpr (P == Projection::GateUp) {
      const float gw_gate = plan.w_global[tile.expert * 2], gw_up = plan.w_global[tile.expert * 2 + 1];
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = 8 * n + 2 * tig + c;
          if (col >= tile.rows) continue;
          const int32_t pos = tile.begin + col;
          const float g = plan.act_g[plan.pair_of_pos[pos] / plan.top_k];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int64_t i = chunk * (kTileN / 2) + (4 * j + wwarp) * 8 + grp;
            if (i >= plan.n_valid) continue;
            const float gate = acc[j][4 * n + c] * (g * gw_gate);
            const float up = acc[j][4 * n + 2 + c] * (g * gw_up);
            plan.h_out[int64_t(pos) * plan.ld_h + i] = swiglu_limited(gate, up, plan.has_limit, plan.limit);
          }
        }
    } else {
      const float gw = plan.w_global[tile.expert];
#pragma unroll
      for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = 8 * n + 2 * tig + c;
          if (col >= tile.rows) continue;
          const int32_t pos = tile.begin + col;
          const int32_t pair = plan.pair_of_pos[pos];
          const float alpha = plan.act_g[pos] * gw, wj = plan.topk_weights[pair];
          float* yrow = plan.y_pair + int64_t(pair) * plan.n_valid;
#pragma unroll
          for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int64_t row = chunk * kTileN + 64 * j + 16 * wwarp + 8 * half + grp;
              if (row < plan.n_valid) yrow[row] = acc[j][4 * n + 2 * half + c] * alpha * wj;
            }
        }
    }
  }
}

template <Projection P, int kBlockN>
void launch(const GroupedGemmPlan& p, int grid_hint, cudaStream_t stream) {
  auto kernel = sm90_nvfp4_wgmma_gemm_kernel<P, kBlockN>;
  const size_t smem = Smem<kBlockN>::bytes(p.local_experts);
  int device = 0, sms = 0;
  NVFP4_CUDA_CHECK(cudaGetDevice(&device));
  NVFP4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int grid = grid_hint > 0 ? grid_hint : sms;  // persistent: surplus CTAs find no tile
  kernel<<<unsigned(grid), kThreads, smem, stream>>>(p);
  NVFP4_CUDA_CHECK_LAUNCH("sm90_nvfp4_wgmma_gemm_kernel");
}

template <int kBlockN>
void prepare(int64_t local) {
  const int smem = int(Smem<kBlockN>::bytes(local));
  NVFP4_CUDA_CHECK(cudaFuncSetAttribute(sm90_nvfp4_wgmma_gemm_kernel<Projection::GateUp, kBlockN>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  NVFP4_CUDA_CHECK(cudaFuncSetAttribute(sm90_nvfp4_wgmma_gemm_kernel<Projection::Down, kBlockN>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

template <Projection P>
void dispatch(const GroupedGemmPlan& p, const Sm90WgmmaGemmConfig& cfg, cudaStream_t stream) {
  if (cfg.block_n == 64) return launch<P, 64>(p, cfg.grid, stream);
  if (cfg.block_n == 128) return launch<P, 128>(p, cfg.grid, stream);
  NVFP4_FAIL("sm90_nvfp4_wgmma_gemm: no kernel for block_n=", cfg.block_n, " (have 64, 128)");
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Sm90WgmmaGemmConfig& c) {
  return os << "Sm90WgmmaGemmConfig{block_n=" << c.block_n << ", grid=" << c.grid << "}";
}

size_t sm90_nvfp4_wgmma_gemm_smem_bytes(int block_n, int64_t local_experts) {
  return block_n == 64 ? Smem<64>::bytes(local_experts) : Smem<128>::bytes(local_experts);
}

void sm90_nvfp4_wgmma_gemm_prepare(int64_t local_experts) {
  NVFP4_CHECK(local_experts >= 1 && local_experts <= kMaxLocalExperts, "sm90_nvfp4_wgmma_gemm: local_experts=",
              local_experts, " outside [1, ", kMaxLocalExperts, "]");
  prepare<64>(local_experts);
  prepare<128>(local_experts);
}

void sm90_nvfp4_wgmma_gemm(const GroupedGemmPlan& p, const Sm90WgmmaGemmConfig& cfg, cudaStream_t stream) {
  NVFP4_CHECK(p.geometry.n_tiles > 0 && p.geometry.k_steps > 0, "sm90_nvfp4_wgmma_gemm: empty geometry n_tiles=",
              p.geometry.n_tiles, " k_steps=", p.geometry.k_steps);
  NVFP4_CHECK(p.ld_act >= p.geometry.k_steps * kTileK && p.ld_act % 8 == 0, "sm90_nvfp4_wgmma_gemm: operand row stride ",
              p.ld_act, " must be a multiple of 8 and >= K padded ", p.geometry.k_steps * kTileK);
  NVFP4_CHECK(p.offsets && p.local_experts >= 1 && p.local_experts <= kMaxLocalExperts,
              "sm90_nvfp4_wgmma_gemm: needs plan.offsets and 1 <= local_experts <= ", kMaxLocalExperts, ", got ",
              p.local_experts, p.offsets ? "" : " (offsets null)");
  NVFP4_CHECK(p.weights && p.act && p.act_g && p.pair_of_pos && p.w_global,
              "sm90_nvfp4_wgmma_gemm: plan is missing an operand (weights, act, act_g, pair_of_pos, w_global)");
  NVFP4_CHECK((reinterpret_cast<uintptr_t>(p.act) % 16) == 0 && (reinterpret_cast<uintptr_t>(p.weights) % 16) == 0,
              "sm90_nvfp4_wgmma_gemm: act and weights must be 16-byte aligned");
  if (p.projection == Projection::GateUp) {
    NVFP4_CHECK(p.h_out && p.ld_h >= p.n_valid, "sm90_nvfp4_wgmma_gemm (gate/up): h output missing or ld_h ", p.ld_h,
                " < I=", p.n_valid);
    NVFP4_CHECK(p.top_k > 0, "sm90_nvfp4_wgmma_gemm (gate/up): top_k must be positive, got ", p.top_k);
    dispatch<Projection::GateUp>(p, cfg, stream);
  } else {
    NVFP4_CHECK(p.y_pair && p.topk_weights, "sm90_nvfp4_wgmma_gemm (down): y_pair and topk_weights are required");
    dispatch<Projection::Down>(p, cfg, stream);
  }
}

}  // namespace nvfp4moe::cuda
