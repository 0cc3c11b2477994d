// The stages of the CPU MoE forward (docs/numerics.md §5), one .cpp each:
//   router.cpp          x -> (topk_ids, topk_weights)            [T, k]
//   routing_check.cpp   caller routing -> int32 ids, range checks
//   activation_qdq.cpp  x or h -> exact QDQ values + global scale per row
//   grouping.cpp        (row, expert) pairs -> per-expert groups
//   routed_experts.cpp  grouped pairs -> o_e per pair            [pairs, H]
//   shared_expert.cpp   x -> shared(x)                           [T, H]
//   combine.cpp         y_t = sum_j w_j o_j + shared(x_t) -> BF16
// The expert-parallel emulation (src/ep/) calls the same stages per rank.
// Each parallel stage runs on a WorkerPool (the backend owns one for its
// lifetime); the overloads taking `int threads` start a pool for the call.
#pragma once

#include <cstdint>
#include <vector>

#include "common/worker_pool.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cpu {

// ---- router -----------------------------------------------------------------
// Routes T tokens of x [T, H] (f32 values; bf16 inputs are widened exactly):
// score-based top-k with the correction bias, or tid2eid[token_ids[t]] on a
// hash-routed layer (token_ids required then; an id outside [0, vocab) throws
// naming the token and the id). Writes GLOBAL ids and weights [T, k]. The
// math is src/moe/router_math.hpp, shared with the CUDA router.
void route_tokens(const MoeConfig& cfg, const RouterWeights& router, const float* x, int64_t tokens,
                  const int64_t* token_ids, int32_t* topk_ids, float* topk_weights, WorkerPool& pool);
void route_tokens(const MoeConfig& cfg, const RouterWeights& router, const float* x, int64_t tokens,
                  const int64_t* token_ids, int32_t* topk_ids, float* topk_weights, int threads);

// The router's float logit of expert e for one token (exact products, double sum).
float router_logit(const float* x, const float* gate_row, int64_t hidden);
// out[e] = router_logit(x, gate row e) for e in [0, experts), gate [experts, hidden]:
// the scalar definition (_ref) and the AVX-512 version, bit-identical.
void router_logits_ref(const float* x, const float* gate, int64_t experts, int64_t hidden, float* out);
void router_logits(const float* x, const float* gate, int64_t experts, int64_t hidden, float* out);

// The routing of a forward whose tensors check_forward_args accepted: the
// caller's GLOBAL ids (checked to be in [-1, E)) and weights, or the
// router's, run on each chunk [chunks[i], chunks[i + 1]) of the batch (an
// expert-parallel rank routes its own tokens). x: f32 values [T, H].
struct Routing {
  std::vector<int32_t> ids;   // [T, k]
  std::vector<float> weights;  // [T, k]
};
Routing forward_routing(const MoeConfig& cfg, const RouterWeights& router, const RoutingArgs& routing,
                        bool caller_routing, const float* x, const std::vector<int64_t>& chunks, WorkerPool& pool);
Routing forward_routing(const MoeConfig& cfg, const RouterWeights& router, const RoutingArgs& routing,
                        bool caller_routing, const float* x, const std::vector<int64_t>& chunks, int threads);

// ---- routing checks -----------------------------------------------------------
// Every id must be in [-1, E): else throws naming token, slot and id (docs/numerics.md §6,
// checked before any work).
void check_topk_ids(const int32_t* ids, int64_t tokens, int64_t k, int64_t experts);
void check_topk_ids(const int64_t* ids, int64_t tokens, int64_t k, int64_t experts);

// ---- activation QDQ -----------------------------------------------------------
// Quantizes each row of x [rows, cols] exactly per docs/numerics.md §2 (via
// quantize_rows) and writes the dequantized values WITHOUT the global scale,
// value(q) * f32(s) (exact in FP32), and the row's g. Dynamic: g = amax/2688
// per row; static: g = static_g[row * static_stride]. A row holding NaN/Inf
// becomes NaN (its scale bytes are 0x7F), other rows are unaffected.
void qdq_rows(const float* x, int64_t rows, int64_t cols, const float* static_g, int64_t static_stride,
              float* values, float* g);

