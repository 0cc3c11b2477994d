// The counter-based generator of the synthetic layers (moe.hpp,
// make_synthetic_moe): row r of tensor `tag` of expert e is a splitmix64
// stream keyed by (seed, tag, e, r); its draw j is splitmix64_mix(key +
// (j + 1) * gamma), so any element can be computed alone — on the host one
// row at a time, on a GPU one element per thread, with the same bits.
//
// A value is Irwin-Hall(4): the sum of four 16-bit uniforms of one draw,
// rescaled to unit variance (close enough to normal for weights, ~10x
// cheaper than Box-Muller at DeepSeek-V4-Pro's 25 G values). The products
// and sums are rounded one by one (no fused multiply-add), so host and
// device agree bit for bit. After the row's `cols` values its next draw u
// puts one x8 outlier at column (u >> 3) % cols when u % 8 == 0.
#pragma once

#include <cstdint>

#include "common/splitmix.hpp"
#include "format/nvfp4_codec.hpp"

namespace nvfp4moe {

// Tensor tags: part of every row's stream key.
enum SyntheticTag : uint64_t {
  kSynW1 = 1, kSynW3, kSynW2, kSynGate, kSynBias, kSynSharedW1, kSynSharedW3, kSynSharedW2, kSynTid2eid, kSynInput,
  kSynScales
};

NVFP4_HD uint64_t synthetic_row_key(uint64_t seed, uint64_t tag, int64_t expert, int64_t row) {
  return splitmix64_mix(splitmix64_mix(splitmix64_mix(seed ^ (tag * kSplitMixGamma)) + uint64_t(expert)) +
                        uint64_t(row));
}

// Draw j (0-based) of the stream with `key`.
NVFP4_HD uint64_t synthetic_draw(uint64_t key, int64_t j) {
  return splitmix64_mix(key + uint64_t(j + 1) * kSplitMixGamma);
}

NVFP4_HD float synthetic_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
NVFP4_HD float synthetic_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

// ~N(0, 1) from one draw: mean 2, variance 1/3 before the rescale.
NVFP4_HD float synthetic_normal(uint64_t r) {
  float sum = 0.0f;
  for (int i = 0; i < 4; ++i)
    sum = synthetic_add(sum, synthetic_mul(synthetic_add(float((r >> (16 * i)) & 0xffff), 0.5f), 1.0f / 65536.0f));
  return synthetic_mul(synthetic_add(sum, -2.0f), 1.7320508f);
}

// Element (row, col) of a synthetic tensor [rows, cols] with stddev.
NVFP4_HD float synthetic_value(uint64_t key, int64_t col, int64_t cols, float stddev) {
  float v = synthetic_mul(synthetic_normal(synthetic_draw(key, col)), stddev);
  const uint64_t u = synthetic_draw(key, cols);
  if ((u & 7) == 0 && int64_t((u >> 3) % uint64_t(cols)) == col) v = synthetic_mul(v, 8.0f);
  return v;
}

}  // namespace nvfp4moe
