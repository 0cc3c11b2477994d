// nvfp4moe._C: MoeConfig, MoeWeights (built from host arrays, read back as
// NumPy copies) and Moe (forward over DLPack arrays on the caller's stream).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "array_view.hpp"
#include "bindings.hpp"
#include "format/nvfp4_validate.hpp"
#include "numpy_out.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::py {

namespace {

const char* scoring_name(Scoring s) {
  switch (s) {
    case Scoring::SqrtSoftplus: return "sqrtsoftplus";
    case Scoring::Sigmoid: return "sigmoid";
    case Scoring::Softmax: return "softmax";
  }
  return "?";
}

Scoring parse_scoring(const std::string& s) {
  if (s == "sqrtsoftplus") return Scoring::SqrtSoftplus;
  if (s == "sigmoid") return Scoring::Sigmoid;
  if (s == "softmax") return Scoring::Softmax;
  NVFP4_FAIL("scoring: unknown scoring function '", s, "', expected sqrtsoftplus, sigmoid or softmax");
}

InputScaleMode parse_mode(const std::string& s, const char* what) {
  if (s == "dynamic") return InputScaleMode::Dynamic;
  if (s == "static") return InputScaleMode::Static;
  NVFP4_FAIL(what, ": unknown input scale mode '", s, "', expected dynamic or static");
}

const char* mode_name(InputScaleMode m) { return m == InputScaleMode::Dynamic ? "dynamic" : "static"; }

std::string config_repr(const MoeConfig& c) {
  std::ostringstream os;
  os << "MoeConfig(hidden=" << c.hidden << ", intermediate=" << c.intermediate << ", experts=" << c.experts
     << ", top_k=" << c.top_k << ", shared_experts=" << c.shared_experts
     << ", shared_intermediate=" << c.shared_inter() << ", routed_scaling_factor=" << c.routed_scaling_factor
     << ", swiglu_limit=";
  if (c.swiglu_limit) os << *c.swiglu_limit;
  else os << "None";
  os << ", hash_routed=" << (c.hash_routed ? "True" : "False") << ", scoring='" << scoring_name(c.scoring)
     << "', norm_topk_prob=" << (c.norm_topk_prob ? "True" : "False") << ", l1_input='" << mode_name(c.l1_input)
     << "', l2_input='" << mode_name(c.l2_input) << "')";
  return os.str();
}

// A host array copied into a vector after checking dtype and shape.
template <typename T>
std::vector<T> host_copy(const TensorView& v, const char* arg, DType dtype, std::initializer_list<int64_t> shape) {
  check_tensor(v, arg, dtype, DeviceKind::Cpu, shape);
  std::vector<T> out(size_t(v.numel()));
  if (!out.empty()) std::memcpy(out.data(), v.data, out.size() * sizeof(T));
  return out;
}

// f32 or bf16 host array -> f32 values.
std::vector<float> host_f32(const TensorView& v0, const char* arg, std::initializer_list<int64_t> shape) {
  TensorView v = as_bf16_bits(v0);
  if (v.dtype == DType::BF16) {
    std::vector<uint16_t> bits = host_copy<uint16_t>(v, arg, DType::BF16, shape);
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(Bf16{bits[i]});
    return out;
  }
  return host_copy<float>(v, arg, DType::F32, shape);
}

// f32 or bf16 host array -> bf16 values (f32 rounds to nearest even).
std::vector<Bf16> host_bf16(const TensorView& v0, const char* arg, std::initializer_list<int64_t> shape) {
  TensorView v = as_bf16_bits(v0);
  if (v.dtype == DType::BF16) {
    std::vector<uint16_t> bits = host_copy<uint16_t>(v, arg, DType::BF16, shape);
    std::vector<Bf16> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i].bits = bits[i];
    return out;
  }
  std::vector<float> f = host_copy<float>(v, arg, DType::F32, shape);
  std::vector<Bf16> out(f.size());
  for (size_t i = 0; i < f.size(); ++i) out[i] = bf16_from_float(f[i]);
  return out;
}

