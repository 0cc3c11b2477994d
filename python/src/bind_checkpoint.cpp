// nvfp4moe._C: checkpoints — reading safetensors tensors (as NumPy copies),
// the MoE config and layer of a Hugging Face directory, and writing a layer.
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
      [](const std::string& dir, int layer) { return read_moe_config(ModelDir(dir), layer); }, nb::arg("model_dir"),
      nb::arg("layer"));
  m.def(
      "load_moe_weights",
      [](const std::string& dir, int layer, bool static_l1, bool static_l2, int64_t first_expert,
         int64_t expert_count) {
        nb::gil_scoped_release release;
        LoadOptions o;
        o.static_l1_input = static_l1;
        o.static_l2_input = static_l2;
        o.first_expert = first_expert;
        o.expert_count = expert_count;
        return load_moe_layer(ModelDir(dir), layer, o);
      },
      nb::arg("model_dir"), nb::arg("layer"), nb::arg("static_l1_input") = false, nb::arg("static_l2_input") = false,
      nb::arg("first_expert") = 0, nb::arg("expert_count") = -1);
  m.def(
      "save_moe_layer",
      [](const std::string& dir, int layer, const MoeWeights& w) {
        nb::gil_scoped_release release;
        save_moe_layer(dir, layer, w);
      },
      nb::arg("model_dir"), nb::arg("layer"), nb::arg("weights"));
}

}  // namespace nvfp4moe::py
