// The CPU backend of nvfp4moe::Moe: checks, then the stages of cpu_moe.hpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_moe.hpp"
#include "cpu/tensor_values.hpp"
#include "moe/backend.hpp"
#include "moe/forward_checks.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace cpu {

class CpuBackend final : public MoeBackendImpl {
 public:
  CpuBackend(MoeWeights w, const MoeOptions& options) : w_(std::move(w)), pool_(options.threads) {
    const MoeConfig& c = w_.config;
    NVFP4_CHECK(w_.experts.count == c.experts && w_.experts.first_expert == 0,
                "cpu backend: expects all E=", c.experts, " experts, got count=", w_.experts.count,
                " first_expert=", w_.experts.first_expert, " (expert-parallel slices run through ep.hpp)");
    NVFP4_CHECK(w_.experts.hidden == c.hidden && w_.experts.intermediate == c.intermediate,
                "cpu backend: expert weights are H=", w_.experts.hidden, " I=", w_.experts.intermediate,
                ", config H=", c.hidden, " I=", c.intermediate);
    validate_router(c, w_.router);
    l1_static_g_ = static_l1_input_scale(c, w_.experts);  // used when the L1 input is static
    if (c.shared_experts > 0) w_.shared.validate(c.hidden, c.shared_inter());
  }

  const MoeConfig& config() const override { return w_.config; }
  Backend kind() const override { return Backend::Cpu; }
  int device_index() const override { return 0; }
  void sync_errors() override {}  // errors are thrown at once on the CPU

  void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
               const ForwardOptions&) override {
    const MoeConfig& c = w_.config;
    const CheckedForward a = check_forward_args(c, x, routing, out, ForwardSite{.who = "Moe"});
    const int64_t T = a.tokens;

    // Routing: caller's (checked before any work) or the router's.
    const std::vector<float> xf = values_f32(x);
    const Routing r = forward_routing(c, w_.router, routing, a.caller_routing, xf.data(), {0, T}, pool_);
    forward_routed(xf.data(), T, r.ids.data(), r.weights.data(), out.y.ptr<Bf16>());
    if (a.want_ids) std::copy(r.ids.begin(), r.ids.end(), out.topk_ids.ptr<int32_t>());
    if (a.want_weights) std::copy(r.weights.begin(), r.weights.end(), out.topk_weights.ptr<float>());
  }

 private:
  // Routed experts + shared expert + combine for checked ids in [-1, E), in
  // passes of at most kTokensPerPass tokens.
  // Tokens per pass: bounds the stage buffers (gate/up, h, o are ~k * (3I + H)
  // floats per token: 0.4 GB per 1024 DeepSeek-V4-Pro tokens). A token's
  // result does not depend on which tokens share its pass.
  static constexpr int64_t kTokensPerPass = 1024;

  void forward_routed(const float* x, int64_t T, const int32_t* ids, const float* weights, Bf16* y) {
    const int64_t H = w_.config.hidden, k = w_.config.top_k;
    for (int64_t t0 = 0; t0 < T; t0 += kTokensPerPass) {
      const int64_t n = std::min(kTokensPerPass, T - t0);
      forward_pass(x + t0 * H, n, ids + t0 * k, weights + t0 * k, y + t0 * H);
    }
  }

  void forward_pass(const float* x, int64_t T, const int32_t* ids, const float* weights, Bf16* y) {
    const MoeConfig& c = w_.config;
    const int64_t H = c.hidden, k = c.top_k;
    // Pairs in (token, slot) order; -1 slots are skipped.
    std::vector<ExpertPair> pairs;
    std::vector<float> pair_w;
    std::vector<int64_t> pair_of_slot(size_t(T * k), -1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t id = ids[t * k + j];
        if (id < 0) continue;
        pair_of_slot[size_t(t * k + j)] = int64_t(pairs.size());
        pairs.push_back({int32_t(t), id});
        pair_w.push_back(weights[t * k + j]);
      }
    // x staged once per token (the same for every expert it is routed to).
    std::vector<float> a_values(static_cast<size_t>(T * H)), a_g(static_cast<size_t>(T));
    stage_activation_rows(c.activation, x, T, H, c.l1_input == InputScaleMode::Static ? &l1_static_g_ : nullptr, 0,
                          a_values.data(), a_g.data());
    std::vector<float> o(pairs.size() * size_t(H));
    run_routed_experts(c, w_.experts, a_values.data(), a_g.data(), pairs.data(), int64_t(pairs.size()),
                       c.l2_input == InputScaleMode::Static ? w_.experts.w2_input_scale.data() : nullptr,
                       o.data(), pool_);
    weight_rows(o.data(), pair_w.data(), int64_t(pairs.size()), H, pool_);
    std::vector<float> shared;
    if (c.shared_experts > 0) {
      shared.resize(size_t(T * H));
      run_shared_expert(c, w_.shared, x, T, shared.data(), pool_);
    }
    combine_tokens(o.data(), pair_of_slot.data(), T, k, H, shared.empty() ? nullptr : shared.data(), y, pool_);
  }

  MoeWeights w_;
  WorkerPool pool_;  // every parallel stage of every forward runs on these threads
  float l1_static_g_ = 0.0f;
};

}  // namespace cpu

std::unique_ptr<MoeBackendImpl> make_cpu_backend(MoeWeights weights, const MoeOptions& options) {
  return std::make_unique<cpu::CpuBackend>(std::move(weights), options);
}

}  // namespace nvfp4moe
