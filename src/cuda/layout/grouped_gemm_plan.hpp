// GroupedGemmPlan: what every grouped NVFP4 GEMM kernel of the routed
// experts takes (decode sm90_nvfp4_decode_gemm, prefill
// sm90_nvfp4_prefill_gemm, and the reference grouped_gemm_ref):
//
//   D[n, pos] = alpha(pos, n) * sum_k W_e[n, k] * A[row(pos), k]
//
// for every position `pos` of expert e's group (kernels/grouping.hpp), with
// W_e the expert's NVFP4 weights dequantized EXACTLY in registers
// (value(q) * f32(s) is exact in BF16) and A the activation operand
// (value(q) * f32(s) of the staged activations, BF16, exact). alpha =
// g_act(row) * g_w(e, projection) is applied in FP32 in the epilogue, then the
// fused SwiGLU (gate/up) or the routing weight (down).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "cuda/layout/projection.hpp"
#include "cuda/layout/tile_layout.hpp"

namespace nvfp4moe::cuda {

// One unit of GEMM work: kGemmTileTokens consecutive positions of one expert.
struct GemmTile {
  int32_t expert;  // local id
  int32_t begin;   // first position
  int32_t rows;    // positions in this tile (<= kGemmTileTokens)
  int32_t pad;
};
constexpr int kGemmTileTokens = 64;  // positions per work tile

// Upper bound on the work list length for `pairs` pairs.
inline int64_t max_gemm_tiles(int64_t pairs, int64_t local_experts, int tile_rows) {
  return (pairs + tile_rows - 1) / tile_rows + local_experts;
}

// Where the down projection writes w_j * o_e of a pair: row `pair` of `rows`
// [pairs, H] (FP32); or, with `row_of_pair` set, the row it points at for
// that pair, FP32 or (bf16) rounded once to BF16 — an expert-parallel
// owner writes its pairs straight into their home ranks' combine areas
// (docs/ep.md).
struct PairOutput {
  float* rows = nullptr;
  void* const* row_of_pair = nullptr;
  bool bf16 = false;
  bool given() const { return rows != nullptr || row_of_pair != nullptr; }
};

struct GroupedGemmPlan {
  Projection projection = Projection::GateUp;
  const uint8_t* weights = nullptr;  // [local experts] x bytes_per_expert(), tile layout
  PackedGeometry geometry;
  int64_t n_valid = 0;               // real output rows: I (GateUp, per half) or H (Down)
  const float* w_global = nullptr;   // GateUp: [E_local, 2] (gate, up); Down: [E_local]

  const __nv_bfloat16* act = nullptr;  // operand rows [act_rows, ld_act], K = k_steps * 64 (zero tail)
  int64_t ld_act = 0;
  int64_t act_rows = 0;  // rows `act` holds (bounds the wgmma kernel's TMA copies of Down's operand)
  // Row of `act` and of `act_g` for a position: GateUp: the token, pair_of_pos[pos] / top_k;
  // Down: the position itself.
  const int32_t* pair_of_pos = nullptr;
  int top_k = 1;
  const float* act_g = nullptr;
  // The FP8 form of the prefill GEMM (sm90_nvfp4_prefill_gemm, Operand::Fp8;
  // layout/fp8_operand.hpp): with act_fp8 set it reads E4M3 operand rows
  // [act_rows, ld_act] bytes and their scales [act_rows, ld_act_scale = K/128]
  // instead of act; the other kernels never do.
  const uint8_t* act_fp8 = nullptr;
  const float* act_scale = nullptr;
  int64_t ld_act_scale = 0;

  const GemmTile* tiles = nullptr;
  const int32_t* num_tiles = nullptr;  // device
  int64_t max_tiles = 0;               // grid bound
  // The group starts (grouping.hpp); the wgmma kernel schedules its own
  // token blocks from them instead of `tiles`.
  const int32_t* offsets = nullptr;    // device [local_experts + 1]
  int64_t local_experts = 0;

  // Device-side choice between kernels, with no host synchronisation: with
  // `live_pairs` set (offsets + local_experts), a kernel does its work only
  // when pairs_above < *live_pairs <= pairs_at_most, and exits at once
  // otherwise. The launcher of several candidates gives them disjoint ranges.
  const int32_t* live_pairs = nullptr;
  int32_t pairs_above = -1;
  int32_t pairs_at_most = std::numeric_limits<int32_t>::max();

  // Programmatic dependent launch (the decode kernel only): the kernel may
  // start while the previous kernel of the stream still runs, and before it
  // waits for that kernel reads nothing but the work list (tiles, num_tiles,
  // offsets, live_pairs, pair_of_pos) and the weights. Set it only where an
  // ordinary launch stands between the kernels that wrote the work list and
  // this one (RoutedExperts: the staging of the input rows).
  bool overlap_previous = false;

  // GateUp epilogue: h[pos, i] = silu(min(gate, L)) * clamp(up, -L, L), f32 [*, ld_h].
  float* h_out = nullptr;
  int64_t ld_h = 0;
  bool has_limit = false;
  float limit = 0.0f;
  // Down epilogue: y_pair's row of `pair`, column n = w_pair * alpha * acc.
  PairOutput y_pair;
  const float* topk_weights = nullptr;  // [T*k]
};

#ifdef __CUDACC__
// One pair's output row (PairOutput) in the kernels' epilogues.
struct PairRow {
  void* at;
  bool bf16;
  __device__ __forceinline__ void store(int64_t n, float v) const {
    if (bf16)
      static_cast<__nv_bfloat16*>(at)[n] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(at)[n] = v;
  }
};
__device__ __forceinline__ PairRow pair_row(const PairOutput& o, int32_t pair, int64_t hidden) {
  if (o.row_of_pair) return PairRow{o.row_of_pair[pair], o.bf16};
  return PairRow{o.rows + int64_t(pair) * hidden, false};
}

// Whether a kernel launched with `plan` should do its work (see live_pairs).
__device__ __forceinline__ bool plan_selected(const GroupedGemmPlan& plan) {
  if (plan.live_pairs == nullptr) return true;
  const int32_t n = *plan.live_pairs;
  return n > plan.pairs_above && n <= plan.pairs_at_most;
}
#endif

}  // namespace nvfp4moe::cuda
