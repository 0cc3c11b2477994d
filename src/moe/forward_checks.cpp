// The host checks of every MoE front end (see forward_checks.hpp).
#include "moe/forward_checks.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

std::string device_name(DeviceKind d, int index) {
  return d == DeviceKind::Cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

// One tensor: one of two dtypes, the device, the shape (-1 = any), contiguous.
void check_arg(const TensorView& t, const char* arg, DType a, DType b, const ForwardSite& site,
               std::initializer_list<int64_t> shape) {
  NVFP4_CHECK(t.dtype == a || t.dtype == b, arg, ": dtype ", dtype_name(t.dtype), ", expected ", dtype_name(a),
              a == b ? "" : " or ", a == b ? "" : dtype_name(b));
  const bool same_device = t.device == site.device && (site.device == DeviceKind::Cpu || t.device_index == site.device_index);
  NVFP4_CHECK(same_device, arg, ": on ", device_name(t.device, t.device_index), ", but this ", site.who, " runs on ",
              device_name(site.device, site.device_index));
  NVFP4_CHECK(t.ndim == int(shape.size()), arg, ": rank ", t.ndim, " (shape ", shape_string(t), "), expected rank ",
              shape.size());
  int i = 0;
  for (int64_t s : shape) {
    NVFP4_CHECK(s < 0 || t.shape[size_t(i)] == s, arg, ": shape ", shape_string(t), ", dim ", i, " must be ", s);
    ++i;
  }
  if (!t.is_contiguous()) {
    std::string strides = "[";
    for (int d = 0; d < t.ndim; ++d) strides += (d ? ", " : "") + std::to_string(t.strides[size_t(d)]);
    NVFP4_FAIL(arg, ": must be contiguous (row-major), got shape ", shape_string(t), " strides ", strides, "]");
  }
  NVFP4_CHECK(t.data != nullptr || t.numel() == 0, arg, ": null data pointer with shape ", shape_string(t));
}

}  // namespace

CheckedForward check_forward_args(const MoeConfig& cfg, const TensorView& x, const RoutingArgs& routing,
                                  const ForwardOutputs& out, const ForwardSite& site) {
  const int64_t H = cfg.hidden, k = cfg.top_k;
  CheckedForward c;
  NVFP4_CHECK(x.ndim == 2, "x: expected [T, H=", H, "], got shape ", shape_string(x));
  c.tokens = x.shape[0];
  const int64_t T = c.tokens;
  check_arg(x, "x", DType::BF16, DType::F32, site, {-1, H});
  NVFP4_CHECK(site.max_tokens < 0 || T <= site.max_tokens, "x: T=", T, " tokens exceed the capacity of ",
              site.max_tokens, " tokens (max_tokens=", site.max_tokens, ") of this ", site.who);

  c.caller_routing = routing.topk_ids.ndim != 0;
  NVFP4_CHECK(c.caller_routing == (routing.topk_weights.ndim != 0),
              "routing: topk_ids and topk_weights must be given together (topk_ids shape ",
              shape_string(routing.topk_ids), ", topk_weights shape ", shape_string(routing.topk_weights), ")");
  if (c.caller_routing) {
    check_arg(routing.topk_ids, "topk_ids", DType::I32, DType::I64, site, {T, k});
    check_arg(routing.topk_weights, "topk_weights", DType::F32, DType::F32, site, {T, k});
  }
  if (routing.token_ids.ndim != 0) check_arg(routing.token_ids, "token_ids", DType::I32, DType::I64, site, {T});
  NVFP4_CHECK(!cfg.hash_routed || c.caller_routing || routing.token_ids.ndim != 0,
              "token_ids: the layer is hash-routed: token_ids [T] is required (tid2eid[token_id]) when topk_ids "
              "are not given, T=", T);

  NVFP4_CHECK(out.y.ndim != 0, "y: the output tensor [T, H] is required");
  check_arg(out.y, "y", DType::BF16, DType::BF16, site, {T, H});
  c.want_ids = out.topk_ids.ndim != 0;
  c.want_weights = out.topk_weights.ndim != 0;
  if (c.want_ids) check_arg(out.topk_ids, "out topk_ids", DType::I32, DType::I32, site, {T, k});
  if (c.want_weights) check_arg(out.topk_weights, "out topk_weights", DType::F32, DType::F32, site, {T, k});
  return c;
}

void validate_router(const MoeConfig& cfg, const RouterWeights& r) {
  const int64_t E = cfg.experts, H = cfg.hidden, k = cfg.top_k;
  if (cfg.hash_routed) {
    NVFP4_CHECK(r.vocab > 0 && int64_t(r.tid2eid.size()) == r.vocab * k,
                "router: hash-routed layer needs tid2eid [vocab, k] = [", r.vocab, ", ", k, "], got ",
                r.tid2eid.size(), " entries");
    for (size_t i = 0; i < r.tid2eid.size(); ++i)
      NVFP4_CHECK(r.tid2eid[i] >= 0 && r.tid2eid[i] < E, "router: tid2eid[", int64_t(i) / k, "][", int64_t(i) % k,
                  "] = ", r.tid2eid[i], " is outside [0, E=", E, ")");
  }
  // The gate is needed for scores (and for the weights of hash layers) unless
  // every forward supplies its own routing; an empty gate is allowed then.
  NVFP4_CHECK(r.gate.empty() || int64_t(r.gate.size()) == E * H, "router: gate has ", r.gate.size(),
              " elements, expected [E, H] = [", E, ", ", H, "]");
  NVFP4_CHECK(r.bias.empty() || int64_t(r.bias.size()) == E, "router: e_score_correction_bias has ", r.bias.size(),
              " elements, expected E=", E);
  for (size_t i = 0; i < r.gate.size(); ++i)
    NVFP4_CHECK(std::isfinite(r.gate[i]), "router: gate weight [", int64_t(i) / H, ", ", int64_t(i) % H, "] is ",
                r.gate[i]);
  for (size_t i = 0; i < r.bias.size(); ++i)
    NVFP4_CHECK(std::isfinite(r.bias[i]), "router: e_score_correction_bias[", i, "] is ", r.bias[i]);
}

float static_l1_input_scale(const MoeConfig& cfg, const ExpertWeights& w) {
  NVFP4_CHECK(cfg.l2_input == InputScaleMode::Dynamic || !w.w2_input_scale.empty(),
              "static L2 input scale requested but the weights carry no w2 (down_proj) input_scale");
  if (cfg.l1_input != InputScaleMode::Static) return 0.0f;
  NVFP4_CHECK(!w.w13_input_scale.empty(), "static L1 input scale requested but the weights carry no w13 input_scale");
  return *std::max_element(w.w13_input_scale.begin(), w.w13_input_scale.end());
}

}  // namespace nvfp4moe
