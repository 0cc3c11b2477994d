// sm90_nvfp4_prefill_gemm (see the header): kernel and launcher. Which kernel runs
// for a forward is decided in expert_gemm.cpp.
#include <cuda_bf16.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda/cuda_check.hpp"
#include "cuda/dependent_launch.hpp"
#include "cuda/kernels/fragment_dequant.cuh"
#include "cuda/kernels/sm90_nvfp4_prefill_gemm.hpp"
#include "cuda/kernels/swiglu.cuh"
#include "cuda/kernels/warp_scan.cuh"
#include "cuda/layout/fp8_operand.hpp"
#include "cuda/layout/tensor_map.hpp"
#include "cuda/ptx/sm90_griddep.cuh"
#include "cuda/ptx/sm90_mbarrier.cuh"
#include "cuda/ptx/sm90_tma.cuh"
#include "cuda/ptx/sm90_wgmma.cuh"
#include "cuda/ptx/sm90_wgmma_fp8.cuh"

namespace nvfp4moe::cuda {

namespace {

// Consumer warpgroups by width: three up to 64 positions, two above. NOTES:
// at narrow widths the consumers' conversion, not the tensor cores, bounds a
// stage (~2 instructions a weight), and a third warpgroup's warps hide its
// chains (one H200 run, GEMMs us, two / three: 32 wide EP1 T=512 5455 /
// 4725, EP8 T=64 656 / 575; 64 wide EP8 T=2048 3679 / 3169); from 96
// positions the accumulators of three do not fit the registers (spills).
template <int kBlockN>
constexpr int kConsumerWarpgroups = kBlockN <= 64 ? 3 : 2;
template <int kBlockN>
constexpr int kConsumerWarps = 4 * kConsumerWarpgroups<kBlockN>;
constexpr int kProducerThreads = 128;  // a whole warpgroup, so that it can give registers away
template <int kBlockN>
constexpr int kThreads = 32 * kConsumerWarps<kBlockN> + kProducerThreads;
// NOTES: the register file is split over 4 sub-partitions, and a launch of
// 384 (512) threads starts each with 168 (128) registers; the producer
// warpgroup drops to 80 (it spills at 72) so that two consumer warpgroups can
// hold 2 x 64 accumulators, two 16-register A buffers, addresses and the
// SwiGLU epilogue in 200, and three at up to 64 positions 2 x 32 of them in
// 144 (no spills at any width).
constexpr int kProducerRegisters = 80;
template <int kBlockN>
constexpr int kConsumerRegisters = kConsumerWarpgroups<kBlockN> == 3 ? 144 : 200;
// setmaxnreg.inc takes registers only from what the CTA's setmaxnreg.dec gave
// back (SASS: USETMAXREG.TRY_ALLOC.CTAPOOL); a consumer warp asking for more
// waits forever (216 hung the GPU tests). The launch gives every thread
// 65536 / kThreads registers, in steps of 8.
template <int kBlockN>
constexpr int kLaunchRegisters = 65536 / kThreads<kBlockN> / 8 * 8;
template <int kBlockN>
constexpr bool kRegistersBalance =
    kConsumerWarps<kBlockN> * 32 * (kConsumerRegisters<kBlockN> - kLaunchRegisters<kBlockN>) <=
    kProducerThreads * (kLaunchRegisters<kBlockN> - kProducerRegisters);
constexpr int kStageChunks = kMmaScaleChunks;  // K per stage: one scale word of every lane
constexpr int kStageK = kStageChunks * kMmaChunkK;
constexpr int kScaleWordBytes = 32 * 4;                      // one m-tile x kStageChunks chunks (at most: MXFP4 half)
constexpr int kActAtomBytes = 128;                           // one swizzle row: 64 BF16 or 128 E4M3 values
constexpr int kMaxLocalExperts = 2048;                       // bounds the scheduler's shared arrays (fits 227 KB)
static_assert(kMmaChunkK * 2 == kActAtomBytes, "a chunk of BF16 operand must fill one 128-byte swizzle row");
static_assert(kStageK == kActAtomBytes && kStageK == kFp8OperandBlock,
              "a stage of FP8 operand must fill one swizzle row and hold one operand scale");

// The shape of the two forms (Operand): m64 wgmma tiles per consumer
// warpgroup (BF16: two, whose accumulators fill the registers; FP8: one, its
// partial sums over a stage take the other half), and the 128-byte swizzle
// rows of one operand row per stage (BF16: one per chunk; FP8: one).
template <Operand O>
constexpr int kM64PerWarpgroup = O == Operand::Bf16 ? 2 : 1;
template <Operand O, int kBlockN>
constexpr int kMTilesPerCta = kConsumerWarpgroups<kBlockN> * 4 * kM64PerWarpgroup<O>;
template <Operand O>
constexpr int kActRowsPerStage = O == Operand::Bf16 ? kStageChunks : 1;

// Shared memory of one CTA, by named offsets from a 1024-byte aligned base.
template <Operand O, int kBlockN>
struct Smem {
  static_assert(kBlockN % 32 == 0 && kBlockN >= 32 && kBlockN <= 128, "kBlockN: 32, 64, 96 or 128");
  static_assert(kRegistersBalance<kBlockN>,
                "the consumers' extra registers must all come from the producer warpgroup's");
  static constexpr int kMTiles = kMTilesPerCta<O, kBlockN>;
  static constexpr int kActChunk = kBlockN * kActAtomBytes;  // swizzled [kBlockN][128 bytes]: one operand box
  static constexpr int kActStage = kActRowsPerStage<O> * kActChunk;
  static constexpr int kCodeStage = kMTiles * kStageChunks * kFragBytes;
  static constexpr int kScaleStage = kMTiles * kScaleWordBytes;
  static constexpr int kActScaleStage = O == Operand::Fp8 ? kBlockN * 4 : 0;  // FP8: the positions' operand scales
  // As many stages as fit ~205 KB (kMaxLocalExperts' scheduler arrays take the rest), at most 8:
  // BF16 4, 4, 4, 5 at 128, 96, 64, 32 (the narrow two with three consumer
  // warpgroups); FP8 8 at every width.
  static constexpr int kStageBytes = kActStage + kCodeStage + kScaleStage + kActScaleStage;
  static constexpr int kStages = 205 * 1024 / kStageBytes < 8 ? 205 * 1024 / kStageBytes : 8;
  static constexpr int kAct = 0;
  static constexpr int kCode = kAct + kStages * kActStage;
  static constexpr int kScale = kCode + kStages * kCodeStage;
  static constexpr int kActScale = kScale + kStages * kScaleStage;
  static constexpr int kFull = kActScale + kStages * kActScaleStage;
  static constexpr int kEmpty = kFull + 8 * kStages;
  // Per-position epilogue operands of a tile, in a ring of 2 tiles: written
  // by the producer when it starts the tile, read by the consumers' epilogue.
  static constexpr int kMetaSlots = 2;
  static constexpr int kMetaFull = kEmpty + 8 * kStages;
  static constexpr int kMetaEmpty = kMetaFull + 8 * kMetaSlots;
  static constexpr int kMeta = kMetaEmpty + 8 * kMetaSlots;  // ColumnMeta [kMetaSlots][kBlockN]
  static constexpr int kRows = kMeta + kMetaSlots * kBlockN * 12;
  static constexpr int kOffsets = kRows + 4 * kBlockN;
  static size_t bytes(int64_t local) { return 1024 + size_t(kOffsets) + 8 * size_t(local + 1); }
  static_assert(kActChunk % 1024 == 0, "swizzled operand chunks must stay 1024-byte aligned");
  static_assert(kCodeStage % 16 == 0 && kScaleStage % 16 == 0 && kFull % 8 == 0, "copies and barriers need alignment");
};

// What the epilogue needs of one position: g of its operand row, its pair
// and routing weight (Down).
struct ColumnMeta {
  float g;
  int32_t pair;
  float wj;
};
static_assert(sizeof(ColumnMeta) == 12, "ColumnMeta is 3 words");

// The TMA copies of a stage: the m-tiles' code runs and scale words, and for
// Down (whose operand rows are the tile's consecutive positions) the operand
// chunks. GateUp's operand rows are tokens gathered by pair, so its producer
// copies them with cp.async.
struct WgmmaMaps {
  CUtensorMap codes;   // u32 [experts][m_tiles][k_chunks * 128], box [1][mt][256]: one stage of the CTA's mt m-tiles
  CUtensorMap scales;  // u32 [experts][m_tiles][k_stages * scale_lanes], box [1][mt][scale_lanes]
  CUtensorMap act;     // BF16 [act_rows][K] box [block_n][64], or E4M3 [act_rows][K] box [block_n][128];
                       // 128-byte swizzle (Down only)
};

// One tile of work: up to 16 m-tiles x up to kBlockN positions of one expert.
struct Tile {
  int32_t expert, m_block, begin, rows;
};

// The token blocks of an expert with `rows` rows that a launch covers
// (TokenBlocks), and where block b starts.
template <int kBlockN>
__device__ __forceinline__ int32_t token_blocks(int32_t rows, TokenBlocks mode) {
  if (mode == TokenBlocks::All) return (rows + kBlockN - 1) / kBlockN;
  const int32_t last = rows % 128;
  const int32_t tail = last != 0 && wgmma_tile_width(last) == kBlockN ? 1 : 0;
  return (kBlockN == 128 ? rows / 128 : 0) + tail;
}
template <int kBlockN>
__device__ __forceinline__ int32_t token_block_begin(int32_t rows, int32_t block, TokenBlocks mode) {
  if (mode == TokenBlocks::All) return block * kBlockN;
  return (kBlockN == 128 ? block : rows / 128) * 128;  // Split: full blocks, then the last one
}

// Tile t of the CTA-local work list: experts in order, then m-blocks, then
// token blocks (fastest), so CTAs running at once share weights through L2.
// prefix[e] = tiles before expert e, prefix[local] = all tiles.
template <int kBlockN>
__device__ __forceinline__ Tile tile_at(int32_t t, const int32_t* offsets, const int32_t* prefix, int32_t local,
                                        TokenBlocks mode) {
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
  const int32_t blocks = token_blocks<kBlockN>(count, mode);
  const int32_t rem = t - prefix[lo];
  const int32_t begin = token_block_begin<kBlockN>(count, rem % blocks, mode);
  return Tile{lo, rem / blocks, offsets[lo] + begin, min(kBlockN, count - begin)};
}

template <int kBlockN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kBlockN / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kBlockN == 32) {
    ptx::wgmma_m64n32k16_rs(d, a, desc);
  } else if constexpr (kBlockN == 64) {
    ptx::wgmma_m64n64k16_rs(d, a, desc);
  } else if constexpr (kBlockN == 96) {
    ptx::wgmma_m64n96k16_rs(d, a, desc);
  } else {
    ptx::wgmma_m64n128k16_rs(d, a, desc);
  }
}