// Block scales of weights must be finite, non-negative UE4M3 bytes: 0x7F/0xFF
// are E4M3 NaN, and a set sign bit is not a UE4M3 value (docs/numerics.md §1,
// §6). The rule is the one every reader applies (format/nvfp4_validate.hpp);
// the message names the Python argument and the expert, row and block.
void check_weight_scale_bytes(const std::vector<uint8_t>& s, const char* name, int64_t rows, int64_t blocks,
                              int64_t first_expert) {
  const int64_t i = first_bad_block_scale(s.data(), int64_t(s.size()));
  if (i < 0) return;
  const uint8_t b = s[size_t(i)];
  const int64_t per_expert = rows * blocks;
  NVFP4_FAIL(name, ": block scale byte 0x", std::hex, int(b), std::dec, " of expert ", first_expert + i / per_expert,
             " row ", i % per_expert / blocks, " block ", i % blocks,
             block_scale_fault(b) == ScaleByteFault::NaN ? " is NaN" : " is negative",
             " (UE4M3 block scales must be finite and >= 0)");
}

MoeWeights make_weights(const MoeConfig& cfg, const InArray& w13_codes_a, const InArray& w13_scales_a,
                        const InArray& w13_global_a, const InArray& w2_codes_a, const InArray& w2_scales_a,
                        const InArray& w2_global_a, nb::handle w13_input_scale_a, nb::handle w2_input_scale_a,
                        int64_t first_expert, nb::handle router_gate_a, nb::handle router_bias_a,
                        nb::handle tid2eid_a, nb::handle shared_w1_a, nb::handle shared_w3_a, nb::handle shared_w2_a) {
  cfg.validate();
  const int64_t H = cfg.hidden, I = cfg.intermediate, E = cfg.experts;
  TensorView w13_codes = to_view(w13_codes_a, "w13_weight");
  NVFP4_CHECK(w13_codes.ndim == 3, "w13_weight: rank ", w13_codes.ndim, " (shape ", shape_string(w13_codes),
              "), expected [experts, 2*I, H/2]");
  const int64_t n = w13_codes.shape[0];
  NVFP4_CHECK(first_expert >= 0 && first_expert + n <= E, "first_expert=", first_expert, " with ", n,
              " local experts does not fit in E=", E, " experts");
  MoeWeights w;
  w.config = cfg;
  ExpertWeights& x = w.experts;
  x.count = n;
  x.first_expert = first_expert;
  x.hidden = H;
  x.intermediate = I;
  x.w13_codes = host_copy<uint8_t>(w13_codes, "w13_weight", DType::U8, {n, 2 * I, H / 2});
  x.w13_scales = host_copy<uint8_t>(as_scale_bytes(to_view(w13_scales_a, "w13_weight_scale")), "w13_weight_scale",
                                    DType::U8, {n, 2 * I, H / 16});
  x.w13_global = host_copy<float>(to_view(w13_global_a, "w13_weight_scale_2"), "w13_weight_scale_2", DType::F32, {n, 2});
  x.w2_codes = host_copy<uint8_t>(to_view(w2_codes_a, "w2_weight"), "w2_weight", DType::U8, {n, H, I / 2});
  x.w2_scales = host_copy<uint8_t>(as_scale_bytes(to_view(w2_scales_a, "w2_weight_scale")), "w2_weight_scale",
                                   DType::U8, {n, H, I / 16});
  x.w2_global = host_copy<float>(to_view(w2_global_a, "w2_weight_scale_2"), "w2_weight_scale_2", DType::F32, {n});
  if (!w13_input_scale_a.is_none())
    x.w13_input_scale = host_copy<float>(optional_view(w13_input_scale_a, "w13_input_scale", false),
                                         "w13_input_scale", DType::F32, {n});
  if (!w2_input_scale_a.is_none())
    x.w2_input_scale = host_copy<float>(optional_view(w2_input_scale_a, "w2_input_scale", false), "w2_input_scale",
                                        DType::F32, {n});
  NVFP4_CHECK(cfg.l1_input == InputScaleMode::Dynamic || !x.w13_input_scale.empty(),
              "w13_input_scale: the config asks for a static L1 input scale but none was given");
  NVFP4_CHECK(cfg.l2_input == InputScaleMode::Dynamic || !x.w2_input_scale.empty(),
              "w2_input_scale: the config asks for a static L2 input scale but none was given");
  // Before validate(), which applies the same rule, so that a bad byte is
  // reported under the argument's name.
  check_weight_scale_bytes(x.w13_scales, "w13_weight_scale", 2 * I, H / 16, first_expert);
  check_weight_scale_bytes(x.w2_scales, "w2_weight_scale", H, I / 16, first_expert);
  x.validate();

  RouterWeights& r = w.router;
  if (router_gate_a.is_none()) r.gate.assign(size_t(E * H), 0.0f);  // caller-supplied routing only
  else r.gate = host_f32(optional_view(router_gate_a, "router_gate", false), "router_gate", {E, H});
  if (!router_bias_a.is_none()) r.bias = host_f32(optional_view(router_bias_a, "router_bias", false), "router_bias", {E});
  if (!tid2eid_a.is_none()) {
    TensorView t = optional_view(tid2eid_a, "tid2eid", false);
    NVFP4_CHECK(t.ndim == 2, "tid2eid: rank ", t.ndim, " (shape ", shape_string(t), "), expected [vocab, top_k]");
    r.vocab = t.shape[0];
    r.tid2eid = host_copy<int32_t>(t, "tid2eid", DType::I32, {r.vocab, cfg.top_k});
  }
  NVFP4_CHECK(!cfg.hash_routed || !r.tid2eid.empty(), "tid2eid: the config is hash-routed but no tid2eid table was given");

  const int64_t Is = cfg.shared_inter();
  if (cfg.shared_experts > 0) {
    NVFP4_CHECK(!shared_w1_a.is_none() && !shared_w3_a.is_none() && !shared_w2_a.is_none(),
                "shared expert: the config has shared_experts=", cfg.shared_experts,
                " but shared_w1/shared_w3/shared_w2 were not all given");
    w.shared.w1 = host_bf16(optional_view(shared_w1_a, "shared_w1", false), "shared_w1", {Is, H});
    w.shared.w3 = host_bf16(optional_view(shared_w3_a, "shared_w3", false), "shared_w3", {Is, H});
    w.shared.w2 = host_bf16(optional_view(shared_w2_a, "shared_w2", false), "shared_w2", {H, Is});
  } else {
    NVFP4_CHECK(shared_w1_a.is_none() && shared_w3_a.is_none() && shared_w2_a.is_none(),
                "shared expert: weights given but the config has shared_experts=0");
  }
  return w;
}