// The routed experts' input rows [rows, cols] as the activation mode stages
// them (docs/numerics.md §7): exact values and a per-row factor g that the
// GEMM applies to its sum.
//   Nvfp4  qdq_rows (static_g as there);
//   Bf16   values = bf16(x), g = 1 (W4A16: x only rounded to BF16, as Marlin takes it);
//   Fp8    values = fp8_act_qdq of bf16(x), g = 1: DeepSeek's act_quant with
//          power-of-two scales; its activations are BF16, so x and h are
//          rounded to BF16 first (its Expert casts h to BF16 before w2).
void stage_activation_rows(ActivationMode mode, const float* x, int64_t rows, int64_t cols, const float* static_g,
                           int64_t static_stride, float* values, float* g);

// DeepSeek's FP8 activation quantizer on one row of n values (src/format/
// mxfp4_codec.hpp): blocks of 128 consecutive values (the last one shorter when
// n is not a multiple of 128: DeepSeek's act_quant requires a multiple, its
// shapes always are), s_b = 2^ceil(log2(f32(max(amax_b, 1e-4) * f32(1/448)))),
// codes[i] = e4m3(clamp(x_i / s_b, -448, 448)). A block holding NaN or Inf
// gets s_b = NaN (its values, hence its token, turn NaN).
void fp8_act_quant_ref(const float* x, int64_t n, uint8_t* codes, float* scales);
// QDQ of one row: values[i] = e4m3(codes[i]) * s_b (exact), bit-identical to
// fp8_act_quant_ref followed by that product.
void fp8_act_qdq(const float* x, int64_t n, float* values);

// ---- grouping -----------------------------------------------------------------
// One routed (token, slot): row of the activation matrix and LOCAL expert id.
struct ExpertPair {
  int32_t row;
  int32_t expert;
};
// Pairs sorted by expert (stable: by pair index within an expert).
struct ExpertGroups {
  std::vector<int64_t> offsets;  // [experts + 1]: group e is [offsets[e], offsets[e+1])
  std::vector<int32_t> pair;     // sorted position -> original pair index
};
ExpertGroups group_by_expert(const ExpertPair* pairs, int64_t n, int64_t experts);

// ---- routed experts -------------------------------------------------------------
// For each pair p: o[p, :] = QDQ(h) . W2_e^T with h = swiglu(a . W1_e^T, a . W3_e^T)
// and a = QDQ(x[row]) given as exact values `a_values` [rows, H] and scales
// `a_g` [rows]. `l2_static_g`: one g per local expert for h, or nullptr for
// dynamic per-(token, expert) scales. Writes o [n_pairs, H], every element.
void run_routed_experts(const MoeConfig& cfg, const ExpertWeights& w, const float* a_values,
                        const float* a_g, const ExpertPair* pairs, int64_t n_pairs,
                        const float* l2_static_g, float* o, WorkerPool& pool);
void run_routed_experts(const MoeConfig& cfg, const ExpertWeights& w, const float* a_values,
                        const float* a_g, const ExpertPair* pairs, int64_t n_pairs,
                        const float* l2_static_g, float* o, int threads);

// ---- shared expert --------------------------------------------------------------
// out [T, H] = W2s . swiglu(W1s x, W3s x), FP32 math on x (unquantized); BF16
// or block-scaled FP8 weights (SharedExpertWeights::format), validated first.
void run_shared_expert(const MoeConfig& cfg, const SharedExpertWeights& s, const float* x, int64_t tokens,
                       float* out, WorkerPool& pool);
void run_shared_expert(const MoeConfig& cfg, const SharedExpertWeights& s, const float* x, int64_t tokens,
                       float* out, int threads);

// ---- combine --------------------------------------------------------------------
// y[t] = BF16( sum_j contrib[pair_of_slot[t*k+j]] + shared[t] ), j in slot
// order; a slot with pair -1 contributes nothing; shared may be nullptr.
// contrib rows are already weighted (w_j * o_j), as the owner rank sends them.
void combine_tokens(const float* contrib, const int64_t* pair_of_slot, int64_t tokens, int64_t k,
                    int64_t hidden, const float* shared, Bf16* y, WorkerPool& pool);
void combine_tokens(const float* contrib, const int64_t* pair_of_slot, int64_t tokens, int64_t k,
                    int64_t hidden, const float* shared, Bf16* y, int threads);

// The routed experts' weighting: contrib[p] = w_p * o[p] (FP32 product).
void weight_rows(float* o, const float* w, int64_t n_pairs, int64_t hidden, WorkerPool& pool);
void weight_rows(float* o, const float* w, int64_t n_pairs, int64_t hidden);

}  // namespace nvfp4moe::cpu