template <int kBlockN>
__device__ __forceinline__ void wgmma_fp8_rs(float (&d)[kBlockN / 2], const uint32_t (&a)[4], uint64_t desc,
                                             bool accumulate) {
  if constexpr (kBlockN == 32) {
    ptx::wgmma_m64n32k32_e4m3_rs(d, a, desc, accumulate);
  } else if constexpr (kBlockN == 64) {
    ptx::wgmma_m64n64k32_e4m3_rs(d, a, desc, accumulate);
  } else if constexpr (kBlockN == 96) {
    ptx::wgmma_m64n96k32_e4m3_rs(d, a, desc, accumulate);
  } else {
    ptx::wgmma_m64n128k32_e4m3_rs(d, a, desc, accumulate);
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

// Epilogue of one consumer warpgroup: accumulator (j, 8 n + 2 tig + c) is
// m-tile mt_wg + 4 j + wwarp, rows grp (gate / down row) and grp + 8 (up /
// down row + 8), position column 8 n + 2 tig + c; f[j] the FP32 factors of
// those two rows (the weights' g_w and the form's power of two).
template <Projection P, int kM64, int kBlockN>
__device__ __forceinline__ void store_tile(const GroupedGemmPlan& plan, const Tile& tile, const ColumnMeta* meta,
                                           int64_t mt_wg, int64_t m_tiles, int wwarp, int lane,
                                           const float (&acc)[kM64][kBlockN / 2], const float (&f)[kM64][2]) {
  const int tig = lane % 4, grp = lane / 4;
#pragma unroll
  for (int n = 0; n < kBlockN / 8; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int col = 8 * n + 2 * tig + c;
      if (col >= tile.rows) continue;
      const ColumnMeta& cm = meta[col];
      PairRow y{};
      if constexpr (P == Projection::Down) y = pair_row(plan.y_pair, cm.pair, plan.n_valid);
#pragma unroll
      for (int j = 0; j < kM64; ++j) {
        const int64_t mt = mt_wg + 4 * j + wwarp;
        if (mt >= m_tiles) continue;
        const float lo = acc[j][4 * n + c], hi = acc[j][4 * n + 2 + c];  // rows grp, grp + 8
        if constexpr (P == Projection::GateUp) {
          const float gate = lo * (cm.g * f[j][0]);
          const float up = hi * (cm.g * f[j][1]);
          plan.h_out[int64_t(tile.begin + col) * plan.ld_h + mt * 8 + grp] =
              swiglu_limited(gate, up, plan.has_limit, plan.limit);
        } else {
          y.store(mt * kMmaTileRows + grp, lo * (cm.g * f[j][0]) * cm.wj);
          y.store(mt * kMmaTileRows + grp + 8, hi * (cm.g * f[j][1]) * cm.wj);
        }
      }
    }
}

// The CTA's view of its shared memory, carved once from a 1024-byte aligned
// base (Smem's named offsets), and of its work list.
template <Projection P, Operand O, int kBlockN>
struct Cta {
  using S = Smem<O, kBlockN>;
  static constexpr int kStages = S::kStages;
  static constexpr int kAccPerTile = kBlockN / 2;  // FP32 accumulators per thread and m64 tile
  static constexpr bool kGather = P == Projection::GateUp;  // operand rows by cp.async, else by TMA
  // A stage is full once the TMA bytes have landed (one expect_tx arrival)
  // and, when gathering or copying FP8 operand scales, every producer thread's cp.async.
  static constexpr bool kCpAsync = kGather || O == Operand::Fp8;
  static constexpr int kFullArrivals = 1 + (kCpAsync ? kProducerThreads : 0);
  // The TMA bytes of a stage: its scale box is one word a lane (NVFP4) or
  // per lane pair (MXFP4) of each m-tile (fragment_layout.hpp).
  static constexpr uint32_t tma_bytes(int scale_lanes) {
    return uint32_t(S::kCodeStage + S::kMTiles * scale_lanes * 4 + (kGather ? 0 : S::kActStage));
  }

  uint32_t act_base, code_base, scale_base;  // the stage rings (shared-window addresses)
  uint32_t act_scale_base;                   // FP8: the positions' operand scales of each stage
  uint64_t act_desc0;                        // wgmma descriptor of operand stage 0
  uint32_t full_bar, empty_bar;              // [kStages] each
  uint32_t meta_full_bar, meta_empty_bar;    // [kMetaSlots] each
  ColumnMeta* meta;                          // [kMetaSlots][kBlockN] epilogue operands of a tile
  int32_t* tile_rows;                        // [kBlockN] operand row of each position of a tile
  int32_t* offsets;                          // [local + 1] group starts
  int32_t* prefix;                           // [local + 1] tiles before each expert
  int32_t local = 0, total = 0;              // local experts; tiles of this launch
  int64_t m_tiles = 0, k_stages = 0;
  int32_t scale_lanes = 32;                  // scale words per m-tile and stage

  __device__ Tile tile(int32_t t, TokenBlocks mode) const { return tile_at<kBlockN>(t, offsets, prefix, local, mode); }
};

// Shared memory carved, the group starts copied, the work list's prefix over
// experts built (warp 0), the barriers initialised (thread 0).
template <Projection P, Operand O, int kBlockN>
__device__ __forceinline__ Cta<P, O, kBlockN> setup_cta(const GroupedGemmPlan& plan, const FragmentWeights& w,
                                                        TokenBlocks mode, int tid, int warp, int lane) {
  using C = Cta<P, O, kBlockN>;
  using S = typename C::S;
  extern __shared__ uint8_t smem_raw[];
  // Offsetting smem_raw itself (no round trip through an integer) keeps the
  // compiler aware that every pointer below is shared: LDS/STS, not generic
  // loads on the long-scoreboard path.
  uint8_t* smem = smem_raw + ((1024 - (ptx::smem_addr(smem_raw) & 1023)) & 1023);
  C c;
  c.act_base = ptx::smem_addr(smem + S::kAct);
  c.act_desc0 = ptx::smem_desc_k_major_sw128(c.act_base);
  c.code_base = ptx::smem_addr(smem + S::kCode);
  c.scale_base = ptx::smem_addr(smem + S::kScale);
  c.act_scale_base = ptx::smem_addr(smem + S::kActScale);
  c.full_bar = ptx::smem_addr(smem + S::kFull);
  c.empty_bar = ptx::smem_addr(smem + S::kEmpty);
  c.meta_full_bar = ptx::smem_addr(smem + S::kMetaFull);
  c.meta_empty_bar = ptx::smem_addr(smem + S::kMetaEmpty);
  c.meta = reinterpret_cast<ColumnMeta*>(smem + S::kMeta);
  c.tile_rows = reinterpret_cast<int32_t*>(smem + S::kRows);
  c.local = int32_t(plan.local_experts);
  c.offsets = reinterpret_cast<int32_t*>(smem + S::kOffsets);
  c.prefix = c.offsets + c.local + 1;
  c.m_tiles = w.geometry.m_tiles;
  c.scale_lanes = w.geometry.scale_lanes;
  c.k_stages = w.geometry.k_chunks / kStageChunks;
  const int32_t m_blocks = int32_t((c.m_tiles + S::kMTiles - 1) / S::kMTiles);

  for (int e = tid; e <= c.local; e += kThreads<kBlockN>) c.offsets[e] = plan.offsets[e];
  __syncthreads();
  if (warp == 0) {
    int32_t carry = 0;
    if (lane == 0) c.prefix[0] = 0;
    for (int32_t base = 0; base < c.local; base += 32) {
      const int32_t e = base + lane;
      const int32_t v =
          warp_inclusive_sum(e < c.local ? token_blocks<kBlockN>(c.offsets[e + 1] - c.offsets[e], mode) * m_blocks : 0);
      if (e < c.local) c.prefix[e + 1] = carry + v;
      carry += __shfl_sync(0xffffffffu, v, 31);
    }
  }
  if (tid == 0) {
    for (int s = 0; s < C::kStages; ++s) {
      ptx::mbarrier_init(c.full_bar + 8 * s, C::kFullArrivals);
      ptx::mbarrier_init(c.empty_bar + 8 * s, kConsumerWarps<kBlockN>);
    }
    for (int s = 0; s < S::kMetaSlots; ++s) {
      ptx::mbarrier_init(c.meta_full_bar + 8 * s, kProducerThreads);
      ptx::mbarrier_init(c.meta_empty_bar + 8 * s, kConsumerWarps<kBlockN>);
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  c.total = c.prefix[c.local];
  return c;
}

// Producer, per tile: the operand row (for the gather) and the epilogue
// operands (for the consumers) of each position, into the tile's meta slot.
template <Projection P, Operand O, int kBlockN>
__device__ __forceinline__ void produce_tile_meta(const GroupedGemmPlan& plan, const Cta<P, O, kBlockN>& c,
                                                  const Tile& tile,
                                                  const RingPosition<Smem<O, kBlockN>::kMetaSlots>& slot, int ptid) {
  ColumnMeta* tile_meta = c.meta + slot.stage * kBlockN;
  ptx::mbarrier_wait_parity(c.meta_empty_bar + 8 * slot.stage, slot.phase ^ 1);
  ptx::named_barrier_sync(1, kProducerThreads);  // the previous tile's copies were issued: rows may change
  for (int r = ptid; r < tile.rows; r += kProducerThreads) {
    const int32_t pos = tile.begin + r, pair = plan.pair_of_pos[pos];
    const int32_t row = P == Projection::GateUp ? pair / plan.top_k : pos;
    c.tile_rows[r] = row;
    tile_meta[r] = ColumnMeta{plan.act_g[row], pair, P == Projection::Down ? plan.topk_weights[pair] : 0.0f};
  }
  ptx::mbarrier_arrive(c.meta_full_bar + 8 * slot.stage);
  ptx::named_barrier_sync(1, kProducerThreads);
}

// A producer thread's cp.async sources for one tile, found once per tile
// (the row lookups and 64-bit products then stay out of the stage loop):
// GateUp gathers rows ptid / 8 + 16 j, 16 bytes (unit ptid % 8) of each
// per swizzle row, held as 16-byte units from the operand's base so that 32
// bits suffice; the FP8 form copies position ptid's operand scales.
template <Projection P, Operand O, int kBlockN>
struct ProducerSources {
  static constexpr int kUnitsPerRow = kActAtomBytes / 16, kRowsPerPass = kProducerThreads / kUnitsPerRow;
  static constexpr int kRows = kBlockN / kRowsPerPass;
  uint32_t unit16[kRows];
  int32_t rows = 0;                    // of this thread's rows, how many the tile has
  const float* scale = nullptr;        // FP8: position ptid's scale row, or null past the tile
};

template <Projection P, Operand O, int kBlockN>
__device__ __forceinline__ ProducerSources<P, O, kBlockN> producer_sources(const GroupedGemmPlan& plan,
                                                                            const Cta<P, O, kBlockN>& c,
                                                                            const Tile& tile, int ptid) {
  using Src = ProducerSources<P, O, kBlockN>;
  Src src;
  if constexpr (P == Projection::GateUp) {
    const int64_t row_units = plan.ld_act * (O == Operand::Bf16 ? 2 : 1) / 16;  // ld_act % 16 == 0 (check_plan)
    const int first = ptid / Src::kUnitsPerRow, unit = ptid % Src::kUnitsPerRow;
    src.rows = tile.rows > first ? (tile.rows - first + Src::kRowsPerPass - 1) / Src::kRowsPerPass : 0;
#pragma unroll
    for (int j = 0; j < Src::kRows; ++j)
      src.unit16[j] = j < src.rows ? uint32_t(int64_t(c.tile_rows[first + j * Src::kRowsPerPass]) * row_units + unit) : 0u;
  }
  if constexpr (O == Operand::Fp8)
    if (ptid < tile.rows) src.scale = plan.act_scale + int64_t(c.tile_rows[ptid]) * plan.ld_act_scale;
  return src;
}

// Producer, per stage: the m-tiles' code runs and scale words (and Down's
// operand rows) by TMA from one thread; GateUp's operand rows, gathered
// by pair, and the FP8 form's operand scales by every thread's cp.async.
template <Projection P, Operand O, int kBlockN>
__device__ __forceinline__ void produce_stage(const GroupedGemmPlan& plan, const WgmmaMaps& maps,
                                              const Cta<P, O, kBlockN>& c, const Tile& tile,
                                              const ProducerSources<P, O, kBlockN>& src, int64_t ks,
                                              const RingPosition<Smem<O, kBlockN>::kStages>& ring, int ptid) {
  using C = Cta<P, O, kBlockN>;
  using S = typename C::S;
  const uint32_t full = c.full_bar + 8 * ring.stage;
  ptx::mbarrier_wait_parity(c.empty_bar + 8 * ring.stage, ring.phase ^ 1);
  if (ptid == 0) {
    // NOTES: one TMA box per stage for the codes (16 KB) and one for the
    // scales: 1 KB bulk copies per m-tile were slower than cp.async, and
    // cp.async's loads alone reached ~44 GB/s per SM. Rows past the expert's
    // last m-tile read as zero and are never stored.
    const int64_t mt0 = int64_t(tile.m_block) * S::kMTiles;
    ptx::mbarrier_arrive_expect_tx(full, C::tma_bytes(c.scale_lanes));
    ptx::tma_load_3d(c.code_base + ring.stage * S::kCodeStage, &maps.codes, full,
                     int32_t(ks * (kStageChunks * kFragBytes / 4)), int32_t(mt0), tile.expert);
    ptx::tma_load_3d(c.scale_base + ring.stage * S::kScaleStage, &maps.scales, full,
                     int32_t(ks * c.scale_lanes), int32_t(mt0), tile.expert);
    if constexpr (!C::kGather) {  // positions tile.begin.. (columns past tile.rows are never stored)
#pragma unroll
      for (int ch = 0; ch < kActRowsPerStage<O>; ++ch)
        ptx::tma_load_2d(c.act_base + ring.stage * S::kActStage + ch * S::kActChunk, &maps.act, full,
                         int32_t(ks * kStageK + ch * kMmaChunkK), tile.begin);
    }
  }
  if constexpr (O == Operand::Fp8) {  // the stage's operand scale of position ptid (kBlockN <= 128 threads)
    if (src.scale) ptx::cp_async_4_shared(c.act_scale_base + ring.stage * S::kActScaleStage + ptid * 4, src.scale + ks);
  }
  if constexpr (C::kGather) {
    // Operand rows (already in k-slot order, operand_order.hpp): 16-byte
    // units into the 128B swizzle (unit ^ row % 8, the same for all of this
    // thread's rows ptid / 8 + 16 j).
    using Src = ProducerSources<P, O, kBlockN>;
    const int first = ptid / Src::kUnitsPerRow, unit = ptid % Src::kUnitsPerRow;
    const uint32_t dst = c.act_base + ring.stage * S::kActStage + first * kActAtomBytes + ((unit ^ (first % 8)) * 16);
    const uint8_t* base = O == Operand::Bf16 ? reinterpret_cast<const uint8_t*>(plan.act) : plan.act_fp8;
    const uint32_t stage_units = uint32_t(ks) * (kStageK * (O == Operand::Bf16 ? 2 : 1) / 16);
#pragma unroll
    for (int j = 0; j < Src::kRows; ++j) {
      if (j >= src.rows) break;
      const uint8_t* row = base + uint64_t(src.unit16[j] + stage_units) * 16;
#pragma unroll
      for (int ch = 0; ch < kActRowsPerStage<O>; ++ch)
        ptx::cp_async_16_shared(dst + j * Src::kRowsPerPass * kActAtomBytes + ch * S::kActChunk, row + ch * kActAtomBytes);
    }
  }
  if constexpr (C::kCpAsync) ptx::cp_async_mbarrier_arrive_noinc(full);
}

// The producer warpgroup: every tile of this CTA, stage by stage.
template <Projection P, Operand O, int kBlockN>
__device__ __forceinline__ void producer(const GroupedGemmPlan& plan, const WgmmaMaps& maps,
                                         const Cta<P, O, kBlockN>& c, TokenBlocks mode, int ptid) {
  using C = Cta<P, O, kBlockN>;
  if (ptid == 0) {
    ptx::prefetch_tensor_map(&maps.codes);
    ptx::prefetch_tensor_map(&maps.scales);
    if constexpr (!C::kGather) ptx::prefetch_tensor_map(&maps.act);
  }
  RingPosition<C::kStages> ring;
  RingPosition<C::S::kMetaSlots> meta_ring;
  for (int32_t t = blockIdx.x; t < c.total; t += gridDim.x, meta_ring.advance()) {
    const Tile tile = c.tile(t, mode);
    produce_tile_meta(plan, c, tile, meta_ring, ptid);
    const ProducerSources<P, O, kBlockN> src = producer_sources(plan, c, tile, ptid);
    for (int64_t ks = 0; ks < c.k_stages; ++ks, ring.advance())
      produce_stage(plan, maps, c, tile, src, ks, ring, ptid);
  }
  if constexpr (C::kCpAsync) ptx::cp_async_wait<0>();
}

// Consumer warp's A fragments of m64 tile j, chunk ch of a stage: exact
// dequantization from shared memory (fragment_dequant.cuh).
template <Projection P, int kBlockN>
__device__ __forceinline__ void dequant_a(const Cta<P, Operand::Bf16, kBlockN>& c, int stage, int ch, int j, int wg,
                                          int wwarp, int lane, uint32_t (&dst)[4][4]) {
  using S = Smem<Operand::Bf16, kBlockN>;
  const int m = wg * 4 * kM64PerWarpgroup<Operand::Bf16> + 4 * j + wwarp;  // m-tile of this warp in m64 tile j
  const uint32_t scales = ptx::ld_shared_u32(c.scale_base + stage * S::kScaleStage +
                                             uint32_t(m * c.scale_lanes + scale_word_of_lane(c.scale_lanes, lane)) * 4);
  const uint4 frag =
      ptx::ld_shared_v4(c.code_base + stage * S::kCodeStage + (m * kStageChunks + ch) * kFragBytes + lane * 16);
  dequant_fragment_chunk(frag, scales >> (16 * ch), dst);
}

// The FP8 form's A fragments of chunk ch (its two k32 steps): the same codes
// and multiplier bytes, turned into E4M3 with the rows' bias words
// (fragment_dequant.cuh).
template <Projection P, int kBlockN>
__device__ __forceinline__ void dequant_a_fp8(const Cta<P, Operand::Fp8, kBlockN>& c, int stage, int ch, int wg,
                                              int wwarp, int lane, uint32_t bias_g, uint32_t bias_g8,
                                              uint32_t (&dst)[2][4]) {
  using S = Smem<Operand::Fp8, kBlockN>;
  const int m = wg * 4 + wwarp;  // this warp's m-tile
  const uint32_t scales = ptx::ld_shared_u32(c.scale_base + stage * S::kScaleStage +
                                             uint32_t(m * c.scale_lanes + scale_word_of_lane(c.scale_lanes, lane)) * 4);
  const uint4 frag =
      ptx::ld_shared_v4(c.code_base + stage * S::kCodeStage + (m * kStageChunks + ch) * kFragBytes + lane * 16);
  dequant_fragment_chunk_fp8(frag, scales >> (16 * ch), bias_g, bias_g8, dst);
}

// Consumer main loop of one tile: the tile's K in stages of the ring.
// NOTES: software-pipelined in sub-steps q = (chunk ch, m64 tile j), 4 per
// stage: the A fragments of sub-step q + 1 are dequantized while the 4
// wgmmas of q run (two 16-register A buffers; 2 x 64 accumulators leave no
// room for more), and a stage is released once the wgmmas of its last
// sub-step are done.
template <Projection P, int kBlockN>
__device__ __forceinline__ void consume_tile(const Cta<P, Operand::Bf16, kBlockN>& c,
                                             RingPosition<Smem<Operand::Bf16, kBlockN>::kStages>& ring, int wg,
                                             int wwarp, int lane, float (&acc)[2][kBlockN / 2]) {
  using C = Cta<P, Operand::Bf16, kBlockN>;
  using S = typename C::S;
  uint32_t a[2][4][4];
  ptx::mbarrier_wait_parity(c.full_bar + 8 * ring.stage, ring.phase);
  if constexpr (C::kGather) ptx::fence_proxy_async_shared();  // the gathered rows (cp.async) -> wgmma's reads
  dequant_a(c, ring.stage, 0, 0, wg, wwarp, lane, a[0]);
  for (int64_t ks = 0; ks < c.k_stages; ++ks) {
    const uint64_t act_desc = ptx::smem_desc_advance(c.act_desc0, ring.stage * S::kActStage);
#pragma unroll
    for (int q = 0; q < 2 * kStageChunks; ++q) {
      const int ch = q / 2, j = q % 2;
      ptx::wgmma_fence();
#pragma unroll
      for (int s = 0; s < 4; ++s)
        wgmma_rs<kBlockN>(acc[j], a[q % 2][s], ptx::smem_desc_advance(act_desc, ch * S::kActChunk + s * 32));
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<1>();  // sub-step q - 1 done: its A buffer and, at q = 0, the previous stage are free
      if (q == 0 && ks > 0) {
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(c.empty_bar + 8 * ((ring.stage + C::kStages - 1) % C::kStages));
      }
      if (q + 1 < 2 * kStageChunks) {
        dequant_a(c, ring.stage, (q + 1) / 2, (q + 1) % 2, wg, wwarp, lane, a[(q + 1) % 2]);
      } else if (ks + 1 < c.k_stages) {
        RingPosition<C::kStages> next = ring;
        next.advance();
        ptx::mbarrier_wait_parity(c.full_bar + 8 * next.stage, next.phase);
        if constexpr (C::kGather) ptx::fence_proxy_async_shared();
        dequant_a(c, next.stage, 0, 0, wg, wwarp, lane, a[0]);
      }
    }
    ring.advance();
  }
  ptx::wgmma_wait_group<0>();
  __syncwarp();
  if (lane == 0) ptx::mbarrier_arrive(c.empty_bar + 8 * ((ring.stage + C::kStages - 1) % C::kStages));
}

// The FP8 form's main loop of one tile. Per stage (128 of K, one operand
// scale per position) the four k32 wgmmas sum into `part` (the first
// overwrites it), then acc += part * scale of each position in FP32: the
// promotion that keeps the tensor cores' FP8 sums short, and the only place
// the operand scales enter. NOTES: the A fragments live in two buffers of a
// whole stage: all four wgmmas of a stage go out at once and the next
// stage's fragments are converted while they run, so the promotion is the
// only work between a stage's last wgmma and the next stage's first.
template <Projection P, int kBlockN>
struct Fp8Consumer {
  using C = Cta<P, Operand::Fp8, kBlockN>;
  using S = typename C::S;
  const C& c;
  int wg, wwarp, lane;
  uint32_t bias_g, bias_g8;

  __device__ __forceinline__ void convert(int stage, uint32_t (&a)[kStageChunks][2][4]) const {
#pragma unroll
    for (int ch = 0; ch < kStageChunks; ++ch) dequant_a_fp8(c, stage, ch, wg, wwarp, lane, bias_g, bias_g8, a[ch]);
  }

  // One stage on the fragments in `cur`, converting the next stage's into `next`.
  __device__ __forceinline__ void stage(RingPosition<S::kStages>& ring, int64_t ks, float (&part)[kBlockN / 2],
                                        float (&acc)[kBlockN / 2], const uint32_t (&cur)[kStageChunks][2][4],
                                        uint32_t (&next)[kStageChunks][2][4]) const {
    const uint64_t act_desc = ptx::smem_desc_advance(c.act_desc0, ring.stage * S::kActStage);
    ptx::wgmma_fence();
#pragma unroll
    for (int ch = 0; ch < kStageChunks; ++ch)
#pragma unroll
      for (int u = 0; u < 2; ++u)
        wgmma_fp8_rs<kBlockN>(part, cur[ch][u], ptx::smem_desc_advance(act_desc, ch * kMmaChunkK + u * 32),
                              ch + u > 0);
    ptx::wgmma_commit_group();
    if (ks + 1 < c.k_stages) {
      RingPosition<S::kStages> n = ring;
      n.advance();
      ptx::mbarrier_wait_parity(c.full_bar + 8 * n.stage, n.phase);
      if constexpr (C::kGather) ptx::fence_proxy_async_shared();
      convert(n.stage, next);
    }
    ptx::wgmma_wait_group<0>();
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) ptx::wgmma_fence_operand(part[i]);
    const uint32_t scale_base = c.act_scale_base + ring.stage * S::kActScaleStage;
    const int tig = lane % 4;
#pragma unroll
    for (int n = 0; n < kBlockN / 8; ++n) {
      const float2 s = ptx::ld_shared_v2_f32(scale_base + uint32_t(8 * n + 2 * tig) * 4);
      acc[4 * n + 0] += part[4 * n + 0] * s.x;
      acc[4 * n + 1] += part[4 * n + 1] * s.y;
      acc[4 * n + 2] += part[4 * n + 2] * s.x;
      acc[4 * n + 3] += part[4 * n + 3] * s.y;
    }
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(c.empty_bar + 8 * ring.stage);
    ring.advance();
  }
};

template <Projection P, int kBlockN>
__device__ __forceinline__ void consume_tile_fp8(const Cta<P, Operand::Fp8, kBlockN>& c,
                                                 RingPosition<Smem<Operand::Fp8, kBlockN>::kStages>& ring, int wg,
                                                 int wwarp, int lane, uint32_t bias_g, uint32_t bias_g8,
                                                 float (&acc)[kBlockN / 2]) {
  const Fp8Consumer<P, kBlockN> f{c, wg, wwarp, lane, bias_g, bias_g8};
  float part[kBlockN / 2];
  uint32_t a0[kStageChunks][2][4], a1[kStageChunks][2][4];  // [chunk][k32 step][register], even / odd stages
  ptx::mbarrier_wait_parity(c.full_bar + 8 * ring.stage, ring.phase);
  if constexpr (Fp8Consumer<P, kBlockN>::C::kGather) ptx::fence_proxy_async_shared();
  f.convert(ring.stage, a0);
  for (int64_t ks = 0; ks < c.k_stages; ks += 2) {
    f.stage(ring, ks, part, acc, a0, a1);
    if (ks + 1 < c.k_stages) f.stage(ring, ks + 1, part, acc, a1, a0);
  }
}

// A warpgroup without m-tiles in a tile's block still keeps the ring in step.
template <Projection P, Operand O, int kBlockN>
__device__ __forceinline__ void skip_tile(const Cta<P, O, kBlockN>& c, RingPosition<Smem<O, kBlockN>::kStages>& ring,
                                          int lane) {
  for (int64_t ks = 0; ks < c.k_stages; ++ks, ring.advance()) {
    ptx::mbarrier_wait_parity(c.full_bar + 8 * ring.stage, ring.phase);
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(c.empty_bar + 8 * ring.stage);
  }
}

// 2^e as a float, e in [-126, 127].
__device__ __forceinline__ float exp2_int(int e) { return __uint_as_float(uint32_t(e + 127) << 23); }

// The consumer warpgroups: warpgroup wg owns m-tiles wg * 4 * kM64 ..
// of each tile's block; per tile the main loop, then the epilogue.
template <Projection P, Operand O, int kBlockN>
__device__ __forceinline__ void consumers(const GroupedGemmPlan& plan, const FragmentWeights& w,
                                          const Cta<P, O, kBlockN>& c, TokenBlocks mode, int warp, int lane) {
  using C = Cta<P, O, kBlockN>;
  constexpr int kM64 = kM64PerWarpgroup<O>;
  const int wg = warp / 4, wwarp = warp % 4, grp = lane / 4;
  RingPosition<C::kStages> ring;
  RingPosition<C::S::kMetaSlots> meta_ring;
  for (int32_t t = blockIdx.x; t < c.total; t += gridDim.x, meta_ring.advance()) {
    const Tile tile = c.tile(t, mode);
    const ColumnMeta* tile_meta = c.meta + meta_ring.stage * kBlockN;
    const int64_t mt_wg = int64_t(tile.m_block) * C::S::kMTiles + wg * 4 * kM64;
    const bool live = mt_wg < c.m_tiles;  // warpgroup-uniform

    // The expert's global weight scales (gate and up, or down) for rows grp and grp + 8.
    const float gw0 = plan.w_global[P == Projection::GateUp ? tile.expert * 2 : tile.expert];
    const float gw1 = P == Projection::GateUp ? plan.w_global[tile.expert * 2 + 1] : gw0;
    float f[kM64][2];
    float acc[kM64][C::kAccPerTile];
#pragma unroll
    for (int j = 0; j < kM64; ++j)
#pragma unroll
      for (int i = 0; i < C::kAccPerTile; ++i) {
        acc[j][i] = 0.0f;
        ptx::wgmma_fence_operand(acc[j][i]);
      }
    if constexpr (O == Operand::Bf16) {
#pragma unroll
      for (int j = 0; j < kM64; ++j) {
        f[j][0] = gw0 * kFragEpilogue;
        f[j][1] = gw1 * kFragEpilogue;
      }
      if (live)
        consume_tile(c, ring, wg, wwarp, lane, acc);
      else
        skip_tile(c, ring, lane);
    } else {
      // This warp's rows grp, grp + 8 of its m-tile: the FP8 form's row exponents.
      const int64_t mt = mt_wg + wwarp;
      int e_g = 0, e_g8 = 0;
      if (mt < c.m_tiles) {
        const int8_t* rows = w.fp8_rows + (int64_t(tile.expert) * c.m_tiles + mt) * kMmaTileRows;
        e_g = rows[grp];
        e_g8 = rows[grp + 8];
      }
      f[0][0] = gw0 * exp2_int(e_g);
      f[0][1] = gw1 * exp2_int(e_g8);
      if (live)
        consume_tile_fp8(c, ring, wg, wwarp, lane, fp8_row_bias_bf16x2(e_g), fp8_row_bias_bf16x2(e_g8), acc[0]);
      else
        skip_tile(c, ring, lane);
    }
#pragma unroll
    for (int j = 0; j < kM64; ++j)
#pragma unroll
      for (int i = 0; i < C::kAccPerTile; ++i) ptx::wgmma_fence_operand(acc[j][i]);
    ptx::mbarrier_wait_parity(c.meta_full_bar + 8 * meta_ring.stage, meta_ring.phase);
    if (live) store_tile<P, kM64, kBlockN>(plan, tile, tile_meta, mt_wg, c.m_tiles, wwarp, lane, acc, f);
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(c.meta_empty_bar + 8 * meta_ring.stage);
  }
}

// One persistent CTA: setup, then the producer warpgroup and the
// consumer warpgroups, each with its register budget.
template <Projection P, Operand O, int kBlockN>
__device__ __forceinline__ void prefill_gemm_cta(const GroupedGemmPlan& plan, const FragmentWeights& w,
                                                 const WgmmaMaps& maps, TokenBlocks mode) {
  if (!plan_selected(plan)) return;
  const int tid = int(threadIdx.x), lane = tid % 32;
  // Broadcast, so that the compiler sees the warp index (and the role
  // branches on it) as warp-uniform and keeps the wgmma descriptors in
  // uniform registers. Without it every wgmma waited on two R2UR moves and
  // their fixed stall (5-12 % of GEMM time).
  const int warp = __shfl_sync(0xffffffffu, tid / 32, 0);
  const Cta<P, O, kBlockN> c = setup_cta<P, O, kBlockN>(plan, w, mode, tid, warp, lane);
  if (warp >= kConsumerWarps<kBlockN>) {
    ptx::setmaxnreg_dec<kProducerRegisters>();
    producer(plan, maps, c, mode, tid - 32 * kConsumerWarps<kBlockN>);
    return;
  }
  ptx::setmaxnreg_inc<kConsumerRegisters<kBlockN>>();
  consumers(plan, w, c, mode, warp, lane);
}

// The kernel: one persistent CTA (prefill_gemm_cta), bracketed for
// programmatic dependent launch — the next kernel may start on the SMs this
// grid frees, and this grid completes only after the one it may overlap
// (Sm90PrefillGemmConfig::overlap_previous), so completion stays in stream order.
template <Projection P, Operand O, int kBlockN>
__global__ void __launch_bounds__(kThreads<kBlockN>, 1)
    sm90_nvfp4_prefill_gemm_kernel(const __grid_constant__ GroupedGemmPlan plan,
                                   const __grid_constant__ FragmentWeights w, const __grid_constant__ WgmmaMaps maps,
                                   TokenBlocks mode) {
  ptx::griddep_launch_dependents();
  prefill_gemm_cta<P, O, kBlockN>(plan, w, maps, mode);
  ptx::griddep_wait();
}

// The maps hold the weights' and the operand's addresses, so they are built
// on the host per launch (a graph keeps them by value): the weights' boxes
// are a CTA's m-tiles (kMTilesPerCta), Down's operand box block_n rows.
template <Operand O, int kBlockN>
WgmmaMaps weight_maps(const GroupedGemmPlan& p, const FragmentWeights& w) {
  const FragmentGeometry& g = w.geometry;
  const uint64_t experts = uint64_t(p.local_experts), m_tiles = uint64_t(g.m_tiles);
  const uint64_t code_row = uint64_t(g.k_chunks) * kFragBytes;
  const uint64_t scale_row = uint64_t(g.k_chunks / kStageChunks) * uint64_t(g.scale_lanes) * 4;
  constexpr uint32_t kMTiles = uint32_t(kMTilesPerCta<O, kBlockN>);
  WgmmaMaps m{};
  m.codes = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT32, w.codes, {code_row / 4, m_tiles, experts},
                            {code_row, code_row * m_tiles}, {kStageChunks * kFragBytes / 4, kMTiles, 1});
  m.scales = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT32, w.scales, {scale_row / 4, m_tiles, experts},
                             {scale_row, scale_row * m_tiles}, {uint32_t(g.scale_lanes), kMTiles, 1});
  return m;
}

template <Projection P, Operand O, int kBlockN>
void launch(const GroupedGemmPlan& p, const FragmentWeights& w, const Sm90PrefillGemmConfig& cfg, int sms,
            cudaStream_t stream) {
  WgmmaMaps maps = weight_maps<O, kBlockN>(p, w);
  const uint64_t k = uint64_t(w.geometry.k_chunks) * kMmaChunkK;
  if constexpr (P == Projection::Down && O == Operand::Bf16)
    maps.act = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, p.act, {k, uint64_t(p.act_rows)},
                               {uint64_t(p.ld_act) * 2}, {kMmaChunkK, kBlockN}, CU_TENSOR_MAP_SWIZZLE_128B);
  if constexpr (P == Projection::Down && O == Operand::Fp8)
    maps.act = make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, p.act_fp8, {k, uint64_t(p.act_rows)},
                               {uint64_t(p.ld_act)}, {kStageK, kBlockN}, CU_TENSOR_MAP_SWIZZLE_128B);
  const size_t smem = Smem<O, kBlockN>::bytes(p.local_experts);
  const int grid = cfg.grid > 0 ? cfg.grid : sms;  // persistent: surplus CTAs find no tile
  launch_dependent(sm90_nvfp4_prefill_gemm_kernel<P, O, kBlockN>, dim3(unsigned(grid)), dim3(kThreads<kBlockN>), smem,
                   stream, cfg.overlap_previous, p, w, maps, cfg.blocks);
  NVFP4_CUDA_CHECK_LAUNCH("sm90_nvfp4_prefill_gemm_kernel");
}