std::vector<uint16_t> bf16_bits(const std::vector<Bf16>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = v[i].bits;
  return out;
}

nb::object optional_numpy_f32(const std::vector<float>& v, size_t n) {
  if (v.empty()) return nb::none();
  return (numpy_copy(v, {n}));
}

void bind_config(nb::module_& m) {
  nb::class_<MoeConfig>(m, "MoeConfig")
      .def(nb::init<>())
      .def_rw("hidden", &MoeConfig::hidden)
      .def_rw("intermediate", &MoeConfig::intermediate)
      .def_rw("experts", &MoeConfig::experts)
      .def_rw("top_k", &MoeConfig::top_k)
      .def_rw("shared_experts", &MoeConfig::shared_experts)
      .def_rw("shared_intermediate", &MoeConfig::shared_intermediate)
      .def_rw("routed_scaling_factor", &MoeConfig::routed_scaling_factor)
      .def_rw("swiglu_limit", &MoeConfig::swiglu_limit)
      .def_rw("hash_routed", &MoeConfig::hash_routed)
      .def_rw("norm_topk_prob", &MoeConfig::norm_topk_prob)
      .def_prop_rw(
          "scoring", [](const MoeConfig& c) { return std::string(scoring_name(c.scoring)); },
          [](MoeConfig& c, const std::string& s) { c.scoring = parse_scoring(s); })
      .def_prop_rw(
          "l1_input", [](const MoeConfig& c) { return std::string(mode_name(c.l1_input)); },
          [](MoeConfig& c, const std::string& s) { c.l1_input = parse_mode(s, "l1_input"); })
      .def_prop_rw(
          "l2_input", [](const MoeConfig& c) { return std::string(mode_name(c.l2_input)); },
          [](MoeConfig& c, const std::string& s) { c.l2_input = parse_mode(s, "l2_input"); })
      .def("shared_inter", &MoeConfig::shared_inter)
      .def("validate", &MoeConfig::validate)
      .def("copy", [](const MoeConfig& c) { return c; })
      .def("__repr__", &config_repr);
  m.def("dsv4_pro_config", &dsv4_pro_config);
  m.def("dsv4_flash_config", &dsv4_flash_config);
  m.def("small_demo_config", &small_demo_config);
}

