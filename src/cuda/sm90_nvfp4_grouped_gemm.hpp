// sm90_nvfp4_grouped_gemm: the grouped NVFP4 x BF16 GEMM of the MoE layer.
//
//   D[n, pos] = alpha(pos, n) * sum_k W_e[n, k] * A[row(pos), k]
//
// for every position `pos` of expert e's group (grouping.hpp), with W_e the
// expert's NVFP4 weights dequantized EXACTLY in registers (value(q) * f32(s)
// is exact in BF16) and A the activation operand (value(q) * f32(s) of the
// staged activations, BF16, exact). alpha = g_act(row) * g_w(e, projection)
// is applied in FP32 in the epilogue. "Swap AB": the weights are the 16-row
// operand of mma.m16n8k16, tokens the 8-column one, which suits decode.
//
// ONE launcher takes a plan; a faster kernel (wgmma + TMA) can replace the one
// behind it without touching callers. The weight layout the kernel reads
// ("tile layout") is produced in ONE place: pack_expert_weights (host, at
// upload), described next to it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

#include "cuda/grouping.hpp"

namespace nvfp4moe::cuda {

// ---- tile layout -------------------------------------------------------------
// Weights of one expert and projection are stored as [n_tiles][k_steps] chunks
// of kTileBytes: kTileN rows x kTileK columns, codes first (32 bytes a row),
// then scale bytes (4 a row, linear UE4M3 bit patterns). Inside each 8-byte
// block of 16 codes the bytes are reordered [0,4,1,5,2,6,3,7] so that lane
// (l % 4) = j of an mma fragment reads bytes j and 4 + j (columns 2j, 2j+1
// and 2j+8, 2j+9) as one 16-bit load. Rows and columns past N and K are zero
// bytes (zero scale -> zero values).
//   L2 (down): tile row r of n-tile t is weight row t*128 + r.
//   L1 (gate/up fused): n-tile t covers intermediate indices i in
//   [t*64, t*64 + 64); within each group of 16 rows, rows 0..7 are GATE rows
//   i0..i0+7 and rows 8..15 are the UP rows of the same i, so the mma
//   accumulator of one thread holds gate and up of the same (i, token) and
//   the SwiGLU runs in registers.
constexpr int kTileN = 128;
constexpr int kTileK = 64;
constexpr int kTileCodeBytes = kTileN * kTileK / 2;    // 4096
constexpr int kTileScaleBytes = kTileN * kTileK / 16;  // 512
constexpr int kTileBytes = kTileCodeBytes + kTileScaleBytes;
constexpr int kGemmTileTokens = 64;                    // positions per work tile

enum class Projection : uint8_t { GateUp, Down };

struct PackedGeometry {
  int64_t n_tiles = 0, k_steps = 0;
  int64_t bytes_per_expert() const { return n_tiles * k_steps * kTileBytes; }
};
// L1: N = 2I (as I/64 tiles of 64 gate + 64 up rows), K = H. L2: N = H, K = I.
PackedGeometry packed_geometry(Projection p, int64_t hidden, int64_t intermediate);

// Linear NVFP4 bytes of ONE expert -> tile layout (out: bytes_per_expert()).
// GateUp: codes [2I, H/2] (gate rows then up rows), scales [2I, H/16].
// Down:   codes [H, I/2], scales [H, I/16].
void pack_expert_weights(Projection p, const uint8_t* codes, const uint8_t* scales, int64_t hidden,
                         int64_t intermediate, uint8_t* out);
// The inverse (tests): tile layout -> linear codes and scales of one expert.
void unpack_expert_weights(Projection p, const uint8_t* packed, int64_t hidden, int64_t intermediate,
                           uint8_t* codes, uint8_t* scales);

// ---- the plan ----------------------------------------------------------------
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

  // GateUp epilogue: h[pos, i] = silu(min(gate, L)) * clamp(up, -L, L), f32 [*, ld_h].
  float* h_out = nullptr;
  int64_t ld_h = 0;
  bool has_limit = false;
  float limit = 0.0f;
  // Down epilogue: y_pair[pair, n] = w_pair * alpha * acc, f32 [T*k, H].
  float* y_pair = nullptr;
  const float* topk_weights = nullptr;  // [T*k]
};

void sm90_nvfp4_grouped_gemm(const GroupedGemmPlan& plan, cudaStream_t stream);

#ifdef __CUDACC__
// Whether a kernel launched with `plan` should do its work (see live_pairs).
__device__ __forceinline__ bool plan_selected(const GroupedGemmPlan& plan) {
  if (plan.live_pairs == nullptr) return true;
  const int32_t n = *plan.live_pairs;
  return n > plan.pairs_above && n <= plan.pairs_at_most;
}
#endif

}  // namespace nvfp4moe::cuda
