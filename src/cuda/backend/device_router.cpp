// DeviceRouter (see device_router.hpp).
#include "cuda/backend/device_router.hpp"

#include "cuda/kernels/router.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

DeviceRouter::DeviceRouter(const RouterWeights& r, const MoeConfig& cfg, int64_t max_tokens)
    : cfg_(cfg), max_tokens_(max_tokens) {
  const int64_t E = cfg.experts, H = cfg.hidden;
  if (!r.gate.empty()) {
    std::vector<float> t(r.gate.size());
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h) t[size_t(h * E + e)] = r.gate[size_t(e * H + h)];
    gate_t_ = DeviceBuffer<float>(t.size());
    gate_t_.upload(t.data(), t.size());
  }
  if (!r.bias.empty()) {
    bias_ = DeviceBuffer<float>(r.bias.size());
    bias_.upload(r.bias.data(), r.bias.size());
  }
  if (cfg.hash_routed && !r.tid2eid.empty()) {
    tid2eid_ = DeviceBuffer<int32_t>(r.tid2eid.size());
    tid2eid_.upload(r.tid2eid.data(), r.tid2eid.size());
    vocab_ = r.vocab;
  }
  ids_ = DeviceBuffer<int32_t>(size_t(max_tokens * cfg.top_k));
  weights_ = DeviceBuffer<float>(size_t(max_tokens * cfg.top_k));
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads' pageable sources go out of scope
}

void DeviceRouter::check(bool has_token_ids, int64_t tokens) const {
  NVFP4_CHECK(gate_t_.size() > 0, "routing: no topk_ids given and the layer was built without router weights: pass "
              "topk_ids and topk_weights (the router needs the gate weight, also on hash-routed layers)");
  NVFP4_CHECK(!cfg_.hash_routed || (tid2eid_.size() > 0 && (has_token_ids || tokens == 0)),
              "routing: the layer is hash-routed: token_ids [T] and tid2eid are required");
  NVFP4_CHECK(tokens <= max_tokens_, "routing: T=", tokens, " tokens above the router's capacity of ", max_tokens_);
}

void DeviceRouter::route(const void* x, bool x_is_bf16, int64_t tokens, const void* token_ids, bool token_ids_i64,
                         uint32_t* error_word, cudaStream_t stream) {
  check(token_ids != nullptr, tokens);
  if (tokens == 0) return;
  RouterArgs a{.x = x,
               .x_is_bf16 = x_is_bf16,
               .tokens = tokens,
               .hidden = cfg_.hidden,
               .gate_t = gate_t_.get(),
               .bias = bias_.size() ? bias_.get() : nullptr,
               .experts = int(cfg_.experts),
               .top_k = int(cfg_.top_k),
               .scoring = int(cfg_.scoring),
               .rho = cfg_.routed_scaling_factor,
               .norm_topk_prob = cfg_.norm_topk_prob,
               .topk_ids = ids_.get(),
               .topk_weights = weights_.get(),
               .error_word = error_word};
  if (cfg_.hash_routed) {
    a.tid2eid = tid2eid_.get();
    a.vocab = vocab_;
    a.token_ids = token_ids;
    a.token_ids_i64 = token_ids_i64;
  }
  route_tokens(a, stream);
}

}  // namespace nvfp4moe::cuda
