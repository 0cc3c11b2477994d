// MXFP4 -> NVFP4 for one weight, the two ways ModelOpt does it.
#include "checkpoint/convert_expert.hpp"

#include <algorithm>
#include <cmath>

#include "checkpoint/mxfp4_weights.hpp"
#include "common/parallel.hpp"
#include "format/mxfp4_codec.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/types.hpp"

namespace nvfp4moe {

float mxfp4_amax(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K) {
  float amax = 0.0f;
  const int64_t kb = K / fmt::kMxBlock;
  for (int64_t r = 0; r < N; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const uint8_t* c = codes + r * (K / 2) + b * (fmt::kMxBlock / 2);
      uint8_t mag = 0;
      for (int i = 0; i < fmt::kMxBlock / 2; ++i) mag = std::max({mag, uint8_t(c[i] & 7), uint8_t((c[i] >> 4) & 7)});
      amax = std::max(amax, fmt::e2m1_value(mag) * fmt::ue8m0_value(scales[r * kb + b]));
    }
  return amax;
}

int mxfp4_kmax(const uint8_t* scales, int64_t n) {
  int kmax = 0;
  bool any = false;
  for (int64_t i = 0; i < n; ++i)
    if (scales[i] != 0) {
      kmax = any ? std::max(kmax, int(scales[i]) - 127) : int(scales[i]) - 127;
      any = true;
    }
  return kmax;
}

Nvfp4Tensor requantize_mxfp4(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K, float g) {
  std::vector<Bf16> bf16(static_cast<size_t>(N * K));
  dequantize_mxfp4_rows(codes, scales, N, K, bf16.data());
  Nvfp4Tensor t;
  t.codes.resize(size_t(N * K / 2));
  t.scales.resize(size_t(N * K / 16));
  t.g = g;
  quantize_rows(bf16.data(), N, K, K, &g, 0, t.codes.data(), t.scales.data());
  t.blocks = N * K / 16;
  return t;
}

Nvfp4Tensor cast_mxfp4_lossless(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K, int m,
                                int threads) {
  Nvfp4Tensor t;
  t.codes.resize(size_t(N * K / 2));
  t.scales.resize(size_t(N * K / 16));
  t.g = std::ldexp(1.0f, m);
  t.blocks = N * K / 16;
  const int64_t kb = K / fmt::kMxBlock;
  std::vector<int64_t> exact(static_cast<size_t>(N), 0);
  parallel_for(
      N, 16,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          for (int64_t j = 0; j < K / 16; ++j) {
            const uint8_t sb = scales[r * kb + j / 2];
            const uint8_t* src = codes + r * (K / 2) + j * 8;
            uint8_t* dst = t.codes.data() + r * (K / 2) + j * 8;
            uint8_t* s = t.scales.data() + r * (K / 16) + j;
            if (fmt::mx_block_scale_as_e4m3(sb, m, s)) {
              std::copy(src, src + 8, dst);
              ++exact[size_t(r)];
              continue;
            }
            float v[16];
            const float k = fmt::ue8m0_value(sb);
            for (int i = 0; i < 8; ++i) {
              v[2 * i] = fmt::e2m1_value(uint8_t(src[i] & 15)) * k;
              v[2 * i + 1] = fmt::e2m1_value(uint8_t(src[i] >> 4)) * k;
            }
            quantize_rows_ref(v, 1, 16, 16, &t.g, 0, dst, s);
          }
      },
      threads);
  for (int64_t e : exact) t.exact_blocks += e;
  return t;
}

ConvertNumerics host_convert_numerics(int threads) {
  return {[](const Mxfp4WeightView& w) { return mxfp4_amax(w.codes(), w.scales(), w.rows, w.cols); },
          [](const Mxfp4WeightView& w) { return mxfp4_kmax(w.scales(), w.rows * w.cols / 32); },
          [](const Mxfp4WeightView& w, float g) { return requantize_mxfp4(w.codes(), w.scales(), w.rows, w.cols, g); },
          [threads](const Mxfp4WeightView& w, int m) {
            return cast_mxfp4_lossless(w.codes(), w.scales(), w.rows, w.cols, m, threads);
          }};
}

}  // namespace nvfp4moe
