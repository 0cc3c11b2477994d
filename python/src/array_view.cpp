#include "array_view.hpp"

#include <string>

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::py {

namespace {

namespace dl = nb::dlpack;

DType dtype_from_dlpack(dl::dtype t, const char* arg) {
  NVFP4_CHECK(t.lanes == 1, arg, ": vector dtypes (lanes=", int(t.lanes), ") are not supported");
  const auto code = dl::dtype_code(t.code);
  const int bits = t.bits;
  switch (code) {
    case dl::dtype_code::Float:
      if (bits == 32) return DType::F32;
      if (bits == 16) return DType::F16;
      if (bits == 64) return DType::F64;
      break;
    case dl::dtype_code::Bfloat:
      if (bits == 16) return DType::BF16;
      break;
    case dl::dtype_code::UInt:
      if (bits == 8) return DType::U8;
      if (bits == 16) return DType::U16;
      if (bits == 32) return DType::U32;
      if (bits == 64) return DType::U64;
      break;
    case dl::dtype_code::Int:
      if (bits == 8) return DType::I8;
      if (bits == 16) return DType::I16;
      if (bits == 32) return DType::I32;
      if (bits == 64) return DType::I64;
      break;
    case dl::dtype_code::Bool:
      return DType::Bool;
    case dl::dtype_code::Float8_E4M3FN:
      return DType::F8E4M3;
    case dl::dtype_code::Float8_E5M2:
      return DType::F8E5M2;
    default:
      break;
  }
  NVFP4_FAIL(arg, ": unsupported dtype (DLPack code ", int(t.code), ", ", bits, " bits)");
}

template <typename Array>
TensorView view_of(const Array& a, const char* arg) {
  NVFP4_CHECK(a.ndim() <= size_t(kMaxDims), arg, ": at most ", kMaxDims, " dimensions, got ", a.ndim());
  TensorView v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = dtype_from_dlpack(a.dtype(), arg);
  const int dev = a.device_type();
  if (dev == nb::device::cpu::value) {
    v.device = DeviceKind::Cpu;
    v.device_index = 0;
  } else if (dev == nb::device::cuda::value) {
    v.device = DeviceKind::Cuda;
    v.device_index = a.device_id();
  } else {
    NVFP4_FAIL(arg, ": arrays on DLPack device type ", dev,
               " are not supported (only cpu and cuda device memory)");
  }
  v.ndim = int(a.ndim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = int64_t(a.shape(size_t(i)));
    v.strides[i] = a.stride(size_t(i));
  }
  return v;
}

}  // namespace

TensorView to_view(const InArray& a, const char* arg) { return view_of(a, arg); }
TensorView to_view(const OutArray& a, const char* arg) { return view_of(a, arg); }

TensorView optional_view(const nb::handle& obj, const char* arg, bool writable) {
  if (obj.is_none()) return TensorView{};
  if (writable) {
    OutArray a;
    NVFP4_CHECK(nb::try_cast(obj, a), arg, ": expected a writable array (NumPy/DLPack), got ",
                nb::inst_name(obj).c_str());
    return to_view(a, arg);
  }
  InArray a;
  NVFP4_CHECK(nb::try_cast(obj, a), arg, ": expected an array (NumPy/DLPack), got ",
              nb::inst_name(obj).c_str());
  return to_view(a, arg);
}

TensorView as_scale_bytes(TensorView v) {
  if (v.dtype == DType::F8E4M3) v.dtype = DType::U8;
  return v;
}

TensorView as_bf16_bits(TensorView v) {
  if (v.dtype == DType::U16) v.dtype = DType::BF16;
  return v;
}

std::string device_string(const TensorView& v) {
  return v.device == DeviceKind::Cpu ? std::string("cpu") : "cuda:" + std::to_string(v.device_index);
}

void check_same_device(const TensorView& v, const char* arg, const TensorView& ref, const char* ref_arg) {
  NVFP4_CHECK(v.device == ref.device && (v.device == DeviceKind::Cpu || v.device_index == ref.device_index),
              arg, ": on ", device_string(v), " but ", ref_arg, " is on ", device_string(ref),
              " (all arrays of one call must share a device)");
}

}  // namespace nvfp4moe::py
