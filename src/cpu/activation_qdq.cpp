// QDQ of activation rows (x before the gate/up GEMM, h before the down GEMM):
// the exact quantizer of src/format, then value(q) * f32(s) without g, which
// the GEMM applies to its FP32 sum as the GPU epilogue's alpha does; and the
// other activation modes of docs/numerics.md §7 (BF16, DeepSeek's FP8).
#include <algorithm>
#include <vector>

#include "cpu/cpu_kernels.hpp"
#include "cpu/cpu_moe.hpp"
#include "format/mxfp4_codec.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe::cpu {

void qdq_rows(const float* x, int64_t rows, int64_t cols, const float* static_g, int64_t static_stride,
              float* values, float* g) {
  static_assert(fmt::kBlock == 16, "the NVFP4 block is 16 elements");
  const E2m1PairTable lut;
  std::vector<uint8_t> codes(static_cast<size_t>(cols / 2)), scales(static_cast<size_t>(cols / 16));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    // Dynamic: g = amax / (6 * 448) of the row (NaN/Inf rows give a
    // non-finite g, hence NaN scale bytes: only this row turns NaN).
    const float gr = static_g ? static_g[r * static_stride] : global_scale_for_amax(abs_max(xr, cols));
    // One row per call keeps quantize_rows on this thread (we are already
    // inside a parallel stage).
    quantize_rows(xr, 1, cols, cols, &gr, 0, codes.data(), scales.data());
    dequant_rows_noglobal(lut, codes.data(), scales.data(), 1, cols, values + r * cols);
    g[r] = gr;
  }
}

void fp8_act_quant_ref(const float* x, int64_t n, uint8_t* codes, float* scales) {
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += fmt::kFp8ActBlock, ++blk) {
    const int64_t len = std::min<int64_t>(fmt::kFp8ActBlock, n - b0);
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = fmt::abs_max_nan(amax, x[b0 + i]);
    const float s = fmt::fp8_act_block_scale(amax);
    scales[blk] = s;
    for (int64_t i = 0; i < len; ++i) codes[b0 + i] = fmt::fp8_act_code(x[b0 + i], s);
  }
}

void fp8_act_qdq(const float* x, int64_t n, float* values) {
  for (int64_t b0 = 0; b0 < n; b0 += fmt::kFp8ActBlock) {
    const int64_t len = std::min<int64_t>(fmt::kFp8ActBlock, n - b0);
    float amax = 0.0f;
    for (int64_t i = 0; i < len; ++i) amax = fmt::abs_max_nan(amax, x[b0 + i]);
    const float s = fmt::fp8_act_block_scale(amax);
    for (int64_t i = 0; i < len; ++i) values[b0 + i] = fmt::e4m3_value(fmt::fp8_act_code(x[b0 + i], s)) * s;
  }
}

void stage_activation_rows(ActivationMode mode, const float* x, int64_t rows, int64_t cols, const float* static_g,
                           int64_t static_stride, float* values, float* g) {
  if (mode == ActivationMode::Nvfp4) {
    qdq_rows(x, rows, cols, static_g, static_stride, values, g);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* v = values + r * cols;
    for (int64_t i = 0; i < cols; ++i) v[i] = bf16_to_float(bf16_from_float(x[r * cols + i]));  // RNE, NaN kept
    if (mode == ActivationMode::Fp8) fp8_act_qdq(v, cols, v);  // in place: each block is read before it is written
    g[r] = 1.0f;
  }
}

}  // namespace nvfp4moe::cpu
