// Two-level NVFP4 quantization of row-major tensors (docs/numerics.md §2).
//
// The order of operations is the contract (NVIDIA ModelOpt's NVFP4QTensor):
// amax_b, t_b = amax_b / f32(6g) (1 if 0), s_b = e4m3(clamp(t_b, 2^-9, 448)),
// d_b = f32(s_b)*g, q = e2m1(x/d_b) — with true divisions, never a
// multiplication by a reciprocal (that changes ties). quantize_block below
// is written over a fixed 16-wide block so the compiler vectorises it; the
// scalar quantize_rows_ref is the contract line by line, and tests compare both.
#include <algorithm>
#include <cmath>

#include "../common/parallel.hpp"
#include "nvfp4_codec.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

using namespace fmt;

uint8_t e2m1_encode(float v) { return e2m1_from_float(v); }
float e2m1_decode(uint8_t code) { return e2m1_value(code); }
uint8_t e4m3_encode(float v) { return e4m3_from_float(v); }
float e4m3_decode(uint8_t byte) { return e4m3_value(byte); }
float global_scale_for_amax(float amax) { return global_scale_from_amax(amax); }

const char* scope_name(ScaleScope s) {
  switch (s) {
    case ScaleScope::PerTensor: return "per-tensor";
    case ScaleScope::PerRow: return "per-row";
    case ScaleScope::Static: return "static";
  }
  return "?";
}

namespace {

inline float to_f32(float v) { return v; }
inline float to_f32(Bf16 v) { return bf16_to_float(v); }

// max |x_i| over 16 values, NaN if any is NaN. The NaN test is kept apart
// from the max so that the loop vectorises (a select, not a branch).
inline float block_abs_max(const float* x) {
  float amax = 0.0f;
  int nan = 0;
  for (int i = 0; i < kBlock; ++i) {
    float a = std::fabs(x[i]);
    amax = a > amax ? a : amax;
    nan |= int(a != a);
  }
  return nan ? bits_to_float(0x7fc00000u) : amax;
}

// One block of 16: writes 8 code bytes and returns the scale byte.
inline uint8_t quantize_block(const float* x, float g, uint8_t* codes) {
  const uint8_t s = block_scale_byte(block_abs_max(x), g);
  const float d = block_dequant_factor(s, g);
  uint8_t q[kBlock];
  for (int i = 0; i < kBlock; ++i) q[i] = e2m1_from_float(x[i] / d);  // a true division (docs/numerics.md §2)
  for (int i = 0; i < kBlock / 2; ++i) codes[i] = uint8_t(q[2 * i] | (q[2 * i + 1] << 4));
  return s;
}

// max |x| over a span, NaN-propagating; eight independent lanes so it vectorises.
template <typename T>
float span_abs_max(const T* x, int64_t n) {
  float lane[8] = {};
  int nan = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      float a = std::fabs(to_f32(x[i + j]));
      lane[j] = a > lane[j] ? a : lane[j];
      nan |= int(a != a);
    }
  }
  float m = 0.0f;
  for (; i < n; ++i) m = abs_max_nan(m, to_f32(x[i]));
  for (float l : lane) m = l > m ? l : m;
  return nan ? bits_to_float(0x7fc00000u) : m;
}

template <typename T>
void quantize_rows_impl(const T* x, int64_t rows, int64_t cols, int64_t ld, const float* g,
                        int64_t g_stride, uint8_t* codes, uint8_t* scales) {
  NVFP4_CHECK(cols % kBlock == 0, "quantize: K must be a multiple of 16, got K=", cols);
  NVFP4_CHECK(ld >= cols, "quantize: row stride ", ld, " < K=", cols);
  const int64_t kb = cols / kBlock;
  parallel_for(rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, cols)),
               [&](int64_t r0, int64_t r1) {
                 float buf[kBlock];
                 for (int64_t r = r0; r < r1; ++r) {
                   const T* xr = x + r * ld;
                   float gr = g[r * g_stride];
                   for (int64_t b = 0; b < kb; ++b) {
                     for (int i = 0; i < kBlock; ++i) buf[i] = to_f32(xr[b * kBlock + i]);
                     scales[r * kb + b] = quantize_block(buf, gr, codes + r * (cols / 2) + b * (kBlock / 2));
                   }
                 }
               });
}

