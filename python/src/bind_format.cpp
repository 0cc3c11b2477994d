// nvfp4moe._C: quantize / dequantize / scale layouts over DLPack arrays
// (docs/numerics.md §2-3). Outputs are allocated by the Python layer and written
// in place; host arrays go through src/format, device arrays through
// device_format.cu on the caller's stream.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "array_view.hpp"
#include "bindings.hpp"
#include "device_format.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe::py {

namespace {

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

ScaleScope parse_scope(const std::string& s) {
  if (s == "per_row") return ScaleScope::PerRow;
  if (s == "per_tensor") return ScaleScope::PerTensor;
  if (s == "static") return ScaleScope::Static;
  NVFP4_FAIL("scope: unknown scope '", s, "', expected per_row, per_tensor or static");
}

bool parse_layout(const std::string& s) {
  if (s == "linear") return false;
  if (s == "swizzled") return true;
  NVFP4_FAIL("layout: unknown layout '", s, "', expected linear or swizzled");
}

// The scale bytes' expected shape: [rows, k] linear, [Rp, kp] swizzled.
void check_scales(const TensorView& s, const char* arg, int64_t rows, int64_t k, bool swizzled, DeviceKind dev) {
  if (swizzled)
    check_tensor(s, arg, DType::U8, dev, {round_up(rows, 128), round_up(k, 4)});
  else
    check_tensor(s, arg, DType::U8, dev, {rows, k});
}

void check_cuda_build(const TensorView& v, const char* what) {
#ifndef NVFP4MOE_HAS_CUDA
  NVFP4_CHECK(v.device == DeviceKind::Cpu, what, ": the array is on ", device_string(v),
              " but this build of nvfp4moe has no CUDA support");
#else
  (void)v;
  (void)what;
#endif
}

void quantize(const InArray& x_arr, const std::string& scope_name, std::optional<float> static_g,
              const OutArray& codes_arr, const OutArray& scales_arr, const OutArray& g_out_arr,
              const std::string& layout, uintptr_t stream, nb::handle g_rows_scratch_arr,
              nb::handle amax_scratch_arr) {
  const ScaleScope scope = parse_scope(scope_name);
  const bool swizzled = parse_layout(layout);
  TensorView x = as_bf16_bits(to_view(x_arr, "x"));
  NVFP4_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "x: dtype ", dtype_name(x.dtype),
              ", expected float32 or bfloat16");
  NVFP4_CHECK(x.ndim == 2, "x: rank ", x.ndim, " (shape ", shape_string(x), "), expected a 2-D [rows, K] array");
  const int64_t rows = x.shape[0], cols = x.shape[1];
  NVFP4_CHECK(cols % kBlockSize == 0, "x: K (the last dimension) must be a multiple of 16, got K=", cols,
              " (shape ", shape_string(x), ")");
  check_tensor(x, "x", x.dtype, x.device, {rows, cols});  // contiguity
  check_cuda_build(x, "x");
  TensorView codes = to_view(codes_arr, "codes");
  TensorView scales = as_scale_bytes(to_view(scales_arr, "scales"));
  TensorView g_out = to_view(g_out_arr, "global_scale");
  check_same_device(codes, "codes", x, "x");
  check_same_device(scales, "scales", x, "x");
  check_same_device(g_out, "global_scale", x, "x");
  check_tensor(codes, "codes", DType::U8, x.device, {rows, cols / 2});
  check_scales(scales, "scales", rows, cols / kBlockSize, swizzled, x.device);
  check_tensor(g_out, "global_scale", DType::F32, x.device, {scope == ScaleScope::PerRow ? rows : 1});
  if (scope == ScaleScope::Static) {
    NVFP4_CHECK(static_g.has_value(), "global_scale: scope 'static' needs a global scale");
    NVFP4_CHECK(std::isfinite(*static_g) && *static_g > 0.0f,
                "global_scale: a static global scale must be finite and > 0, got ", *static_g);
  } else {
    NVFP4_CHECK(!static_g.has_value(), "global_scale: only scope 'static' takes a global scale, got scope '",
                scope_name, "'");
  }