void bind_weights(nb::module_& m) {
  using W = MoeWeights;
  nb::class_<W>(m, "MoeWeights")
      .def_rw("config", &W::config)
      .def_prop_ro("count", [](const W& w) { return w.experts.count; })
      .def_prop_ro("first_expert", [](const W& w) { return w.experts.first_expert; })
      .def_prop_ro("w13_weight", [](const W& w) {
        const auto& x = w.experts;
        return numpy_copy(x.w13_codes, {size_t(x.count), size_t(2 * x.intermediate), size_t(x.hidden / 2)});
      })
      .def_prop_ro("w13_weight_scale", [](const W& w) {
        const auto& x = w.experts;
        return numpy_copy(x.w13_scales, {size_t(x.count), size_t(2 * x.intermediate), size_t(x.hidden / 16)});
      })
      .def_prop_ro("w13_weight_scale_2", [](const W& w) {
        return numpy_copy(w.experts.w13_global, {size_t(w.experts.count), 2});
      })
      .def_prop_ro("w2_weight", [](const W& w) {
        const auto& x = w.experts;
        return numpy_copy(x.w2_codes, {size_t(x.count), size_t(x.hidden), size_t(x.intermediate / 2)});
      })
      .def_prop_ro("w2_weight_scale", [](const W& w) {
        const auto& x = w.experts;
        return numpy_copy(x.w2_scales, {size_t(x.count), size_t(x.hidden), size_t(x.intermediate / 16)});
      })
      .def_prop_ro("w2_weight_scale_2", [](const W& w) {
        return numpy_copy(w.experts.w2_global, {size_t(w.experts.count)});
      })
      .def_prop_ro("w13_input_scale", [](const W& w) {
        return optional_numpy_f32(w.experts.w13_input_scale, size_t(w.experts.count));
      })
      .def_prop_ro("w2_input_scale", [](const W& w) {
        return optional_numpy_f32(w.experts.w2_input_scale, size_t(w.experts.count));
      })
      .def_prop_ro("router_gate", [](const W& w) -> nb::object {
        if (w.router.gate.empty()) return nb::none();
        return (numpy_copy(w.router.gate, {size_t(w.config.experts), size_t(w.config.hidden)}));
      })
      .def_prop_ro("router_bias", [](const W& w) {
        return optional_numpy_f32(w.router.bias, size_t(w.config.experts));
      })
      .def_prop_ro("tid2eid", [](const W& w) -> nb::object {
        if (w.router.tid2eid.empty()) return nb::none();
        return (numpy_copy(w.router.tid2eid, {size_t(w.router.vocab), size_t(w.config.top_k)}));
      })
      .def_prop_ro("shared_w1", [](const W& w) -> nb::object {  // BF16 bit patterns as uint16
        if (w.shared.w1.empty()) return nb::none();
        return (numpy_copy(bf16_bits(w.shared.w1), {size_t(w.config.shared_inter()), size_t(w.config.hidden)}));
      })
      .def_prop_ro("shared_w3", [](const W& w) -> nb::object {
        if (w.shared.w3.empty()) return nb::none();
        return (numpy_copy(bf16_bits(w.shared.w3), {size_t(w.config.shared_inter()), size_t(w.config.hidden)}));
      })
      .def_prop_ro("shared_w2", [](const W& w) -> nb::object {
        if (w.shared.w2.empty()) return nb::none();
        return (numpy_copy(bf16_bits(w.shared.w2), {size_t(w.config.hidden), size_t(w.config.shared_inter())}));
      })
      .def("slice", [](const W& w, int64_t first, int64_t count) {
        W s;
        s.config = w.config;
        s.experts = w.experts.slice(first, count);
        s.router = w.router;
        s.shared = w.shared;
        return s;
      }, nb::arg("first"), nb::arg("count"), "Experts [first, first+count) of these (local indices), with router and shared expert.");
  m.def("make_weights", &make_weights, nb::arg("config"), nb::arg("w13_weight"), nb::arg("w13_weight_scale"),
        nb::arg("w13_weight_scale_2"), nb::arg("w2_weight"), nb::arg("w2_weight_scale"),
        nb::arg("w2_weight_scale_2"), nb::arg("w13_input_scale").none() = nb::none(),
        nb::arg("w2_input_scale").none() = nb::none(), nb::arg("first_expert") = 0,
        nb::arg("router_gate").none() = nb::none(), nb::arg("router_bias").none() = nb::none(),
        nb::arg("tid2eid").none() = nb::none(), nb::arg("shared_w1").none() = nb::none(),
        nb::arg("shared_w3").none() = nb::none(), nb::arg("shared_w2").none() = nb::none(),
        "MoeWeights from host arrays (copied), every shape and dtype checked against the config.");
  m.def(
      "synthetic_weights",
      [](const MoeConfig& cfg, uint64_t seed) {
        nb::gil_scoped_release release;
        return make_synthetic_moe(cfg, seed);
      },
      nb::arg("config"), nb::arg("seed"), "A deterministic synthetic layer (make_synthetic_moe).");
}

