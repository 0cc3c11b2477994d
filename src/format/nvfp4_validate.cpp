// first_bad_block_scale / check_block_scales (see nvfp4_validate.hpp).
#include "format/nvfp4_validate.hpp"

#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

int64_t first_bad_block_scale(const uint8_t* scales, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (block_scale_fault(scales[i]) != ScaleByteFault::None) return i;
  return -1;
}

void check_block_scales(const uint8_t* scales, int64_t rows, int64_t blocks_per_row, const std::string& what) {
  const int64_t i = first_bad_block_scale(scales, rows * blocks_per_row);
  if (i < 0) return;
  const uint8_t b = scales[i];
  NVFP4_FAIL(what, ": block scale byte ", i, " (row ", i / blocks_per_row, ", block ", i % blocks_per_row, ") is ",
             block_scale_fault(b) == ScaleByteFault::NaN ? "NaN" : "negative", " (0x", std::hex, int(b), std::dec,
             "); UE4M3 block scales must be finite and >= 0");
}

}  // namespace nvfp4moe
