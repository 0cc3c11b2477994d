#include "cpu/forward_args.hpp"

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cpu {

namespace {

const char* device_name(DeviceKind d) { return d == DeviceKind::Cpu ? "cpu" : "cuda"; }

// One tensor: one of two dtypes, the device, the shape (-1 = any), contiguous.
void check_arg(const TensorView& t, const char* arg, DType a, DType b, DeviceKind device,
               std::initializer_list<int64_t> shape) {
  NVFP4_CHECK(t.dtype == a || t.dtype == b, arg, ": dtype ", dtype_name(t.dtype), ", expected ",
              dtype_name(a), a == b ? "" : " or ", a == b ? "" : dtype_name(b));
  NVFP4_CHECK(t.device == device, arg, ": tensor on ", device_name(t.device), ", expected ",
              device_name(device));
  NVFP4_CHECK(t.ndim == int(shape.size()), arg, ": rank ", t.ndim, " (shape ", shape_string(t),
              "), expected rank ", shape.size());
  int i = 0;
  for (int64_t s : shape) {
    NVFP4_CHECK(s < 0 || t.shape[size_t(i)] == s, arg, ": shape ", shape_string(t), ", dim ", i,
                " must be ", s);
    ++i;
  }
  if (!t.is_contiguous()) {
    std::string strides = "[";
    for (int d = 0; d < t.ndim; ++d) strides += (d ? ", " : "") + std::to_string(t.strides[size_t(d)]);
    NVFP4_FAIL(arg, ": must be contiguous (row-major), got shape ", shape_string(t), " strides ", strides,
               "]");
  }
  NVFP4_CHECK(t.data != nullptr || t.numel() == 0, arg, ": null data pointer with shape ",
              shape_string(t));
}

}  // namespace

CheckedForward check_forward_args(const MoeConfig& cfg, const TensorView& x, const RoutingArgs& routing,
                                  const ForwardOutputs& out, DeviceKind device) {
  const int64_t H = cfg.hidden, k = cfg.top_k;
  CheckedForward c;
  NVFP4_CHECK(x.ndim == 2, "x: expected [T, H=", H, "], got shape ", shape_string(x));
  c.tokens = x.shape[0];
  const int64_t T = c.tokens;
  check_arg(x, "x", DType::BF16, DType::F32, device, {-1, H});

  c.caller_routing = routing.topk_ids.ndim != 0;
  NVFP4_CHECK(c.caller_routing == (routing.topk_weights.ndim != 0),
              "routing: topk_ids and topk_weights must be given together (topk_ids shape ",
              shape_string(routing.topk_ids), ", topk_weights shape ", shape_string(routing.topk_weights), ")");
  if (c.caller_routing) {
    check_arg(routing.topk_ids, "topk_ids", DType::I32, DType::I64, device, {T, k});
    check_arg(routing.topk_weights, "topk_weights", DType::F32, DType::F32, device, {T, k});
  }
  if (routing.token_ids.ndim != 0)
    check_arg(routing.token_ids, "token_ids", DType::I32, DType::I64, device, {T});
  NVFP4_CHECK(!cfg.hash_routed || c.caller_routing || routing.token_ids.ndim != 0,
              "token_ids: the layer is hash-routed (tid2eid[token_id]), token_ids [T=", T,
              "] are required when topk_ids are not given");

  NVFP4_CHECK(out.y.ndim != 0, "y: the output tensor [T, H] is required");
  check_arg(out.y, "y", DType::BF16, DType::BF16, device, {T, H});
  c.want_ids = out.topk_ids.ndim != 0;
  c.want_weights = out.topk_weights.ndim != 0;
  if (c.want_ids) check_arg(out.topk_ids, "out topk_ids", DType::I32, DType::I32, device, {T, k});
  if (c.want_weights) check_arg(out.topk_weights, "out topk_weights", DType::F32, DType::F32, device, {T, k});
  return c;
}

std::vector<float> values_f32(const TensorView& x) {
  const int64_t n = x.numel();
  std::vector<float> v(static_cast<size_t>(n));
  if (x.dtype == DType::F32) {
    std::copy(x.ptr<const float>(), x.ptr<const float>() + n, v.begin());
  } else {
    NVFP4_CHECK(x.dtype == DType::BF16, "values_f32: dtype ", dtype_name(x.dtype));
    const Bf16* b = x.ptr<const Bf16>();
    for (int64_t i = 0; i < n; ++i) v[size_t(i)] = bf16_to_float(b[i]);
  }
  return v;
}

template <typename Int>
static std::vector<Int> int_values(const TensorView& t) {
  std::vector<Int> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::I32) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = Int(t.ptr<const int32_t>()[i]);
  } else {
    NVFP4_CHECK(t.dtype == DType::I64, "int values: dtype ", dtype_name(t.dtype));
    for (size_t i = 0; i < v.size(); ++i) v[i] = Int(t.ptr<const int64_t>()[i]);
  }
  return v;
}
std::vector<int32_t> values_i32(const TensorView& t) { return int_values<int32_t>(t); }
std::vector<int64_t> values_i64(const TensorView& t) { return int_values<int64_t>(t); }

std::vector<float> forward_host_with(const MoeConfig& c, const HostForward& forward, const std::vector<float>& x,
                                     int64_t tokens, const std::vector<int32_t>* topk_ids,
                                     const std::vector<float>* topk_weights, const std::vector<int32_t>* token_ids,
                                     std::vector<int32_t>* topk_ids_out, std::vector<float>* topk_weights_out) {
  const int64_t H = c.hidden, k = c.top_k;
  NVFP4_CHECK(tokens >= 0 && int64_t(x.size()) == tokens * H, "forward_host: x has ", x.size(),
              " values, expected T*H = ", tokens, "*", H);
  auto need = [&](const auto* v, int64_t n, const char* name) {
    NVFP4_CHECK(!v || int64_t(v->size()) == n, "forward_host: ", name, " has ", v ? v->size() : 0,
                " values, expected ", n);
  };
  need(topk_ids, tokens * k, "topk_ids");
  need(topk_weights, tokens * k, "topk_weights");
  need(token_ids, tokens, "token_ids");
  RoutingArgs r;
  if (topk_ids) r.topk_ids = make_view(const_cast<int32_t*>(topk_ids->data()), DType::I32, {tokens, k});
  if (topk_weights) r.topk_weights = make_view(const_cast<float*>(topk_weights->data()), DType::F32, {tokens, k});
  if (token_ids) r.token_ids = make_view(const_cast<int32_t*>(token_ids->data()), DType::I32, {tokens});
  std::vector<Bf16> y(static_cast<size_t>(tokens * H));
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  std::vector<float> wts(static_cast<size_t>(tokens * k));
  ForwardOutputs o;
  o.y = make_view(y.data(), DType::BF16, {tokens, H});
  o.topk_ids = make_view(ids.data(), DType::I32, {tokens, k});
  o.topk_weights = make_view(wts.data(), DType::F32, {tokens, k});
  forward(make_view(const_cast<float*>(x.data()), DType::F32, {tokens, H}), r, o);
  if (topk_ids_out) *topk_ids_out = std::move(ids);
  if (topk_weights_out) *topk_weights_out = std::move(wts);
  std::vector<float> yf(y.size());
  for (size_t i = 0; i < y.size(); ++i) yf[i] = bf16_to_float(y[i]);
  return yf;
}

}  // namespace nvfp4moe::cpu
