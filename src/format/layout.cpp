// Scale-factor layout conversions (docs/numerics.md §3): linear [rows, k] <->
// swizzled 128x4, the layout of CUTLASS, vLLM's scaled_fp4_quant and
// FlashInfer. Padding bytes are zero on the way in and ignored on the way out.
#include <cstring>

#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

namespace {
int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
}  // namespace

int64_t swizzled_scale_bytes(int64_t rows, int64_t k) {
  NVFP4_CHECK(rows >= 0 && k >= 0, "swizzled layout: negative size rows=", rows, " k=", k);
  return round_up(rows, 128) * round_up(k, 4);
}

void scales_linear_to_swizzled(const uint8_t* linear, int64_t rows, int64_t k, uint8_t* swizzled) {
  const int64_t kp = round_up(k, 4);
  std::memset(swizzled, 0, size_t(swizzled_scale_bytes(rows, k)));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t c = 0; c < k; ++c) swizzled[swizzled_offset(m, c, kp)] = linear[m * k + c];
}

void scales_swizzled_to_linear(const uint8_t* swizzled, int64_t rows, int64_t k, uint8_t* linear) {
  const int64_t kp = round_up(k, 4);
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t c = 0; c < k; ++c) linear[m * k + c] = swizzled[swizzled_offset(m, c, kp)];
}

}  // namespace nvfp4moe
