// nvfp4moe._C: checkpoints — reading safetensors tensors (as NumPy copies),
// the MoE config and layer of a model directory of either layout (DeepSeek's
// names or Hugging Face's), its per-layer summary, and writing a layer.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "bindings.hpp"
#include "numpy_out.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::py {

namespace {

// A tensor's bytes as a NumPy array of the matching type (float8 and bf16 as
// uint8 / uint16 bit patterns: NumPy has neither; sub-byte dtypes as their
// packed bytes, 1-D; complex64 as float32 with the last dimension doubled).
nb::object tensor_to_numpy(const TensorInfo& t) {
  std::vector<size_t> shape(t.shape.begin(), t.shape.end());
  auto make = [&](auto tag) -> nb::object {
    using T = decltype(tag);
    std::vector<T> v(size_t(t.nbytes / sizeof(T)));
    if (t.nbytes) std::memcpy(v.data(), t.data, size_t(t.nbytes));
    auto* owned = new std::vector<T>(std::move(v));
    nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
    return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.data(), owner),
                   nb::rv_policy::reference);
  };
  switch (t.dtype) {
    case DType::F32: return make(float{});
    case DType::F64: return make(double{});
    case DType::F16:
    case DType::BF16:
    case DType::U16: return make(uint16_t{});
    case DType::U8:
    case DType::F8E4M3:
    case DType::F8E5M2:
    case DType::F8E8M0:
    case DType::F8E4M3Fnuz:
    case DType::F8E5M2Fnuz:
    case DType::F4:       // packed: one byte per two elements
    case DType::F6E2M3:   // packed 6-bit elements
    case DType::F6E3M2:
    case DType::Bool: {
      if (dtype_bits(t.dtype) != 8) shape = {size_t(t.nbytes)};  // raw bytes of a packed tensor
      return make(uint8_t{});
    }
    case DType::C64:
      if (shape.empty()) shape = {1};
      shape.back() *= 2;  // (real, imaginary) pairs as float32
      return make(float{});
    case DType::I8: return make(int8_t{});
    case DType::I16: return make(int16_t{});
    case DType::I32: return make(int32_t{});
    case DType::I64: return make(int64_t{});
    case DType::U32: return make(uint32_t{});
    case DType::U64: return make(uint64_t{});
  }
  NVFP4_FAIL(t.name, ": unsupported dtype ", dtype_name(t.dtype));
}

nb::object range_dict(const ValueRange& r) {
  if (!r.count) return nb::none();
  nb::dict d;
  d["min"] = r.min;
  d["max"] = r.max;
  d["count"] = r.count;
  return d;
}

// summarize_moe_layers as a list of dicts (keys as `nvfp4moe inspect --json` writes them).
nb::list summaries(const std::string& dir, bool read_values) {
  nb::list out;
  for (const MoeLayerSummary& s : summarize_moe_layers(ModelDir(dir), read_values)) {
    nb::dict d;
    d["block"] = s.block;
    d["index"] = s.index;
    d["mtp"] = s.mtp;
    d["experts"] = s.experts;
    d["routed_format"] = s.routed_format;
    d["shared_format"] = s.shared_format;
    d["router"] = s.router;
    d["bias"] = s.bias;
    d["manifest_algo"] = s.manifest_algo;
    d["loadable"] = s.loadable;
    d["weight_scale_2"] = range_dict(s.weight_scale_2);
    d["input_scale"] = range_dict(s.input_scale);
    d["shared_scale"] = range_dict(s.shared_scale);
    d["problems"] = s.problems;
    out.append(d);
  }
  return out;
}

// The FP8 shared expert of loaded weights: E4M3 bit patterns (uint8) and tile
// factors (float32, [ceil(N/128), ceil(K/128)]); None for BF16 or no shared expert.
nb::object shared_fp8(const MoeWeights& w) {
  const SharedExpertWeights& s = w.shared;
  if (w.config.shared_experts == 0 || s.format != SharedExpertFormat::Fp8Block) return nb::none();
  const size_t H = size_t(w.config.hidden), Is = size_t(w.config.shared_inter()), t = size_t(s.kFp8Tile);
  const size_t th = (H + t - 1) / t, ti = (Is + t - 1) / t;
  nb::dict d;
  d["w1"] = numpy_copy(s.w1_fp8, {Is, H});
  d["w3"] = numpy_copy(s.w3_fp8, {Is, H});
  d["w2"] = numpy_copy(s.w2_fp8, {H, Is});
  d["w1_scale"] = numpy_copy(s.w1_scale, {ti, th});
  d["w3_scale"] = numpy_copy(s.w3_scale, {ti, th});
  d["w2_scale"] = numpy_copy(s.w2_scale, {th, ti});
  return d;
}

}  // namespace

void bind_checkpoint(nb::module_& m) {
  nb::class_<SafetensorsFile>(m, "SafetensorsFile")
      .def(nb::init<const std::string&>(), nb::arg("path"))
      .def_prop_ro("path", &SafetensorsFile::path)
      .def("names", [](const SafetensorsFile& f) {
        std::vector<std::string> names;
        for (const auto& t : f.tensors()) names.push_back(t.name);
        return names;
      })
      .def("dtype", [](const SafetensorsFile& f, const std::string& name) {
        return std::string(dtype_name(f.get(name).dtype));
      }, nb::arg("name"))
      .def("shape", [](const SafetensorsFile& f, const std::string& name) { return f.get(name).shape; },
           nb::arg("name"))
      .def("get", [](const SafetensorsFile& f, const std::string& name) { return tensor_to_numpy(f.get(name)); },
           nb::arg("name"), "The tensor as a NumPy copy (bf16/f16 as uint16, float8 as uint8 bit patterns).");

  m.def(
      "read_moe_config",
      [](const std::string& dir, int layer, bool mtp) { return read_moe_config(ModelDir(dir), layer, mtp); },
      nb::arg("model_dir"), nb::arg("layer"), nb::arg("mtp") = false);
  m.def(
      "load_moe_weights",
      [](const std::string& dir, int layer, bool static_l1, bool static_l2, int64_t first_expert,
         int64_t expert_count, bool mtp) {
        nb::gil_scoped_release release;
        LoadOptions o;
        o.static_l1_input = static_l1;
        o.static_l2_input = static_l2;
        o.first_expert = first_expert;
        o.expert_count = expert_count;
        o.mtp = mtp;
        return load_moe_layer(ModelDir(dir), layer, o);
      },
      nb::arg("model_dir"), nb::arg("layer"), nb::arg("static_l1_input") = false, nb::arg("static_l2_input") = false,
      nb::arg("first_expert") = 0, nb::arg("expert_count") = -1, nb::arg("mtp") = false);
  m.def(
      "save_moe_layer",
      [](const std::string& dir, int layer, const MoeWeights& w, const std::string& layout) {
        const SaveOptions o{parse_layout(layout)};
        nb::gil_scoped_release release;
        save_moe_layer(dir, layer, w, o);
      },
      nb::arg("model_dir"), nb::arg("layer"), nb::arg("weights"), nb::arg("layout") = "huggingface");
  m.def(
      "model_layout", [](const std::string& dir) { return std::string(layout_name(ModelDir(dir).layout())); },
      nb::arg("model_dir"), "\"deepseek\" or \"huggingface\", from the tensor names.");
  m.def("summarize_moe_layers", &summaries, nb::arg("model_dir"), nb::arg("read_values") = true);
  m.def("shared_expert_fp8", &shared_fp8, nb::arg("weights"));
}

}  // namespace nvfp4moe::py
