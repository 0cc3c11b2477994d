#include "checkpoint/dtypes.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

DType parse_safetensors_dtype(const std::string& s) {
  static const std::pair<const char*, DType> kNames[] = {
      {"F64", DType::F64},         {"F32", DType::F32},         {"F16", DType::F16},
      {"BF16", DType::BF16},       {"I64", DType::I64},         {"I32", DType::I32},
      {"I16", DType::I16},         {"I8", DType::I8},           {"U64", DType::U64},
      {"U32", DType::U32},         {"U16", DType::U16},         {"U8", DType::U8},
      {"BOOL", DType::Bool},       {"F8_E4M3", DType::F8E4M3},  {"F8_E5M2", DType::F8E5M2},
      {"F8_E8M0", DType::F8E8M0},  {"F8_E4M3FNUZ", DType::F8E4M3Fnuz},
      {"F8_E5M2FNUZ", DType::F8E5M2Fnuz},  {"F4", DType::F4},   {"F6_E2M3", DType::F6E2M3},
      {"F6_E3M2", DType::F6E3M2},  {"C64", DType::C64},
  };
  for (const auto& [name, t] : kNames)
    if (s == name) return t;
  NVFP4_FAIL("unknown or unsupported safetensors dtype '", s,
             "' (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL F8_E4M3 F8_E5M2 F8_E8M0 "
             "F8_E4M3FNUZ F8_E5M2FNUZ F4 F6_E2M3 F6_E3M2 C64)");
}

namespace dtypes {

uint64_t tensor_bytes(DType dtype, const std::vector<int64_t>& shape, const std::string& what) {
  // bits = numel * bits-per-element, checked: a hostile shape must not wrap.
  uint64_t bits = dtype_bits(dtype);
  for (int64_t d : shape) {
    NVFP4_CHECK(d >= 0, what, ": negative dimension ", d, " in shape");
    NVFP4_CHECK(!__builtin_mul_overflow(bits, uint64_t(d), &bits), what, ": shape size overflows 64 bits");
  }
  NVFP4_CHECK(bits % 8 == 0, what, ": ", bits, " bits of ", dtype_name(dtype),
              " are not a whole number of bytes (the reference implementation refuses such a tensor)");
  return bits / 8;
}

float f16_value(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const int exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(mant), -24);  // zero or subnormal
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint32_t u = exp == 31 ? (sign | 0x7F800000u | (mant << 13))
                               : (sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13));
  std::memcpy(&f, &u, 4);
  return f;
}

float e5m2_value(uint8_t b) { return f16_value(uint16_t(uint16_t(b) << 8)); }

float e8m0_value(uint8_t b) {
  if (b == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(b) - 127);  // 2^-127 (b = 0) is an FP32 subnormal, exact
}

namespace {

// An FNUZ float8: no infinities, no negative zero, the one NaN 0x80.
float fnuz_value(uint8_t b, int mant_bits, int bias) {
  if (b == 0x80) return std::numeric_limits<float>::quiet_NaN();
  const int e = (b & 0x7F) >> mant_bits, m = b & ((1 << mant_bits) - 1);
  const float mag = e == 0 ? std::ldexp(float(m), 1 - bias - mant_bits)
                           : std::ldexp(float((1 << mant_bits) + m), e - bias - mant_bits);
  return (b & 0x80) ? -mag : mag;
}

}  // namespace

float e4m3fnuz_value(uint8_t b) { return fnuz_value(b, 3, 8); }
float e5m2fnuz_value(uint8_t b) { return fnuz_value(b, 2, 16); }

bool is_float_readable(DType t) {
  switch (t) {
    case DType::F64:
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::F8E4M3:
    case DType::F8E5M2:
    case DType::F8E8M0:
    case DType::F8E4M3Fnuz:
    case DType::F8E5M2Fnuz: return true;
    default: return false;
  }
}

float element_value(DType t, const uint8_t* data, int64_t i) {
  switch (t) {
    case DType::F64: {
      double d;
      std::memcpy(&d, data + 8 * i, 8);
      return float(d);
    }
    case DType::F32: {
      float f;
      std::memcpy(&f, data + 4 * i, 4);
      return f;
    }
    case DType::F16:
    case DType::BF16: {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      return t == DType::F16 ? f16_value(h) : bf16_to_float(Bf16{h});
    }
    case DType::F8E4M3: return fmt::e4m3_value(data[i]);
    case DType::F8E5M2: return e5m2_value(data[i]);
    case DType::F8E8M0: return e8m0_value(data[i]);
    case DType::F8E4M3Fnuz: return e4m3fnuz_value(data[i]);
    case DType::F8E5M2Fnuz: return e5m2fnuz_value(data[i]);
    default: NVFP4_FAIL("dtype ", dtype_name(t), " has no float value");
  }
}

}  // namespace dtypes
}  // namespace nvfp4moe
