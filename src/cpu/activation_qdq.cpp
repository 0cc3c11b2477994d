// QDQ of activation rows (x before the gate/up GEMM, h before the down GEMM):
// the exact quantizer of src/format, then value(q) * f32(s) without g, which
// the GEMM applies to its FP32 sum as the GPU epilogue's alpha does.
#include <vector>

#include "cpu/cpu_kernels.hpp"
#include "cpu/cpu_moe.hpp"
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

}  // namespace nvfp4moe::cpu
