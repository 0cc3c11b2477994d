// RoutedExperts (see routed_experts.hpp).
#include "cuda/backend/routed_experts.hpp"

#include <algorithm>
#include <limits>

#include "cuda/kernels/ref/routed_experts_ref.hpp"
#include "cuda/kernels/ref/staging_ref.hpp"
#include "cuda/layout/fp8_operand.hpp"
#include "moe/backend.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  DeviceBuffer<T> d(v.size());
  d.upload(v.data(), v.size());
  return d;
}

}  // namespace

RoutedWeightsDevice upload_routed_weights(const ExpertWeights& w, const MoeConfig& cfg, RoutedKernels kernels,
                                          bool fp8_mma) {
  NVFP4_CHECK(kernels == RoutedKernels::Fast || cfg.activation == ActivationMode::Nvfp4,
              "routed experts: the reference kernels take nvfp4 activations only, not ",
              activation_mode_name(cfg.activation));
  NVFP4_CHECK(w.hidden == cfg.hidden && w.intermediate == cfg.intermediate, "routed experts: weights are H=",
              w.hidden, " I=", w.intermediate, " but the config says H=", cfg.hidden, " I=", cfg.intermediate);
  NVFP4_CHECK(w.count > 0, "routed experts: no local experts");
  RoutedWeightsDevice d;
  d.format = w.format;
  d.count = w.count;
  d.hidden = w.hidden;
  d.inter = w.intermediate;
  const int64_t n = w.count, H = w.hidden, I = w.intermediate;
  const bool mx = w.format == ExpertFormat::Mxfp4;
  // MXFP4: the kernel layouts' row-group factors take the place of g_w; the
  // linear layout of the references holds the true scales, so g_w = 1 there.
  std::vector<float> g13 = mx ? std::vector<float>(size_t(2 * n), 1.0f) : w.w13_global;
  std::vector<float> g2 = mx ? std::vector<float>(size_t(n), 1.0f) : w.w2_global;
  const LinearExperts l13{.format = w.format,
                          .projection = Projection::GateUp,
                          .codes = &w.w13_codes,
                          .scales = &w.w13_scales,
                          .count = n,
                          .first_expert = w.first_expert,
                          .hidden = H,
                          .inter = I};
  LinearExperts l2 = l13;
  l2.projection = Projection::Down;
  l2.codes = &w.w2_codes;
  l2.scales = &w.w2_scales;
  std::vector<float> f13, f2;
  if (kernels == RoutedKernels::Reference) {
    d.w13_codes = upload(w.w13_codes);
    d.w13_scales = upload(w.w13_scales);
    d.w2_codes = upload(w.w2_codes);
    d.w2_scales = upload(w.w2_scales);
  } else if (fragment_layout_fits(H, I)) {
    const bool fp8 = fp8_mma && cfg.activation == ActivationMode::Fp8;
    d.w13_frag = upload_fragment_weights(l13, &f13, fp8);
    d.w2_frag = upload_fragment_weights(l2, &f2, fp8);
    if (fp8 && !d.fp8_prefill()) {  // one projection without: the BF16 form for both
      d.fp8_refusal = !d.w13_frag.fp8_refusal.empty() ? "w13: " + d.w13_frag.fp8_refusal
                                                       : "w2: " + d.w2_frag.fp8_refusal;
      d.w13_frag.fp8_rows = DeviceBuffer<int8_t>();
      d.w2_frag.fp8_rows = DeviceBuffer<int8_t>();
    }
  } else {
    d.w13_tiles = upload_tile_weights(l13, &f13);
    d.w2_tiles = upload_tile_weights(l2, &f2);
  }
  if (mx && kernels == RoutedKernels::Fast) {
    g13 = std::move(f13);
    g2 = std::move(f2);
  }
  d.w13_global = upload(g13);
  d.w2_global = upload(g2);
  if (cfg.l2_input == InputScaleMode::Static) {
    NVFP4_CHECK(int64_t(w.w2_input_scale.size()) == n, "routed experts: static L2 input scales requested but ",
                "w2_input_scale has ", w.w2_input_scale.size(), " values for ", n, " experts");
    d.w2_static_g = upload(w.w2_input_scale);
  }
  return d;
}

