// MXFP4 on the host: the UE8M0 codec, scale checks and dequantization
// (docs/numerics.md §7). The element values come from the one codec of
// src/format/mxfp4_codec.hpp.
#include <cmath>

#include "format/mxfp4_codec.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

static_assert(kMxfp4BlockSize == fmt::kMxBlock, "one MXFP4 block size for the API and the codec");

float ue8m0_decode(uint8_t byte) { return fmt::ue8m0_value(byte); }

namespace {

// The largest byte whose block values all stay finite: 6 * 2^(0xFC - 127) = 1.5 * 2^127.
constexpr uint8_t kMaxFiniteScaleByte = 0xFC;

void check_cols(int64_t cols, const char* who) {
  NVFP4_CHECK(cols > 0 && cols % kMxfp4BlockSize == 0, who, ": cols must be a positive multiple of 32 (the MXFP4 ",
              "block), got ", cols);
}

template <typename Out, typename Convert>
void dequantize_impl(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Out* out,
                     Convert&& convert) {
  check_cols(cols, "dequantize_mxfp4_rows");
  const int64_t kb = cols / kMxfp4BlockSize;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const float s = fmt::ue8m0_value(scales[r * kb + b]);
      const uint8_t* c = codes + r * (cols / 2) + b * (kMxfp4BlockSize / 2);
      Out* o = out + r * cols + b * kMxfp4BlockSize;
      for (int i = 0; i < kMxfp4BlockSize / 2; ++i) {
        o[2 * i] = convert(fmt::e2m1_value(uint8_t(c[i] & 15)) * s);
        o[2 * i + 1] = convert(fmt::e2m1_value(uint8_t(c[i] >> 4)) * s);
      }
    }
}

}  // namespace

void check_mxfp4_scales(const uint8_t* scales, int64_t rows, int64_t cols, const char* what) {
  check_cols(cols, what);
  const int64_t kb = cols / kMxfp4BlockSize;
  for (int64_t i = 0; i < rows * kb; ++i) {
    const uint8_t b = scales[i];
    NVFP4_CHECK(b != fmt::kUe8m0NaN, what, ": UE8M0 scale of row ", i / kb, ", block ", i % kb,
                " is the NaN byte 0xff");
    NVFP4_CHECK(b <= kMaxFiniteScaleByte, what, ": UE8M0 scale of row ", i / kb, ", block ", i % kb, " is 0x",
                std::hex, int(b), std::dec, " (2^", int(b) - 127, "); above 0xfc the block's values 6 * 2^",
                int(b) - 127, " overflow FP32");
  }
}

void dequantize_mxfp4_rows(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, float* out) {
  dequantize_impl(codes, scales, rows, cols, out, [](float v) { return v; });
}

void dequantize_mxfp4_rows(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Bf16* out) {
  // Exact: value(q) * 2^k has at most 3 significant bits.
  dequantize_impl(codes, scales, rows, cols, out, [](float v) { return bf16_from_float(v); });
}

std::vector<float> dequantize(const Mxfp4Matrix& m) {
  NVFP4_CHECK(int64_t(m.codes.size()) == m.rows * m.cols / 2 && int64_t(m.scales.size()) == m.rows * m.cols / 32,
              "dequantize(Mxfp4Matrix): ", m.codes.size(), " code bytes and ", m.scales.size(),
              " scale bytes for a [", m.rows, ", ", m.cols, "] matrix");
  std::vector<float> out(size_t(m.rows * m.cols));
  dequantize_mxfp4_rows(m.codes.data(), m.scales.data(), m.rows, m.cols, out.data());
  return out;
}

}  // namespace nvfp4moe