template <int kBlockN>
void prepare(int64_t local) {
  const size_t bf16 = Smem<Operand::Bf16, kBlockN>::bytes(local), fp8 = Smem<Operand::Fp8, kBlockN>::bytes(local);
  allow_smem_at_least(sm90_nvfp4_prefill_gemm_kernel<Projection::GateUp, Operand::Bf16, kBlockN>, bf16);
  allow_smem_at_least(sm90_nvfp4_prefill_gemm_kernel<Projection::Down, Operand::Bf16, kBlockN>, bf16);
  allow_smem_at_least(sm90_nvfp4_prefill_gemm_kernel<Projection::GateUp, Operand::Fp8, kBlockN>, fp8);
  allow_smem_at_least(sm90_nvfp4_prefill_gemm_kernel<Projection::Down, Operand::Fp8, kBlockN>, fp8);
}

// Calls f(std::integral_constant<int, W>) for each W of kWgmmaWidths until
// one returns true; returns whether one did.
template <typename F, size_t... I>
bool for_each_width_impl(F&& f, std::index_sequence<I...>) {
  return (f(std::integral_constant<int, kWgmmaWidths[I]>{}) || ...);
}
template <typename F>
bool for_each_width(F&& f) {
  return for_each_width_impl(f, std::make_index_sequence<std::size(kWgmmaWidths)>{});
}