  if (x.device == DeviceKind::Cuda) {
#ifdef NVFP4MOE_HAS_CUDA
    TensorView g_rows, amax;
    if (scope != ScaleScope::PerRow) {  // the staging kernel writes one g per row
      g_rows = optional_view(g_rows_scratch_arr, "g_rows_scratch", true);
      check_same_device(g_rows, "g_rows_scratch", x, "x");
      check_tensor(g_rows, "g_rows_scratch", DType::F32, x.device, {rows});
    }
    if (scope == ScaleScope::PerTensor) {
      amax = optional_view(amax_scratch_arr, "amax_scratch", true);
      check_same_device(amax, "amax_scratch", x, "x");
      check_tensor(amax, "amax_scratch", DType::I32, x.device, {1});
    }
    DeviceQuantizeArgs a;
    a.x = x.data;
    a.x_is_bf16 = x.dtype == DType::BF16;
    a.rows = rows;
    a.cols = cols;
    a.scope = scope;
    a.static_g = static_g.value_or(1.0f);
    a.g_out = g_out.ptr<float>();
    a.g_rows_scratch = g_rows.ptr<float>();
    a.amax_scratch = amax.ptr<uint32_t>();
    a.codes = codes.ptr<uint8_t>();
    a.scales = scales.ptr<uint8_t>();
    a.swizzled = swizzled;
    a.device = x.device_index;
    a.stream = reinterpret_cast<void*>(stream);
    nb::gil_scoped_release release;
    quantize_device(a);
#endif
    return;
  }

  nb::gil_scoped_release release;
  float* g = g_out.ptr<float>();
  auto amax = [&](int64_t offset, int64_t n) {
    return x.dtype == DType::F32 ? abs_max(x.ptr<const float>() + offset, n)
                                 : abs_max(x.ptr<const Bf16>() + offset, n);
  };
  switch (scope) {
    case ScaleScope::Static:
      g[0] = *static_g;
      break;
    case ScaleScope::PerTensor:
      g[0] = global_scale_for_amax(amax(0, rows * cols));
      break;
    case ScaleScope::PerRow:
      for (int64_t r = 0; r < rows; ++r) g[r] = global_scale_for_amax(amax(r * cols, cols));
      break;
  }
  const int64_t g_stride = scope == ScaleScope::PerRow ? 1 : 0;
  std::vector<uint8_t> linear;
  uint8_t* linear_out = scales.ptr<uint8_t>();
  if (swizzled) {
    linear.resize(size_t(rows * (cols / kBlockSize)));
    linear_out = linear.data();
  }
  if (x.dtype == DType::F32)
    quantize_rows(x.ptr<const float>(), rows, cols, cols, g, g_stride, codes.ptr<uint8_t>(), linear_out);
  else
    quantize_rows(x.ptr<const Bf16>(), rows, cols, cols, g, g_stride, codes.ptr<uint8_t>(), linear_out);
  if (swizzled) scales_linear_to_swizzled(linear.data(), rows, cols / kBlockSize, scales.ptr<uint8_t>());
}

void dequantize(const InArray& codes_arr, const InArray& scales_arr, const InArray& g_arr, const OutArray& out_arr,
                const std::string& layout, uintptr_t stream) {
  const bool swizzled = parse_layout(layout);
  TensorView codes = to_view(codes_arr, "codes");
  TensorView scales = as_scale_bytes(to_view(scales_arr, "scales"));
  TensorView g = to_view(g_arr, "global_scale");
  TensorView out = as_bf16_bits(to_view(out_arr, "out"));
  NVFP4_CHECK(codes.ndim == 2, "codes: rank ", codes.ndim, " (shape ", shape_string(codes),
              "), expected a 2-D [rows, K/2] uint8 array");
  const int64_t rows = codes.shape[0], cols = codes.shape[1] * 2;
  NVFP4_CHECK(cols % kBlockSize == 0, "codes: K = 2 * ", codes.shape[1], " = ", cols, " is not a multiple of 16");
  check_tensor(codes, "codes", DType::U8, codes.device, {rows, cols / 2});
  check_cuda_build(codes, "codes");
  check_same_device(scales, "scales", codes, "codes");
  check_same_device(g, "global_scale", codes, "codes");
  check_same_device(out, "out", codes, "codes");
  check_scales(scales, "scales", rows, cols / kBlockSize, swizzled, codes.device);
  NVFP4_CHECK(g.ndim == 1 && (g.shape[0] == 1 || g.shape[0] == rows), "global_scale: shape ", shape_string(g),
              ", expected [1] or [rows=", rows, "]");
  check_tensor(g, "global_scale", DType::F32, codes.device, {g.shape[0]});
  NVFP4_CHECK(out.dtype == DType::F32 || out.dtype == DType::BF16, "out: dtype ", dtype_name(out.dtype),
              ", expected float32 or bfloat16");
  check_tensor(out, "out", out.dtype, codes.device, {rows, cols});
  const int64_t g_stride = g.shape[0] == 1 ? 0 : 1;

  if (codes.device == DeviceKind::Cuda) {
#ifdef NVFP4MOE_HAS_CUDA
    DeviceDequantizeArgs a;
    a.codes = codes.ptr<const uint8_t>();
    a.scales = scales.ptr<const uint8_t>();
    a.swizzled = swizzled;
    a.g = g.ptr<const float>();
    a.g_stride = g_stride;
    a.rows = rows;
    a.cols = cols;
    a.out = out.data;
    a.out_is_bf16 = out.dtype == DType::BF16;
    a.device = codes.device_index;
    a.stream = reinterpret_cast<void*>(stream);
    nb::gil_scoped_release release;
    dequantize_device(a);
#endif
    return;
  }
  nb::gil_scoped_release release;
  std::vector<uint8_t> linear;
  const uint8_t* linear_in = scales.ptr<const uint8_t>();
  if (swizzled) {
    linear.resize(size_t(rows * (cols / kBlockSize)));
    scales_swizzled_to_linear(scales.ptr<const uint8_t>(), rows, cols / kBlockSize, linear.data());
    linear_in = linear.data();
  }
  if (out.dtype == DType::F32)
    dequantize_rows(codes.ptr<const uint8_t>(), linear_in, g.ptr<const float>(), g_stride, rows, cols,
                    out.ptr<float>());
  else
    dequantize_rows(codes.ptr<const uint8_t>(), linear_in, g.ptr<const float>(), g_stride, rows, cols,
                    out.ptr<Bf16>());
}

