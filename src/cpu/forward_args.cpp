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

}  // namespace nvfp4moe::cpu