// "128, 96, 64, 32": the widths there are kernels for, for error messages.
std::string width_list() {
  std::string s;
  for (const int width : kWgmmaWidths) s += (s.empty() ? "" : ", ") + std::to_string(width);
  return s;
}

// One launch of a plan check_plan accepted, at a width of kWgmmaWidths.
template <Operand O>
void dispatch(const GroupedGemmPlan& p, const FragmentWeights& w, const Sm90PrefillGemmConfig& cfg, int sms,
              cudaStream_t stream) {
  for_each_width([&](auto width) {
    if (cfg.block_n != width.value) return false;
    if (p.projection == Projection::GateUp) {
      launch<Projection::GateUp, O, width.value>(p, w, cfg, sms, stream);
    } else {
      launch<Projection::Down, O, width.value>(p, w, cfg, sms, stream);
    }
    return true;
  });
}

// The plan and weights against the kernel's contract (every launch of a plan alike).
void check_plan(const GroupedGemmPlan& p, const FragmentWeights& w) {
  const FragmentGeometry& g = w.geometry;
  const bool fp8 = prefill_operand(p) == Operand::Fp8;
  NVFP4_CHECK(w.codes && w.scales, "sm90_nvfp4_prefill_gemm: weights (codes, scales) are null");
  NVFP4_CHECK(g.m_tiles > 0 && g.k_chunks > 0 && g.k_chunks % kStageChunks == 0,
              "sm90_nvfp4_prefill_gemm: K must be a positive multiple of ", kStageK, ", got K=", g.k_chunks * kMmaChunkK);
  const int64_t rows = p.projection == Projection::GateUp ? g.m_tiles * 8 : g.m_tiles * kMmaTileRows;
  NVFP4_CHECK(rows == p.n_valid, "sm90_nvfp4_prefill_gemm: weights hold ", rows, " output rows, plan wants n_valid=",
              p.n_valid);
  NVFP4_CHECK(p.ld_act >= g.k_chunks * kMmaChunkK && p.ld_act % 16 == 0, "sm90_nvfp4_prefill_gemm: operand row stride ",
              p.ld_act, " must be a multiple of 16 and >= K=", g.k_chunks * kMmaChunkK);
  NVFP4_CHECK(p.offsets && p.local_experts >= 1 && p.local_experts <= kMaxLocalExperts,
              "sm90_nvfp4_prefill_gemm: needs plan.offsets and 1 <= local_experts <= ", kMaxLocalExperts, ", got ",
              p.local_experts, p.offsets ? "" : " (offsets null)");
  NVFP4_CHECK((fp8 || p.act) && p.act_g && p.pair_of_pos && p.w_global,
              "sm90_nvfp4_prefill_gemm: plan is missing an operand (act, act_g, pair_of_pos, w_global)");
  NVFP4_CHECK(!fp8 || (p.act_scale && p.ld_act_scale == g.k_chunks / kStageChunks && w.fp8_rows),
              "sm90_nvfp4_prefill_gemm (FP8 operand): needs act_scale with ld_act_scale = K/128 = ",
              g.k_chunks / kStageChunks, " (got ", p.ld_act_scale, ") and the weights' FP8 row exponents",
              w.fp8_rows ? "" : " (null)");
  NVFP4_CHECK(p.act_rows >= 1, "sm90_nvfp4_prefill_gemm: plan.act_rows (rows of act) must be set, got ", p.act_rows);
  NVFP4_CHECK(aligned_to(fp8 ? static_cast<const void*>(p.act_fp8) : p.act, 16) && aligned_to(w.codes, 16) &&
                  aligned_to(w.scales, 16),
              "sm90_nvfp4_prefill_gemm: the operand, codes and scales must be 16-byte aligned");
  if (p.projection == Projection::GateUp) {
    NVFP4_CHECK(p.h_out && p.ld_h >= p.n_valid, "sm90_nvfp4_prefill_gemm (gate/up): h output missing or ld_h ", p.ld_h,
                " < I=", p.n_valid);
    NVFP4_CHECK(p.top_k > 0, "sm90_nvfp4_prefill_gemm (gate/up): top_k must be positive, got ", p.top_k);
  } else {
    NVFP4_CHECK(p.y_pair.given() && p.topk_weights, "sm90_nvfp4_prefill_gemm (down): y_pair and topk_weights are required");
  }
}

