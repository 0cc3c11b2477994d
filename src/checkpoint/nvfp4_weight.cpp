// read_nvfp4_weight and read_global_scale (see nvfp4_weight.hpp, model_files.hpp).
#include "checkpoint/nvfp4_weight.hpp"

#include <cmath>
#include <cstring>

#include "checkpoint/model_files.hpp"
#include "checkpoint/weight_format.hpp"
#include "format/nvfp4_validate.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

void expect(const TensorInfo& t, DType dtype, const std::vector<int64_t>& shape) {
  NVFP4_CHECK(t.dtype == dtype, "tensor \"", t.name, "\": dtype ", dtype_name(t.dtype), ", expected ",
              dtype_name(dtype));
  NVFP4_CHECK(t.shape == shape, "tensor \"", t.name, "\": shape ", shape_text(t.shape), ", expected ",
              shape_text(shape));
}

// The global-scale tensor's dtype and shape, without its value.
void expect_scalar(const TensorInfo& t) {
  NVFP4_CHECK(t.dtype == DType::F32, "tensor \"", t.name, "\": dtype ", dtype_name(t.dtype),
              ", expected F32 (a global scale)");
  NVFP4_CHECK(t.shape.empty() || (t.shape.size() == 1 && t.shape[0] == 1), "tensor \"", t.name, "\": shape ",
              shape_text(t.shape), ", expected [] or [1] (a global scale)");
}

}  // namespace

float read_global_scale(const TensorInfo& t) {
  expect_scalar(t);
  float g;
  std::memcpy(&g, t.data, 4);
  NVFP4_CHECK(std::isfinite(g) && g > 0.0f, "tensor \"", t.name, "\": global scale is ", g,
              " (must be finite and > 0)");
  return g;
}

Nvfp4Weight read_nvfp4_weight(const TensorLookup& find, const std::string& where, const std::string& prefix,
                              std::optional<std::pair<int64_t, int64_t>> shape, Nvfp4Read read) {
  const Nvfp4Names n(prefix);
  const TensorInfo* codes = find(n.weight);
  const TensorInfo* scales = find(n.weight_scale);
  const TensorInfo* global = find(n.weight_scale_2);
  const TensorInfo* input = find(n.input_scale);
  for (const auto& [t, name] : {std::pair{codes, &n.weight}, {scales, &n.weight_scale}, {global, &n.weight_scale_2}})
    NVFP4_CHECK(t, where, ": missing tensor \"", *name, "\" of the NVFP4 weight ", prefix,
                " (.weight, .weight_scale and .weight_scale_2 go together)");
  Nvfp4Weight w;
  w.codes = codes;
  w.scales = scales;
  if (shape) {
    w.rows = shape->first;
    w.cols = shape->second;
  } else {
    NVFP4_CHECK(codes->shape.size() == 2, "tensor \"", codes->name, "\": shape ", shape_text(codes->shape),
                ", expected [N, K/2] packed codes");
    w.rows = codes->shape[0];
    w.cols = codes->shape[1] * 2;
  }
  NVFP4_CHECK(w.cols % 16 == 0, "tensor \"", codes->name, "\": K = ", w.cols,
              " is not a multiple of 16 (NVFP4 blocks hold 16 elements)");
  expect(*codes, DType::U8, {w.rows, w.cols / 2});
  expect(*scales, DType::F8E4M3, {w.rows, w.cols / 16});
  expect_scalar(*global);
  if (input) expect_scalar(*input);
  if (read == Nvfp4Read::Headers) return w;
  w.global_scale = read_global_scale(*global);
  if (input) w.input_scale = read_global_scale(*input);
  if (read == Nvfp4Read::Everything)
    check_block_scales(scales->data, w.rows, w.cols / 16, "tensor \"" + scales->name + "\"");
  return w;
}

Nvfp4Weight read_nvfp4_weight(const ModelDir& dir, const std::string& prefix,
                              std::optional<std::pair<int64_t, int64_t>> shape, Nvfp4Read read) {
  const TensorLookup find = [&](const std::string& name) { return dir.has(name) ? &dir.get(name) : nullptr; };
  return read_nvfp4_weight(find, dir.path(), prefix, shape, read);
}

Nvfp4Weight read_nvfp4_weight(const SafetensorsFile& file, const std::string& prefix,
                              std::optional<std::pair<int64_t, int64_t>> shape, Nvfp4Read read) {
  const TensorLookup find = [&](const std::string& name) { return file.find(name); };
  return read_nvfp4_weight(find, file.path(), prefix, shape, read);
}

}  // namespace nvfp4moe