void bind_engine(nb::module_& m) {
  nb::class_<Moe>(m, "Moe")
      .def(
          "__init__",
          [](Moe* self, MoeWeights& weights, const std::string& backend, int device_index, int threads,
             int64_t max_tokens, bool checked, bool consume, bool fp8_mma) {
            MoeOptions o;
            o.backend = parse_backend(backend);
            o.device = device_index;
            o.threads = threads;
            o.max_tokens = max_tokens;
            o.checked = checked;
            o.fp8_mma = fp8_mma;
            nb::gil_scoped_release release;
            if (consume) new (self) Moe(std::move(weights), o);
            else new (self) Moe(MoeWeights(weights), o);
          },
          nb::arg("weights"), nb::arg("backend") = "cpu", nb::arg("device_index") = 0, nb::arg("threads") = 0,
          nb::arg("max_tokens") = 8192, nb::arg("checked") = false, nb::arg("consume") = false,
          nb::arg("fp8_mma") = false,
          "consume=True moves the weights in (the MoeWeights object is left empty) instead of copying them; "
          "fp8_mma=True: the FP8 form of the prefill GEMM where the weights allow it (MoeOptions::fp8_mma).")
      .def_prop_ro("prefill_mma", [](const Moe& e) { return e.prefill_mma(); })
      .def_prop_ro("config", [](const Moe& e) { return e.config(); })
      .def_prop_ro("backend", [](const Moe& e) { return std::string(backend_name(e.backend())); })
      .def(
          "forward",
          [](Moe& e, const InArray& x_a, nb::handle topk_ids_a, nb::handle topk_weights_a, nb::handle token_ids_a,
             const OutArray& y_a, nb::handle topk_ids_out_a, nb::handle topk_weights_out_a, uintptr_t stream) {
            TensorView x = as_bf16_bits(to_view(x_a, "x"));
            RoutingArgs routing;
            routing.topk_ids = optional_view(topk_ids_a, "topk_ids", false);
            routing.topk_weights = optional_view(topk_weights_a, "topk_weights", false);
            routing.token_ids = optional_view(token_ids_a, "token_ids", false);
            ForwardOutputs out;
            out.y = as_bf16_bits(to_view(y_a, "y"));
            out.topk_ids = optional_view(topk_ids_out_a, "topk_ids_out", true);
            out.topk_weights = optional_view(topk_weights_out_a, "topk_weights_out", true);
            nb::gil_scoped_release release;
            e.forward(x, routing, out, ForwardOptions{.stream = reinterpret_cast<void*>(stream)});
          },
          nb::arg("x"), nb::arg("topk_ids").none(), nb::arg("topk_weights").none(), nb::arg("token_ids").none(),
          nb::arg("y"), nb::arg("topk_ids_out").none(), nb::arg("topk_weights_out").none(), nb::arg("stream"),
          "y = MoE(x) into caller-allocated outputs; device arrays are queued on `stream`.")
      .def("sync_errors", [](Moe& e) {
        nb::gil_scoped_release release;
        e.sync_errors();
      });
}

}  // namespace

void bind_moe(nb::module_& m) {
  bind_config(m);
  bind_weights(m);
  bind_engine(m);
}

}  // namespace nvfp4moe::py
