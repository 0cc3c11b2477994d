// Validation of NVFP4 block-scale bytes read from outside (checkpoints,
// caller arrays): the one rule every reader applies (docs/numerics.md §1, §6).
//
// A weight's block scale is a UE4M3 byte: an E4M3 bit pattern with the sign
// bit clear. 0x7F and 0xFF are E4M3 NaN; any byte with the sign bit set
// (0x80..0xFE) is not a UE4M3 value, and decoding it as E4M3 would flip the
// sign of its whole block. The quantizers here never produce either (an
// all-zero block gets 0x38); activations may carry 0x7F as their NaN mark,
// which is why this is a check of weights only.
#pragma once

#include <cstdint>
#include <string>

namespace nvfp4moe {

enum class ScaleByteFault : uint8_t { None, NaN, Negative };

constexpr ScaleByteFault block_scale_fault(uint8_t b) {
  if ((b & 0x7F) == 0x7F) return ScaleByteFault::NaN;
  return (b & 0x80) ? ScaleByteFault::Negative : ScaleByteFault::None;
}

// The index of the first bad byte of scales[0, n), or -1.
int64_t first_bad_block_scale(const uint8_t* scales, int64_t n);

// Throws for the first bad byte of scales [rows, blocks_per_row]:
// "<what>: block scale byte 37 (row 2, block 5) is NaN (0x7f); UE4M3 block
// scales must be finite and >= 0".
void check_block_scales(const uint8_t* scales, int64_t rows, int64_t blocks_per_row, const std::string& what);

}  // namespace nvfp4moe
