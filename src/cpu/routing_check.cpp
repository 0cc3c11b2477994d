// A forward's routing: the caller's ids, checked before any work
// (docs/numerics.md §6: each must be a GLOBAL id in [0, E) or -1, "no
// expert"), or the router's.
#include "cpu/cpu_moe.hpp"
#include "cpu/tensor_values.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cpu {

namespace {
template <typename Id>
void check_ids(const Id* ids, int64_t tokens, int64_t k, int64_t experts) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = int64_t(ids[t * k + j]);
      NVFP4_CHECK(id >= -1 && id < experts, "topk_ids: token ", t, " slot ", j, " has expert id ", id,
                  " outside [-1, E=", experts, ")");
    }
}
}  // namespace

void check_topk_ids(const int32_t* ids, int64_t tokens, int64_t k, int64_t experts) {
  check_ids(ids, tokens, k, experts);
}
void check_topk_ids(const int64_t* ids, int64_t tokens, int64_t k, int64_t experts) {
  check_ids(ids, tokens, k, experts);
}

Routing forward_routing(const MoeConfig& c, const RouterWeights& router, const RoutingArgs& routing,
                        bool caller_routing, const float* x, const std::vector<int64_t>& chunks, WorkerPool& pool) {
  const int64_t T = chunks.back(), H = c.hidden, k = c.top_k;
  Routing r;
  if (caller_routing) {
    if (routing.topk_ids.dtype == DType::I32)
      check_topk_ids(routing.topk_ids.ptr<const int32_t>(), T, k, c.experts);
    else
      check_topk_ids(routing.topk_ids.ptr<const int64_t>(), T, k, c.experts);
    r.ids = values_i32(routing.topk_ids);
    const float* tw = routing.topk_weights.ptr<const float>();
    r.weights.assign(tw, tw + T * k);
    return r;
  }
  r.ids.resize(size_t(T * k));
  r.weights.resize(size_t(T * k));
  std::vector<int64_t> token_ids;
  if (routing.token_ids.ndim != 0) token_ids = values_i64(routing.token_ids);
  for (size_t i = 0; i + 1 < chunks.size(); ++i) {
    const int64_t b = chunks[i], e = chunks[i + 1];
    route_tokens(c, router, x + b * H, e - b, token_ids.empty() ? nullptr : token_ids.data() + b,
                 r.ids.data() + b * k, r.weights.data() + b * k, pool);
  }
  return r;
}

Routing forward_routing(const MoeConfig& c, const RouterWeights& router, const RoutingArgs& routing,
                        bool caller_routing, const float* x, const std::vector<int64_t>& chunks, int threads) {
  WorkerPool pool(caller_routing ? 1 : threads);  // caller routing runs no parallel stage
  return forward_routing(c, router, routing, caller_routing, x, chunks, pool);
}

}  // namespace nvfp4moe::cpu