std::string prefill_mma_name(const RoutedWeightsDevice& w, const MoeConfig& cfg) {
  if (cfg.activation != ActivationMode::Fp8) return "bf16";
  if (w.fp8_prefill()) return "fp8";
  if (!w.fp8_refusal.empty()) return "bf16 (" + w.fp8_refusal + ")";
  return w.w13_frag.codes.size() ? "bf16" : "bf16 (no fragment layout)";
}

RoutedExperts::RoutedExperts(RoutedWeightsDevice weights, const MoeConfig& cfg, Capacity cap, RoutedKernels kernels,
                             float l1_static_g)
    : w_(std::move(weights)),
      cap_(cap),
      kernels_(kernels),
      activation_(cfg.activation),
      l1_static_g_(l1_static_g),
      limit_(cfg.swiglu_limit) {
  NVFP4_CHECK(kernels == RoutedKernels::Fast || activation_ == ActivationMode::Nvfp4,
              "routed experts: the reference kernels take nvfp4 activations only, not ",
              activation_mode_name(activation_));
  NVFP4_CHECK(w_.hidden == cfg.hidden && w_.inter == cfg.intermediate && w_.count > 0,
              "routed experts: device weights of ", w_.count, " experts, H=", w_.hidden, " I=", w_.inter,
              " for a config with H=", cfg.hidden, " I=", cfg.intermediate);
  NVFP4_CHECK(cap.input_rows >= 1 && cap.pairs >= 1 && cap.pairs < (int64_t(1) << 31), "routed experts: capacity ",
              cap.input_rows, " input rows and ", cap.pairs, " pairs, each must be in [1, 2^31)");
  const int64_t H = w_.hidden, I = w_.inter;
  frag13_ = w_.w13_frag.view();
  frag2_ = w_.w2_frag.view();
  geo13_ = packed_geometry(Projection::GateUp, H, I);
  geo2_ = packed_geometry(Projection::Down, H, I);
  ld_act_ = geo13_.k_steps * kTileK;
  ld_h_ = geo2_.k_steps * kTileK;
  act_g_ = DeviceBuffer<float>(size_t(cap.input_rows));
  h_ = DeviceBuffer<float>(size_t(cap.pairs * I));
  h_g_ = DeviceBuffer<float>(size_t(cap.pairs));
  h_deq_ = DeviceBuffer<__nv_bfloat16>(size_t(cap.pairs * ld_h_));
  // Kernel attributes are set here, not per launch: a forward stays graph-capturable.
  if (kernels_ == RoutedKernels::Reference) {
    prefill_mma_ = "none (reference kernels)";
    x_codes_ = DeviceBuffer<uint8_t>(size_t(cap.input_rows * H / 2));
    x_scales_ = DeviceBuffer<uint8_t>(size_t(cap.input_rows * H / 16));
    routed_experts_ref_prepare(H, I);
  } else {
    act_ = DeviceBuffer<__nv_bfloat16>(size_t(cap.input_rows * ld_act_));
    expand_nvfp4_rows_prepare(int32_t(H));
    prepare_expert_gemm(w_.count);
    fp8_ = w_.fp8_prefill() && activation_ == ActivationMode::Fp8;  // weights uploaded for fp8 serve other modes too
    prefill_mma_ = prefill_mma_name(w_, cfg);
    if (fp8_) {  // H and I are multiples of 128 (the fragment layout), so ld_act_ = H, ld_h_ = I
      act8_ = DeviceBuffer<uint8_t>(size_t(cap.input_rows * ld_act_));
      act8_scale_ = DeviceBuffer<float>(size_t(cap.input_rows * H / kFp8OperandBlock));
      h8_ = DeviceBuffer<uint8_t>(size_t(cap.pairs * ld_h_));
      h8_scale_ = DeviceBuffer<float>(size_t(cap.pairs * I / kFp8OperandBlock));
    }
  }
}

