// MoeLayer::forward_host: the host convenience of every front end, on top of
// its forward (see nvfp4moe/moe.hpp).
#include "moe/backend.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

template <typename T>
void* host_ptr(std::span<const T> v) {
  return const_cast<T*>(v.data());
}

}  // namespace

HostResult MoeLayer::forward_host(const HostBatch& b) {
  const MoeConfig& c = config();
  const int64_t T = b.tokens, H = c.hidden, k = c.top_k;
  NVFP4_CHECK(T >= 0 && int64_t(b.x.size()) == T * H, "forward_host: x has ", b.x.size(), " values, expected T*H = ",
              T, "*", H);
  NVFP4_CHECK(b.topk_ids.has_value() == b.topk_weights.has_value(),
              "forward_host: topk_ids and topk_weights must be given together");
  NVFP4_CHECK(!b.topk_ids || (int64_t(b.topk_ids->size()) == T * k && int64_t(b.topk_weights->size()) == T * k),
              "forward_host: topk_ids/topk_weights have ", b.topk_ids ? b.topk_ids->size() : 0, "/",
              b.topk_weights ? b.topk_weights->size() : 0, " values, expected T*k = ", T * k);
  NVFP4_CHECK(!b.token_ids || int64_t(b.token_ids->size()) == T, "forward_host: token_ids has ",
              b.token_ids ? b.token_ids->size() : 0, " values, expected T = ", T);
  HostResult r;
  r.y.resize(size_t(T * H));
  r.topk_ids.resize(size_t(T * k));
  r.topk_weights.resize(size_t(T * k));
  if (device() == DeviceKind::Cuda) {
    cuda_forward_host(*this, b, r);
    return r;
  }
  RoutingArgs routing;
  if (b.topk_ids) {
    routing.topk_ids = make_view(host_ptr(*b.topk_ids), DType::I32, {T, k});
    routing.topk_weights = make_view(host_ptr(*b.topk_weights), DType::F32, {T, k});
  }
  if (b.token_ids) routing.token_ids = make_view(host_ptr(*b.token_ids), DType::I32, {T});
  std::vector<Bf16> y(size_t(T * H));
  ForwardOutputs out;
  out.y = make_view(y.data(), DType::BF16, {T, H});
  out.topk_ids = make_view(r.topk_ids.data(), DType::I32, {T, k});
  out.topk_weights = make_view(r.topk_weights.data(), DType::F32, {T, k});
  forward(make_view(host_ptr(b.x), DType::F32, {T, H}), routing, out);
  sync_errors();
  for (size_t i = 0; i < y.size(); ++i) r.y[i] = bf16_to_float(y[i]);
  return r;
}

}  // namespace nvfp4moe