template <typename T>
float abs_max_impl(const T* x, int64_t n) {
  // Per-chunk partial maxima, reduced on the caller (NaN-propagating).
  std::vector<float> part(size_t(thread_count()), 0.0f);
  int64_t chunk = (n + int64_t(part.size()) - 1) / int64_t(part.size());
  parallel_for(int64_t(part.size()), 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int64_t b = c * chunk, e = std::min(n, (c + 1) * chunk);
      part[size_t(c)] = b < e ? span_abs_max(x + b, e - b) : 0.0f;
    }
  }, n < (1 << 20) ? 1 : 0);
  float m = 0.0f;
  for (float p : part) m = abs_max_nan(m, p);
  return m;
}

template <typename T>
void check_finite_impl(const T* x, int64_t n, const char* what) {
  // A branch-free scan first (vectorises); locate the index only on failure.
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= int(!is_finite(to_f32(x[i])));
  if (!bad) return;
  for (int64_t i = 0; i < n; ++i) {
    float v = to_f32(x[i]);
    NVFP4_CHECK(is_finite(v), what, ": non-finite value ", v, " at flat index ", i);
  }
}

template <typename T>
Nvfp4Matrix quantize_matrix_impl(const T* x, int64_t rows, int64_t cols, ScaleScope scope,
                                 float static_g, bool check, const char* what) {
  NVFP4_CHECK(cols % kBlock == 0, what, ": K must be a multiple of 16, got K=", cols);
  NVFP4_CHECK(rows >= 0, what, ": negative row count ", rows);
  if (check) check_finite_impl(x, rows * cols, what);
  Nvfp4Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.scope = scope;
  m.codes.resize(size_t(rows * cols / 2));
  m.scales.resize(size_t(rows * cols / kBlock));
  switch (scope) {
    case ScaleScope::Static:
      NVFP4_CHECK(is_finite(static_g) && static_g > 0.0f, what,
                  ": static global scale must be finite and > 0, got ", static_g);
      m.global_scale = {static_g};
      break;
    case ScaleScope::PerTensor:
      m.global_scale = {global_scale_from_amax(abs_max_impl(x, rows * cols))};
      break;
    case ScaleScope::PerRow:
      m.global_scale.resize(size_t(rows));
      parallel_for(rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, cols)), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          m.global_scale[size_t(r)] = global_scale_from_amax(span_abs_max(x + r * cols, cols));
      });
      break;
  }
  quantize_rows_impl(x, rows, cols, cols, m.global_scale.data(), m.global_scale.size() == 1 ? 0 : 1,
                     m.codes.data(), m.scales.data());
  return m;
}

template <typename T>
void dequantize_rows_impl(const uint8_t* codes, const uint8_t* scales, const float* g,
                          int64_t g_stride, int64_t rows, int64_t cols, T* out) {
  NVFP4_CHECK(cols % kBlock == 0, "dequantize: K must be a multiple of 16, got K=", cols);
  const int64_t kb = cols / kBlock;
  parallel_for(rows, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, cols)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r) {
                   float gr = g[r * g_stride];
                   for (int64_t b = 0; b < kb; ++b) {
                     float sd = e4m3_value(scales[r * kb + b]);
                     const uint8_t* c = codes + r * (cols / 2) + b * (kBlock / 2);
                     T* o = out + r * cols + b * kBlock;
                     for (int i = 0; i < kBlock; ++i) {
                       uint8_t q = (c[i / 2] >> ((i & 1) * 4)) & 0xF;
                       float v = e2m1_value(q) * sd * gr;
                       if constexpr (std::is_same_v<T, float>) o[i] = v;
                       else o[i] = bf16_from_float(v);
                     }
                   }
                 }
               });
}

}  // namespace