// The plan's launches in form O.
template <Operand O>
void launch_all(const GroupedGemmPlan& p, const FragmentWeights& w, const Sm90PrefillGemmConfig* one,
                cudaStream_t stream) {
  const int sms = sm_count();
  if (one) return dispatch<O>(p, w, *one, sms, stream);
  for (const int width : kWgmmaWidths)
    dispatch<O>(p, w, Sm90PrefillGemmConfig{width, 0, TokenBlocks::Split, width != kWgmmaWidths[0]}, sms, stream);
}

void launch_plan(const GroupedGemmPlan& p, const FragmentWeights& w, const Sm90PrefillGemmConfig* one,
                 cudaStream_t stream) {
  if (prefill_operand(p) == Operand::Fp8)
    launch_all<Operand::Fp8>(p, w, one, stream);
  else
    launch_all<Operand::Bf16>(p, w, one, stream);
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Sm90PrefillGemmConfig& c) {
  const char* blocks[] = {"All", "Split"};
  return os << "Sm90PrefillGemmConfig{block_n=" << c.block_n << ", grid=" << c.grid
            << ", blocks=" << blocks[int(c.blocks)] << ", overlap_previous=" << c.overlap_previous << "}";
}

void sm90_nvfp4_prefill_gemm_prepare(int64_t local_experts) {
  NVFP4_CHECK(local_experts >= 1 && local_experts <= kMaxLocalExperts, "sm90_nvfp4_prefill_gemm: local_experts=",
              local_experts, " outside [1, ", kMaxLocalExperts, "]");
  int device = 0, optin = 0;
  NVFP4_CUDA_CHECK(cudaGetDevice(&device));
  NVFP4_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  size_t need = 0;
  for_each_width([&](auto width) {
    need = std::max({need, Smem<Operand::Bf16, width.value>::bytes(local_experts),
                     Smem<Operand::Fp8, width.value>::bytes(local_experts)});
    return false;
  });
  NVFP4_CHECK(need <= size_t(optin), "sm90_nvfp4_prefill_gemm: ", need, " bytes of shared memory for ", local_experts,
              " local experts exceed the device's ", optin);
  for_each_width([&](auto width) {
    prepare<width.value>(local_experts);
    return false;
  });
}

void sm90_nvfp4_prefill_gemm(const GroupedGemmPlan& p, const FragmentWeights& w, const Sm90PrefillGemmConfig& cfg,
                           cudaStream_t stream) {
  check_plan(p, w);
  // Before any device query: a bad width is a host error even without a GPU.
  NVFP4_CHECK(is_wgmma_width(cfg.block_n), "sm90_nvfp4_prefill_gemm: no kernel for block_n=", cfg.block_n, " (have ", width_list(), ")");
  launch_plan(p, w, &cfg, stream);
}

void sm90_nvfp4_prefill_gemm_split(const GroupedGemmPlan& p, const FragmentWeights& w, cudaStream_t stream) {
  check_plan(p, w);
  launch_plan(p, w, nullptr, stream);
}

}  // namespace nvfp4moe::cuda
