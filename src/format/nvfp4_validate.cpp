// first_bad_block_scale / check_block_scales (see nvfp4_validate.hpp).
#include "format/nvfp4_validate.hpp"

#include <algorithm>

#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

// The bad bytes are exactly 0x7F..0xFF (0x7F NaN, 0x80..0xFE negative, 0xFF
// NaN), so a run whose largest byte is below 0x7F is clean. Proved here over
// every byte, so the fast scan below cannot drift from block_scale_fault.
constexpr bool bad_bytes_are_0x7f_and_above() {
  for (int b = 0; b < 256; ++b)
    if ((block_scale_fault(uint8_t(b)) != ScaleByteFault::None) != (b >= 0x7F)) return false;
  return true;
}
static_assert(bad_bytes_are_0x7f_and_above(), "block_scale_fault must flag exactly the bytes >= 0x7F");

}  // namespace

int64_t first_bad_block_scale(const uint8_t* scales, int64_t n) {
  // NOTES: a weight's scales are read once per layer load or construction
  // (DeepSeek-V4-Pro: ~1.6 GB a layer). A max over a chunk vectorises (about
  // 10 GB/s on one core, against ~1.3 GB/s for a byte-by-byte test with an
  // early exit); only a chunk holding a bad byte is searched byte by byte.
  constexpr int64_t kChunk = 4096;
  for (int64_t at = 0; at < n; at += kChunk) {
    const int64_t end = std::min(n, at + kChunk);
    uint8_t hi = 0;
    for (int64_t i = at; i < end; ++i) hi = std::max(hi, scales[i]);
    if (hi < 0x7F) continue;
    for (int64_t i = at; i < end; ++i)
      if (block_scale_fault(scales[i]) != ScaleByteFault::None) return i;
  }
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