const FragmentWeights* RoutedExperts::fragments(Projection p) const {
  const FragmentWeights& f = p == Projection::GateUp ? frag13_ : frag2_;
  return f.codes ? &f : nullptr;
}

void RoutedExperts::check(const RoutedInput& in, const RoutedPairs& pairs, const PairOutput& y_pair) const {
  const bool nvfp4 = in.codes != nullptr;
  NVFP4_CHECK(nvfp4 != (in.x != nullptr), "routed experts: give either activation rows x or NVFP4 rows");
  NVFP4_CHECK(!nvfp4 || (in.scales && in.g && in.live_rows),
              "routed experts: NVFP4 input rows need codes, scales, g and the live row count");
  NVFP4_CHECK(in.rows >= 0 && in.rows <= cap_.input_rows, "routed experts: ", in.rows,
              " input rows, above the capacity of ", cap_.input_rows);
  NVFP4_CHECK(pairs.pairs_bound >= 0 && pairs.pairs_bound <= cap_.pairs, "routed experts: a bound of ",
              pairs.pairs_bound, " pairs, above the capacity of ", cap_.pairs);
  NVFP4_CHECK(pairs.pair_of_pos && pairs.expert_of_pos && pairs.offsets && pairs.pair_weights && pairs.top_k >= 1,
              "routed experts: the grouping (pair_of_pos, expert_of_pos, offsets, pair_weights, top_k) is incomplete");
  NVFP4_CHECK(y_pair.given(), "routed experts: no output for the pairs (PairOutput rows or row_of_pair)");
}