float abs_max(const float* x, int64_t n) { return abs_max_impl(x, n); }
float abs_max(const Bf16* x, int64_t n) { return abs_max_impl(x, n); }

void quantize_rows(const float* x, int64_t rows, int64_t cols, int64_t ld, const float* g,
                   int64_t g_stride, uint8_t* codes, uint8_t* scales) {
  quantize_rows_impl(x, rows, cols, ld, g, g_stride, codes, scales);
}
void quantize_rows(const Bf16* x, int64_t rows, int64_t cols, int64_t ld, const float* g,
                   int64_t g_stride, uint8_t* codes, uint8_t* scales) {
  quantize_rows_impl(x, rows, cols, ld, g, g_stride, codes, scales);
}

void quantize_rows_ref(const float* x, int64_t rows, int64_t cols, int64_t ld, const float* g,
                       int64_t g_stride, uint8_t* codes, uint8_t* scales) {
  NVFP4_CHECK(cols % 16 == 0, "quantize_ref: K must be a multiple of 16, got K=", cols);
  for (int64_t r = 0; r < rows; ++r) {
    const float gr = g[r * g_stride];
    for (int64_t b = 0; b < cols / 16; ++b) {
      const float* xb = x + r * ld + b * 16;
      float amax_b = 0.0f;  // max |x_i|, NaN if any x_i is NaN
      for (int i = 0; i < 16; ++i) {
        float a = std::fabs(xb[i]);
        if (std::isnan(a) || a > amax_b) amax_b = a;
      }
      const float six_g = 6.0f * gr;  // rounded to FP32 before the division
      float t_b = amax_b / six_g;
      if (t_b == 0.0f) t_b = 1.0f;                              // an all-zero block: scale 1.0
      t_b = std::min(std::max(t_b, 0x1p-9f), 448.0f);           // NaN stays NaN
      // A NaN/Inf scope (g) or block (amax_b) is marked NaN, never clamped.
      const uint8_t s_b = std::isfinite(gr) && std::isfinite(amax_b) ? e4m3_from_float(t_b) : uint8_t(0x7F);
      const float d_b = e4m3_value(s_b) * gr;
      for (int i = 0; i < 16; i += 2) {
        const uint8_t lo = e2m1_from_float(xb[i] / d_b);
        const uint8_t hi = e2m1_from_float(xb[i + 1] / d_b);
        codes[r * (cols / 2) + b * 8 + i / 2] = uint8_t(lo | (hi << 4));
      }
      scales[r * (cols / 16) + b] = s_b;
    }
  }
}

Nvfp4Matrix quantize_matrix(const float* x, int64_t rows, int64_t cols, ScaleScope scope,
                            float static_g, bool check, const char* what) {
  return quantize_matrix_impl(x, rows, cols, scope, static_g, check, what);
}
Nvfp4Matrix quantize_matrix(const Bf16* x, int64_t rows, int64_t cols, ScaleScope scope,
                            float static_g, bool check, const char* what) {
  return quantize_matrix_impl(x, rows, cols, scope, static_g, check, what);
}

void dequantize_rows(const uint8_t* codes, const uint8_t* scales, const float* g, int64_t g_stride,
                     int64_t rows, int64_t cols, float* out) {
  dequantize_rows_impl(codes, scales, g, g_stride, rows, cols, out);
}
void dequantize_rows(const uint8_t* codes, const uint8_t* scales, const float* g, int64_t g_stride,
                     int64_t rows, int64_t cols, Bf16* out) {
  dequantize_rows_impl(codes, scales, g, g_stride, rows, cols, out);
}

std::vector<float> dequantize(const Nvfp4Matrix& m) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  dequantize_rows(m.codes.data(), m.scales.data(), m.global_scale.data(),
                  m.global_scale.size() == 1 ? 0 : 1, m.rows, m.cols, out.data());
  return out;
}

void check_finite(const float* x, int64_t n, const char* what) { check_finite_impl(x, n, what); }
void check_finite(const Bf16* x, int64_t n, const char* what) { check_finite_impl(x, n, what); }

}  // namespace nvfp4moe
