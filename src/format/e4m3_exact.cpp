// Rows of NVFP4 / MXFP4 weights as E4M3 values times a power of two (see
// nvfp4moe/format.hpp): the structural check on codes and scale bytes, and
// its reference on the dequantized values.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "format/mxfp4_codec.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

namespace {

// After r = e_max - 8, the smallest exponent E4M3 holds exactly: 2^-9 for a
// magnitude 1 * 2^e, 1.5 * 2^-8 for 1.5 * 2^e (its subnormal 3 * 2^-9).
constexpr int kTopExponent = 8;
constexpr int kBottomExponent = -9;
constexpr int kMaxSpan = kTopExponent - kBottomExponent;  // 17 binades

// Nonzero E2M1 magnitude 1..7 as m * 2^e: e, and whether m = 1.5.
constexpr int kCodeExponent[8] = {0, -1, 0, 0, 1, 1, 2, 2};
constexpr int kCodeIsOneAndHalf[8] = {0, 0, 0, 1, 0, 1, 0, 1};

// 2^e == f for a positive finite f: true and e; else false.
bool power_of_two(float f, int& e) {
  if (!(f > 0.0f) || !std::isfinite(f)) return false;
  int k = 0;
  if (std::frexp(f, &k) != 0.5f) return false;
  e = k - 1;
  return true;
}

void check_args(const uint8_t* codes, const uint8_t* scales, int block, const float* g, int64_t rows, int64_t cols) {
  NVFP4_CHECK(block == 16 || block == 32, "e4m3_row_shifts: block must be 16 (NVFP4) or 32 (MXFP4), got ", block);
  NVFP4_CHECK(rows >= 0 && cols >= 0 && cols % block == 0, "e4m3_row_shifts: [", rows, ", ", cols,
              "] (cols a multiple of ", block, ")");
  NVFP4_CHECK((codes && scales) || rows * cols == 0, "e4m3_row_shifts: codes or scales are null");
  NVFP4_CHECK(block == 32 || g || rows == 0, "e4m3_row_shifts: NVFP4 rows need their global scales");
}

// The factor of block b of row r (the FP32 the dequantization multiplies by).
float block_factor(const uint8_t* scales, int block, const float* g, int64_t g_stride, int64_t r, int64_t b,
                   int64_t blocks) {
  const uint8_t byte = scales[r * blocks + b];
  return block == 32 ? fmt::ue8m0_value(byte) : fmt::e4m3_value(byte) * g[r * g_stride];
}

std::string not_power_of_two(int64_t r, int64_t b, int block, uint8_t byte, float factor) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "row %lld, columns %lld..%lld: block factor %g (scale byte 0x%02X) is not a power of two",
                (long long)r, (long long)(b * block), (long long)(b * block + block - 1), double(factor), unsigned(byte));
  return buf;
}

std::string too_wide(int64_t r, int top, int bottom) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "row %lld: nonzero weights span 2^%d .. 2^%d (%d binades; one E4M3 shift holds %d)", (long long)r,
                bottom, top + 1, top - bottom, kMaxSpan);
  return buf;
}

// The answer for a row that is not exact: no shifts, the row and why.
E4m3RowShifts not_exact(int64_t r, std::string why) {
  E4m3RowShifts out;
  out.exact = false;
  out.row = r;
  out.why = std::move(why);
  return out;
}

}  // namespace

E4m3RowShifts e4m3_row_shifts(const uint8_t* codes, const uint8_t* scales, int block, const float* g,
                              int64_t g_stride, int64_t rows, int64_t cols) {
  check_args(codes, scales, block, g, rows, cols);
  E4m3RowShifts out;
  out.shift.assign(size_t(rows), 0);
  const int64_t blocks = cols / block;
  for (int64_t r = 0; r < rows; ++r) {
    // top: the largest e + s; bottom: the smallest e + s less one for m = 1.5.
    int top = INT_MIN, bottom = INT_MAX;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* c = codes + r * (cols / 2) + b * (block / 2);
      int hi = INT_MIN, lo = INT_MAX;
      for (int i = 0; i < block / 2; ++i)
        for (const int nib : {c[i] & 7, (c[i] >> 4) & 7}) {
          if (nib == 0) continue;
          hi = std::max(hi, kCodeExponent[nib]);
          lo = std::min(lo, kCodeExponent[nib] - kCodeIsOneAndHalf[nib]);
        }
      if (hi == INT_MIN) continue;  // all zero: any factor
      const uint8_t byte = scales[r * blocks + b];
      int s = int(byte) - 127;  // MXFP4: 2^(byte - 127), 0x00 included
      if (block == 16) {
        const float f = block_factor(scales, block, g, g_stride, r, b, blocks);
        if (f == 0.0f) continue;  // a zero factor: zero weights
        if (!power_of_two(f, s)) {
          return not_exact(r, not_power_of_two(r, b, block, byte, f));
        }
      }
      top = std::max(top, hi + s);
      bottom = std::min(bottom, lo + s);
    }
    if (top == INT_MIN) continue;
    // The dequantized FP32 values are m * 2^(e + s) only while normal or
    // exact subnormal FP32 (down to 2^-149); below that they are not these
    // magnitudes at all.
    if (top - bottom > kMaxSpan || bottom < -148) {
      return not_exact(r, too_wide(r, top, bottom));
    }
    out.shift[size_t(r)] = int16_t(top - kTopExponent);
  }
  return out;
}

E4m3RowShifts e4m3_row_shifts_ref(const uint8_t* codes, const uint8_t* scales, int block, const float* g,
                                  int64_t g_stride, int64_t rows, int64_t cols) {
  check_args(codes, scales, block, g, rows, cols);
  E4m3RowShifts out;
  out.shift.assign(size_t(rows), 0);
  const int64_t blocks = cols / block;
  std::vector<float> v(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    int top = INT_MIN;
    for (int64_t i = 0; i < cols; ++i) {
      const uint8_t byte = codes[r * (cols / 2) + i / 2];
      const uint8_t code = uint8_t(i % 2 ? byte >> 4 : byte & 15);
      const float factor = block_factor(scales, block, g, g_stride, r, i / block, blocks);
      v[size_t(i)] = fmt::e2m1_value(code) * factor;
      if (v[size_t(i)] == 0.0f) continue;
      int e = 0;
      if (factor != 0.0f && !power_of_two(factor, e)) {
        return not_exact(r, not_power_of_two(r, i / block, block, scales[r * blocks + i / block], factor));
      }
      int k = 0;
      std::frexp(v[size_t(i)], &k);
      top = std::max(top, k - 1);
    }
    if (top == INT_MIN) continue;
    const int shift = top - kTopExponent;
    for (int64_t i = 0; i < cols; ++i) {
      const float w = std::ldexp(v[size_t(i)], -shift);
      if (fmt::e4m3_value(fmt::e4m3_from_float(w)) != w) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "row %lld, column %lld: %g / 2^%d is not an E4M3 value", (long long)r,
                      (long long)i, double(v[size_t(i)]), shift);
        return not_exact(r, buf);
      }
    }
    out.shift[size_t(r)] = int16_t(shift);
  }
  return out;
}

}  // namespace nvfp4moe