RoutedExperts::Plan RoutedExperts::plan(const RoutedInput& in, const RoutedPairs& pairs, const PairOutput& y_pair) {
  check(in, pairs, y_pair);
  NVFP4_CHECK(kernels_ == RoutedKernels::Fast, "routed experts: plan() is the fast kernels' (this set runs the references)");
  const int64_t local = w_.count, H = w_.hidden, I = w_.inter;
  const int32_t* live_pairs = pairs.offsets + local;
  Plan p;
  // The GEMMs of this forward (chosen on the device from the live pair
  // count), and the column order they want their operand rows in.
  p.gemm = expert_gemm_choice(local, pairs.pairs_bound, pairs.pairs_planned, fragments(Projection::GateUp),
                              fragments(Projection::Down));
  // The FP8 form makes its operand from logical-order BF16 rows (the decode kernel's order too).
  const OperandOrder order = fp8_ ? OperandOrder{} : p.gemm.operand_order(live_pairs);
  p.expand = in.codes != nullptr;
  NVFP4_CHECK(!p.expand || activation_ == ActivationMode::Nvfp4, "routed experts: NVFP4 input rows with ",
              activation_mode_name(activation_), " activations");
  p.expand_rows = ExpandRowsArgs{.codes = in.codes,
                                 .scales = in.scales,
                                 .rows_max = int32_t(in.rows),
                                 .live_rows = in.live_rows,
                                 .cols = int32_t(H),
                                 .out = act_.get(),
                                 .ld = int32_t(ld_act_),
                                 .order = order};
  p.stage_x = stage_x_args(in);
  p.stage_x.deq = act_.get();
  p.stage_x.deq_ld = ld_act_;
  p.stage_x.deq_order = order;
  p.gate_up = GroupedGemmPlan{.projection = Projection::GateUp,
                              .weights = w_.w13_tiles.get(),
                              .geometry = geo13_,
                              .n_valid = I,
                              .w_global = w_.w13_global.get(),
                              .act = act_.get(),
                              .ld_act = ld_act_,
                              .act_rows = cap_.input_rows,
                              .pair_of_pos = pairs.pair_of_pos,
                              .top_k = pairs.top_k,
                              .act_g = p.expand ? in.g : act_g_.get(),
                              .tiles = pairs.tiles,
                              .num_tiles = pairs.num_tiles,
                              .max_tiles = max_gemm_tiles(pairs.pairs_bound, local, kGemmTileTokens),
                              .offsets = pairs.offsets,
                              .local_experts = local,
                              .h_out = h_.get(),
                              .ld_h = I,
                              .has_limit = limit_.has_value(),
                              .limit = limit_.value_or(0.0f)};
  // The staging of the input rows is an ordinary launch after the grouping,
  // so the gate/up GEMM may overlap it (GroupedGemmPlan), on SMs whose L1
  // the staging keeps large (dependent_launch.hpp).
  p.gate_up.overlap_previous = p.expand ? in.rows > 0 : p.stage_x.rows > 0;
  p.stage_x.next_overlaps = p.expand_rows.next_overlaps = p.gate_up.overlap_previous;
  p.requant = requant_args(pairs, order);
  // Down: the same positions, work list and scheduling, launched once the
  // requantization is done. NOTES (measured on an H100, EP1 T = 8): launched
  // to overlap it, the SMs that held requantization CTAs when the down
  // GEMM's CTAs joined them ran 10-15 % slower for the whole GEMM, with the
  // requantization asking for the largest L1 as well.
  p.down = p.gate_up;
  p.down.overlap_previous = false;
  p.down.projection = Projection::Down;
  p.down.weights = w_.w2_tiles.get();
  p.down.geometry = geo2_;
  p.down.n_valid = H;
  p.down.w_global = w_.w2_global.get();
  p.down.act = h_deq_.get();
  p.down.ld_act = ld_h_;
  p.down.act_rows = cap_.pairs;
  p.down.act_g = h_g_.get();
  p.down.h_out = nullptr;
  p.down.y_pair = y_pair;
  p.down.topk_weights = pairs.pair_weights;
  if (fp8_ && !p.expand) {
    // The E4M3 rows are needed exactly where the prefill GEMM runs: where the
    // BF16 operand would be in k-slot order.
    const int32_t above = p.gemm.operand_order(live_pairs).kslot_above;
    p.fp8 = above < std::numeric_limits<int32_t>::max();
    p.x_fp8 = Fp8OperandArgs{.in = act_.get(),
                             .ld_in = ld_act_,
                             .rows_max = in.rows,
                             .cols = H,
                             .codes = act8_.get(),
                             .ld_codes = ld_act_,
                             .scales = act8_scale_.get(),
                             .live_pairs = live_pairs,
                             .pairs_above = above};
    p.h_fp8 = Fp8OperandArgs{.in = h_deq_.get(),
                             .ld_in = ld_h_,
                             .rows_max = pairs.pairs_bound,
                             .live_rows = live_pairs,
                             .cols = I,
                             .codes = h8_.get(),
                             .ld_codes = ld_h_,
                             .scales = h8_scale_.get(),
                             .live_pairs = live_pairs,
                             .pairs_above = above};
    p.gate_up.act_fp8 = act8_.get();
    p.gate_up.act_scale = act8_scale_.get();
    p.gate_up.ld_act_scale = H / kFp8OperandBlock;
    p.down.act_fp8 = h8_.get();
    p.down.act_scale = h8_scale_.get();
    p.down.ld_act_scale = I / kFp8OperandBlock;
  }
  return p;
}

// The L1 input x -> NVFP4 per row, or with the layer's static g
// (docs/numerics.md §2); the caller says what to write.
QuantizeActArgs RoutedExperts::stage_x_args(const RoutedInput& in) const {
  return QuantizeActArgs{.x = in.x,
                         .x_is_bf16 = in.x_is_bf16,
                         .rows = in.rows,
                         .cols = w_.hidden,
                         .scope = l1_static_g_ > 0.0f ? ActScope::Static : ActScope::PerRow,
                         .static_g = l1_static_g_ > 0.0f ? l1_static_g_ : 1.0f,
                         .g_out = act_g_.get(),
                         .mode = activation_};
}