// in -> out between the linear [rows, k] and swizzled [Rp, kp] layouts.
void convert_scales(const InArray& in_arr, const OutArray& out_arr, bool to_swizzled, uintptr_t stream) {
  TensorView in = as_scale_bytes(to_view(in_arr, "scales"));
  TensorView out = as_scale_bytes(to_view(out_arr, "out"));
  check_cuda_build(in, "scales");
  check_same_device(out, "out", in, "scales");
  const TensorView& linear = to_swizzled ? in : out;
  NVFP4_CHECK(linear.ndim == 2, to_swizzled ? "scales" : "out", ": the linear scales must be 2-D [rows, K/16], got shape ",
              shape_string(linear));
  const int64_t rows = linear.shape[0], k = linear.shape[1];
  check_scales(in, "scales", rows, k, !to_swizzled, in.device);
  check_scales(out, "out", rows, k, to_swizzled, in.device);
  if (in.device == DeviceKind::Cuda) {
#ifdef NVFP4MOE_HAS_CUDA
    nb::gil_scoped_release release;
    scales_layout_device(in.ptr<const uint8_t>(), out.ptr<uint8_t>(), rows, k, to_swizzled, in.device_index,
                         reinterpret_cast<void*>(stream));
#endif
    return;
  }
  nb::gil_scoped_release release;
  if (to_swizzled)
    scales_linear_to_swizzled(in.ptr<const uint8_t>(), rows, k, out.ptr<uint8_t>());
  else
    scales_swizzled_to_linear(in.ptr<const uint8_t>(), rows, k, out.ptr<uint8_t>());
}

}  // namespace

void bind_format(nb::module_& m) {
  m.def("quantize", &quantize, nb::arg("x"), nb::arg("scope"), nb::arg("static_global_scale").none(),
        nb::arg("codes"), nb::arg("scales"), nb::arg("global_scale"), nb::arg("layout"), nb::arg("stream"),
        nb::arg("g_rows_scratch").none() = nb::none(), nb::arg("amax_scratch").none() = nb::none(),
        "Quantize x [rows, K] (float32/bfloat16) into caller-allocated codes [rows, K/2], scales "
        "(linear [rows, K/16] or swizzled [ceil128(rows), ceil4(K/16)]) and global_scale ([rows] for "
        "per_row, else [1]). Device arrays: queued on `stream`; per_tensor and static scopes then also "
        "need device scratch g_rows_scratch float32 [rows], and per_tensor amax_scratch int32 [1].");
  m.def("dequantize", &dequantize, nb::arg("codes"), nb::arg("scales"), nb::arg("global_scale"), nb::arg("out"),
        nb::arg("layout"), nb::arg("stream"),
        "out [rows, K] (float32/bfloat16) = value(code) * e4m3(scale) * global_scale.");
  m.def(
      "scales_to_swizzled",
      [](const InArray& in, const OutArray& out, uintptr_t stream) { convert_scales(in, out, true, stream); },
      nb::arg("scales"), nb::arg("out"), nb::arg("stream"));
  m.def(
      "scales_to_linear",
      [](const InArray& in, const OutArray& out, uintptr_t stream) { convert_scales(in, out, false, stream); },
      nb::arg("scales"), nb::arg("out"), nb::arg("stream"));
  m.def("e2m1_encode", &e2m1_encode, nb::arg("v"));
  m.def("e2m1_decode", &e2m1_decode, nb::arg("code"));
  m.def("e4m3_encode", &e4m3_encode, nb::arg("v"));
  m.def("e4m3_decode", &e4m3_decode, nb::arg("byte"));
  m.def("global_scale_for_amax", &global_scale_for_amax, nb::arg("amax"));
}

}  // namespace nvfp4moe::py
