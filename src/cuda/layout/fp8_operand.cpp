// fp8_weight_rows and fp8_operand_rows_ref (see fp8_operand.hpp). Host code.
#include "cuda/layout/fp8_operand.hpp"

#include <cmath>
#include <vector>

#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe::cuda {

bool fp8_weight_rows(const LinearExpertProjection& w, const float* mx_factors, int8_t* rows, std::string* why) {
  const bool mx = w.format == ExpertFormat::Mxfp4;
  const int64_t n = w.projection == Projection::GateUp ? 2 * w.inter : w.hidden;
  const int64_t k = w.projection == Projection::GateUp ? w.hidden : w.inter;
  const float one = 1.0f;  // NVFP4: g stays in the epilogue, the rows are value(q) * e4m3(s)
  const E4m3RowShifts shifts = e4m3_row_shifts(w.codes, w.scales, mx ? 32 : 16, &one, 0, n, k);
  if (!shifts.exact) {
    if (why) *why = "expert " + std::to_string(w.expert) + ": " + shifts.why;
    return false;
  }
  // E = r (NVFP4) or r - log2(row group factor) (MXFP4, whose kernel
  // multipliers are relative to the row group's smallest scale byte).
  const FragmentGeometry g = fragment_geometry(w.projection, w.hidden, w.inter, w.format);
  for (int64_t mt = 0; mt < g.m_tiles; ++mt)
    for (int r = 0; r < kMmaTileRows; ++r) {
      const int64_t src = fragment_source_row(w.projection, mt, r, w.inter);
      int e = shifts.shift[size_t(src)];
      if (mx) {
        const float f = mx_factors[w.projection == Projection::GateUp && src >= w.inter ? 1 : 0];
        int f_exp = 0;
        std::frexp(f, &f_exp);
        e -= f_exp - 1;  // f = 2^(f_exp - 1)
      }
      if (e < kFp8RowExponentMin || e > kFp8RowExponentMax) {
        if (why)
          *why = "expert " + std::to_string(w.expert) + ": row " + std::to_string(src) + " needs the exponent " +
                 std::to_string(e) + ", outside [" + std::to_string(kFp8RowExponentMin) + ", " +
                 std::to_string(kFp8RowExponentMax) + "]";
        return false;
      }
      rows[mt * kMmaTileRows + r] = int8_t(e);
    }
  return true;
}

void fp8_operand_rows_ref(const uint16_t* bf16, int64_t rows, int64_t cols, int64_t ld_in, uint8_t* codes,
                          int64_t ld_out, float* scales) {
  NVFP4_CHECK(cols % kFp8OperandBlock == 0 && ld_in >= cols && ld_out >= cols, "fp8_operand_rows_ref: ", cols,
              " columns (a multiple of ", kFp8OperandBlock, "), row strides ", ld_in, " and ", ld_out);
  const int64_t blocks = cols / kFp8OperandBlock;
  std::vector<float> v(kFp8OperandBlock);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      float amax = 0.0f;
      bool nan = false;
      for (int i = 0; i < kFp8OperandBlock; ++i) {
        v[size_t(i)] = fmt::bits_to_float(uint32_t(bf16[r * ld_in + b * kFp8OperandBlock + i]) << 16);
        nan = nan || !fmt::is_finite(v[size_t(i)]);
        amax = std::max(amax, std::fabs(v[size_t(i)]));
      }
      const float s = nan ? fmt::bits_to_float(0x7fc00000u) : fp8_operand_scale(amax);  // NaN: the token turns NaN
      scales[r * blocks + b] = s;
      for (int i = 0; i < kFp8OperandBlock; ++i) {
        const int64_t col = b * kFp8OperandBlock + i;
        codes[r * ld_out + fp8_operand_column(col)] = nan ? fmt::kE4M3NaN : fmt::e4m3_from_float(v[size_t(i)] / s);
      }
    }
}

}  // namespace nvfp4moe::cuda