// QDQ of h per row (docs/numerics.md §2): a dynamic g per row, or the
// expert's static g; the BF16 operand rows in `order`.
RequantRowsArgs RoutedExperts::requant_args(const RoutedPairs& pairs, OperandOrder order) {
  return RequantRowsArgs{.h = h_.get(),
                         .ld_h = w_.inter,
                         .cols = w_.inter,
                         .rows_max = pairs.pairs_bound,
                         .num_rows = pairs.offsets + w_.count,
                         .static_g_per_expert = w_.w2_static_g.size() ? w_.w2_static_g.get() : nullptr,
                         .row_expert = pairs.expert_of_pos,
                         .g_out = h_g_.get(),
                         .deq = h_deq_.get(),
                         .deq_ld = ld_h_,
                         .deq_order = order,
                         .mode = activation_};
}

void RoutedExperts::stage(const Plan& p, cudaStream_t s) const {
  if (p.expand)
    expand_nvfp4_rows(p.expand_rows, s);
  else if (p.stage_x.rows > 0)
    stage_activations(p.stage_x, s);
  if (p.fp8 && p.x_fp8.rows_max > 0) fp8_operand_rows(p.x_fp8, s);
}
void RoutedExperts::gate_up(const Plan& p, cudaStream_t s) const {
  run_expert_gemm(p.gate_up, fragments(Projection::GateUp), p.gemm, s);
}
void RoutedExperts::requantize(const Plan& p, cudaStream_t s) const {
  stage_requantized_rows(p.requant, s);
  if (p.fp8 && p.h_fp8.rows_max > 0) fp8_operand_rows(p.h_fp8, s);
}
void RoutedExperts::down(const Plan& p, cudaStream_t s) const {
  run_expert_gemm(p.down, fragments(Projection::Down), p.gemm, s);
}

void RoutedExperts::run(const RoutedInput& in, const RoutedPairs& pairs, const PairOutput& y_pair, cudaStream_t s) {
  if (kernels_ == RoutedKernels::Reference) return run_ref(in, pairs, y_pair, s);
  const Plan p = plan(in, pairs, y_pair);
  stage(p, s);
  gate_up(p, s);
  requantize(p, s);
  down(p, s);
}

// The scalar references on NVFP4 rows: x staged by the reference staging
// kernel first, h requantized by the reference requantization (logical order).
void RoutedExperts::run_ref(const RoutedInput& in, const RoutedPairs& pairs, const PairOutput& y_pair, cudaStream_t s) {
  check(in, pairs, y_pair);
  const int64_t local = w_.count, H = w_.hidden, I = w_.inter;
  RoutedExpertsRefArgs a{.x_codes = in.codes,
                         .x_scales = in.scales,
                         .x_g = in.g,
                         .pair_of_pos = pairs.pair_of_pos,
                         .top_k = pairs.top_k,
                         .expert_of_pos = pairs.expert_of_pos,
                         .live_positions = pairs.offsets + local,
                         .positions_max = int32_t(pairs.pairs_bound),
                         .pair_weights = pairs.pair_weights,
                         .hidden = H,
                         .inter = I,
                         .has_limit = limit_.has_value(),
                         .limit = limit_.value_or(0.0f),
                         .mxfp4 = w_.format == ExpertFormat::Mxfp4,
                         .w13_codes = w_.w13_codes.get(),
                         .w13_scales = w_.w13_scales.get(),
                         .w13_global = w_.w13_global.get(),
                         .w2_codes = w_.w2_codes.get(),
                         .w2_scales = w_.w2_scales.get(),
                         .w2_global = w_.w2_global.get()};
  if (!in.codes) {
    QuantizeActArgs q = stage_x_args(in);
    q.codes = x_codes_.get();
    q.scales_linear = x_scales_.get();
    if (in.rows > 0) quantize_activations_ref(q, s);
    a.x_codes = x_codes_.get();
    a.x_scales = x_scales_.get();
    a.x_g = act_g_.get();
  }
  routed_gate_up_ref(a, h_.get(), s);
  requantize_rows_ref(requant_args(pairs, OperandOrder{}), s);  // logical order: what the references read
  routed_down_ref(a, h_deq_.get(), ld_h_, h_g_.get(), y_pair, s);
}

}  // namespace nvfp4moe::cuda
