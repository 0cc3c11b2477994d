// nvfp4moe — element types and non-owning tensor views.
//
// A TensorView is what every public entry point takes: a pointer, a dtype, the
// device it lives on, a shape and strides in ELEMENTS. Entry points check all
// of them on the host before queuing work (docs/numerics.md §6) and name the
// argument and the values in the error.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

namespace nvfp4moe {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  F64,
  U8,
  I8,
  I16,
  I32,
  I64,
  F8E4M3,  // float8_e4m3fn: scale bytes; read as bit patterns, never cast
  Bool,
  // Further safetensors dtypes: checkpoints may hold them; nvfp4moe copies and
  // inspects them but computes with none (F8E8M0 scale bytes excepted).
  U16,
  U32,
  U64,
  F8E5M2,
  F8E8M0,      // UE8M0 (float8_e8m0fnu): value 2^(byte - 127), 0xFF is NaN; MX block scales
  F8E4M3Fnuz,  // float8_e4m3fnuz: bias 8, no -0, NaN 0x80
  F8E5M2Fnuz,  // float8_e5m2fnuz: bias 16, no -0, NaN 0x80
  F4,          // 4-bit E2M1 elements, two a byte; shapes count elements
  F6E2M3,      // 6-bit elements (OCP MX FP6), packed; shapes count elements
  F6E3M2,
  C64,         // complex64: two F32 (real, imaginary)
};

// Bits per element of a dtype (4 for F4, 6 for F6_*, 8 * bytes otherwise). A
// tensor of n elements holds n * bits / 8 bytes, which must be a whole number.
std::size_t dtype_bits(DType t);
// Bytes per element; throws naming the dtype for the sub-byte ones (F4,
// F6_*), whose size only a whole tensor has (dtype_bits).
std::size_t dtype_size(DType t);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", "F8_E8M0", ...).
const char* dtype_name(DType t);

enum class DeviceKind : uint8_t { Cpu, Cuda };

// BF16 as its bit pattern. Conversions round to nearest even; NaN stays NaN.
struct Bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(Bf16 v) {
  uint32_t u = uint32_t(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline Bf16 bf16_from_float(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return Bf16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return Bf16{uint16_t(u >> 16)};
}

constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  DeviceKind device = DeviceKind::Cpu;
  int device_index = 0;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  bool is_contiguous() const {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != s) return false;
      s *= shape[i];
    }
    return true;
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// A contiguous view over `data` with the given shape.
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                     DeviceKind device = DeviceKind::Cpu, int device_index = 0);

// "[2, 7168]"-style text for error messages.
std::string shape_string(const TensorView& t);

// Throws nvfp4moe::Error naming `arg` unless `t` has this dtype, device, rank
// and shape (a -1 in `shape` accepts any extent) and is contiguous.
void check_tensor(const TensorView& t, const char* arg, DType dtype, DeviceKind device,
                  std::initializer_list<int64_t> shape);

}  // namespace nvfp4moe
