// Exact integer dots of NVFP4 weight rows with NVFP4 activation rows.
//
// Both operands are 4-bit codes times a per-16-block scale. With the weight
// code as the integer iw = 2 * value(q) in [-12, 12] and the activation value
// as v = ia * sigma (ia an integer in [-12, 12], sigma its block's scale / 2),
// the sum over 8 consecutive elements of a block is
//   sum(v * value(q) * s_w) = isum * (s_w * sigma / 2),  isum = sum(ia * iw),
// isum an exact integer (|isum| <= 1152), and the product isum * s_w * sigma
// has at most 12 + 4 + 8 significant bits: exact in FP32. So every product and
// every half-block sum is exact, and the only rounding is the FP32
// accumulation of the half-block terms: per 128-element chunk 16 lanes (lane l:
// elements 8l .. 8l+7), each lane summed over the chunks in order, then the 16
// lanes summed pairwise (l + 8, l + 4, l + 2, l + 1). The SIMD versions
// (nvfp4_int_dot.cpp) follow that order and equal the *_ref bit for bit.
//
// The weights stay as stored (codes [N, K/2], UE4M3 scales [N, K/16]); the
// activation is packed once per row (pack_int_act_row) into the order the
// SIMD code reads: per chunk, the low nibbles' elements (even) then the high
// nibbles' (odd), so 64 code bytes split into two byte vectors meet their
// activations without a shuffle.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/cpu_kernels.hpp"

namespace nvfp4moe::cpu {

constexpr int64_t kIntChunk = 128;  // K elements per chunk: 64 code bytes
constexpr int kIntLanes = 16;       // lanes per chunk, 8 elements each
constexpr int kIntDotTokens = 8;    // tokens per call of int_dot_rows_tokens
constexpr int kIntWeightBias = 12;  // weight bytes are iw + 12 in [0, 24] (unsigned operand)

inline int64_t int_chunks(int64_t K) { return (K + kIntChunk - 1) / kIntChunk; }

// iw + 12 per E2M1 code: 2 * value(code) + 12.
struct IntWeightTable {
  uint8_t u[16];
  IntWeightTable() {
    for (int c = 0; c < 16; ++c) u[c] = uint8_t(int(2.0f * fmt::e2m1_value(uint8_t(c))) + kIntWeightBias);
  }
};

// One packed activation row (chunks = int_chunks(K)):
//   q      [chunks * 128]: element 128c + 2j at q[128c + j], 128c + 2j + 1 at
//          q[128c + 64 + j]; 0 past K
//   scale  [chunks * 16]: lane l of chunk c: 128 * sigma of its block (the
//          weight's scale enters as e4m3 / 256, see int_lane_weight_scale); 0 past K
//   bias   [chunks * 16]: -12 * (sum of the lane's 8 q), removing the +12 of the weight bytes
struct IntActRow {
  const int8_t* q;
  const float* scale;
  const int32_t* bias;
};

// Packed rows with their storage; exact[r] says whether row r packed (else
// its dots must take the float path).
struct IntActRows {
  int64_t K = 0, chunks = 0;
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> bias;
  std::vector<uint8_t> exact;
  void resize(int64_t rows, int64_t k) {
    K = k;
    chunks = int_chunks(k);
    q.assign(size_t(rows * chunks * kIntChunk), 0);
    scale.assign(size_t(rows * chunks * kIntLanes), 0.0f);
    bias.assign(size_t(rows * chunks * kIntLanes), 0);
    exact.assign(size_t(rows), 0);
  }
  IntActRow row(int64_t r) const {
    return {q.data() + r * chunks * kIntChunk, scale.data() + r * chunks * kIntLanes,
            bias.data() + r * chunks * kIntLanes};
  }
};

// Packs one row of K values (K a multiple of 16) that are NVFP4 QDQ values
// without g (value(q) * f32(s) per 16-block, what qdq_rows writes). A block
// holding NaN gets sigma = NaN (its dots turn NaN, as FP32 dots would).
// Returns false when a block has no decomposition v = ia * sigma with integer
// |ia| <= 12 and sigma of at most 8 significant bits in [2^-100, 2^100] (Inf,
// or values that are not NVFP4 QDQ values); the row's buffers are then
// unspecified. rows: `r` of `rows`.
bool pack_int_act_row(const float* v, int64_t K, IntActRows& rows, int64_t r);

// The weight scale of a lane as the dots use it: e4m3(byte) / 256 (exact).
inline float int_lane_weight_scale(const E2m1PairTable& lut, uint8_t byte) { return lut.e4m3[byte] * (1.0f / 256.0f); }

// Activation element e of a packed row.
inline int8_t int_act_at(const IntActRow& a, int64_t e) {
  const int64_t c = e / kIntChunk, j = e % kIntChunk;
  return a.q[c * kIntChunk + (j & 1) * 64 + j / 2];
}

// The definition: dot of packed activation `a` with one NVFP4 weight row
// (codes [K/2], scales [K/16]), without the global scales.
inline float int_dot_row_ref(const E2m1PairTable& lut, const IntWeightTable& wt, const IntActRow& a,
                             const uint8_t* codes, const uint8_t* scales, int64_t K) {
  float acc[kIntLanes] = {};
  for (int64_t c = 0; c < int_chunks(K); ++c)
    for (int l = 0; l < kIntLanes; ++l) {
      const int64_t e0 = c * kIntChunk + 8 * l;
      int32_t isum = a.bias[c * kIntLanes + l];
      float sw = 0.0f;  // past K: zero codes meet zero activations and a zero scale
      if (e0 < K) {
        for (int64_t e = e0; e < e0 + 8; ++e)
          isum += int32_t(wt.u[(codes[e / 2] >> ((e & 1) * 4)) & 15]) * int32_t(int_act_at(a, e));
        sw = int_lane_weight_scale(lut, scales[e0 / 16]);
      }
      acc[l] += float(isum) * sw * a.scale[c * kIntLanes + l];  // both products exact
    }
  for (int h = kIntLanes / 2; h >= 1; h /= 2)
    for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
  return acc[0];
}

// out[t * ldo + r] = int_dot_row_ref(a[t], weight row r), t < m <= kIntDotTokens, r < n.
inline void int_dot_rows_tokens_ref(const E2m1PairTable& lut, const IntActRow* a, int m, const uint8_t* codes,
                                    const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo) {
  const IntWeightTable wt;
  for (int t = 0; t < m; ++t)
    for (int64_t r = 0; r < n; ++r)
      out[t * ldo + r] = int_dot_row_ref(lut, wt, a[t], codes + r * (K / 2), scales + r * (K / 16), K);
}

// Which code int_dot_rows_tokens runs: AVX-512 (F, BW, VL, VNNI), AVX2 (with
// FMA, F16C), or the reference. Each is selectable for tests where the CPU has it.
enum class IntDotIsa { Scalar, Avx2, Avx512 };
bool int_dot_isa_available(IntDotIsa isa);
IntDotIsa int_dot_isa_best();
const char* int_dot_isa_name(IntDotIsa isa);

// Same contract as int_dot_rows_tokens_ref, on the best available ISA or a given one.
void int_dot_rows_tokens(const E2m1PairTable& lut, const IntActRow* a, int m, const uint8_t* codes,
                         const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo);
void int_dot_rows_tokens(IntDotIsa isa, const E2m1PairTable& lut, const IntActRow* a, int m, const uint8_t* codes,
                         const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo);

}  // namespace nvfp4moe::cpu
