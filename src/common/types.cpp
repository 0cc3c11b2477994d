#include "nvfp4moe/types.hpp"

#include <sstream>

#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

std::size_t dtype_bits(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64:
    case DType::U64:
    case DType::C64: return 64;
    case DType::F32:
    case DType::I32:
    case DType::U32: return 32;
    case DType::F16:
    case DType::BF16:
    case DType::I16:
    case DType::U16: return 16;
    case DType::U8:
    case DType::I8:
    case DType::F8E4M3:
    case DType::F8E5M2:
    case DType::F8E8M0:
    case DType::F8E4M3Fnuz:
    case DType::F8E5M2Fnuz:
    case DType::Bool: return 8;
    case DType::F6E2M3:
    case DType::F6E3M2: return 6;
    case DType::F4: return 4;
  }
  NVFP4_FAIL("unknown dtype ", int(t));
}

std::size_t dtype_size(DType t) {
  const std::size_t bits = dtype_bits(t);
  NVFP4_CHECK(bits % 8 == 0, "dtype ", dtype_name(t), " has ", bits,
              "-bit elements: a size in bytes exists only for a whole tensor");
  return bits / 8;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::U8: return "U8";
    case DType::I8: return "I8";
    case DType::I16: return "I16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::F8E4M3: return "F8_E4M3";
    case DType::Bool: return "BOOL";
    case DType::U16: return "U16";
    case DType::U32: return "U32";
    case DType::U64: return "U64";
    case DType::F8E5M2: return "F8_E5M2";
    case DType::F8E8M0: return "F8_E8M0";
    case DType::F8E4M3Fnuz: return "F8_E4M3FNUZ";
    case DType::F8E5M2Fnuz: return "F8_E5M2FNUZ";
    case DType::F4: return "F4";
    case DType::F6E2M3: return "F6_E2M3";
    case DType::F6E3M2: return "F6_E3M2";
    case DType::C64: return "C64";
  }
  return "?";
}

TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                     DeviceKind device, int device_index) {
  NVFP4_CHECK(shape.size() <= std::size_t(kMaxDims), "at most ", kMaxDims, " dims, got ",
              shape.size());
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.device_index = device_index;
  v.ndim = int(shape.size());
  int i = 0;
  for (int64_t s : shape) v.shape[i++] = s;
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  return v;
}

std::string shape_string(const TensorView& t) {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < t.ndim; ++i) os << (i ? ", " : "") << t.shape[i];
  os << "]";
  return os.str();
}

void check_tensor(const TensorView& t, const char* arg, DType dtype, DeviceKind device,
                  std::initializer_list<int64_t> shape) {
  NVFP4_CHECK(t.data != nullptr || t.numel() == 0, arg, ": null data pointer");
  NVFP4_CHECK(t.dtype == dtype, arg, ": dtype ", dtype_name(t.dtype), ", expected ",
              dtype_name(dtype));
  NVFP4_CHECK(t.device == device, arg, ": on ", t.device == DeviceKind::Cpu ? "cpu" : "cuda",
              ", expected ", device == DeviceKind::Cpu ? "cpu" : "cuda");
  NVFP4_CHECK(t.ndim == int(shape.size()), arg, ": rank ", t.ndim, " (shape ", shape_string(t),
              "), expected rank ", shape.size());
  int i = 0;
  for (int64_t s : shape) {
    NVFP4_CHECK(s < 0 || t.shape[i] == s, arg, ": shape ", shape_string(t), ", dim ", i,
                " expected ", s);
    ++i;
  }
  NVFP4_CHECK(t.is_contiguous(), arg, ": must be contiguous (shape ", shape_string(t), ")");
}

}  // namespace nvfp4moe
