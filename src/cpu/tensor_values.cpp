// The values of a forward's host tensors (see tensor_values.hpp).
#include "cpu/tensor_values.hpp"

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cpu {

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

}  // namespace nvfp4moe::cpu
