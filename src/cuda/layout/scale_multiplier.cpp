// encode_weight_scales / decode_weight_scales (see scale_multiplier.hpp).
#include "cuda/layout/scale_multiplier.hpp"

#include <algorithm>
#include <cstring>

#include "format/mxfp4_codec.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

struct Shape {
  int64_t rows, k, groups, group_rows;
};
Shape shape_of(Projection p, int64_t hidden, int64_t inter) {
  return p == Projection::GateUp ? Shape{2 * inter, hidden, 2, inter} : Shape{hidden, inter, 1, hidden};
}

const char* group_name(Projection p, int64_t group) {
  return p == Projection::Down ? "w2 (down)" : group == 0 ? "w13 gate" : "w13 up";
}

// Whether one of n code bytes holds a non-zero magnitude.
bool any_nonzero_code(const uint8_t* codes, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (codes[i] & 0x77u) return true;
  return false;
}

}  // namespace

void encode_weight_scales(const LinearExpertProjection& w, uint8_t* codes, uint8_t* mult, float* mx_factors) {
  const Shape s = shape_of(w.projection, w.hidden, w.inter);
  const int64_t kb16 = s.k / fmt::kBlock;
  if (w.format == ExpertFormat::Nvfp4) {
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t b = 0; b < kb16; ++b) {
        const uint8_t d = nvfp4_multiplier_byte(w.scales[r * kb16 + b]);
        mult[r * kb16 + b] = d;
        if (d == 0) std::memset(codes + r * (s.k / 2) + b * (fmt::kBlock / 2), 0, fmt::kBlock / 2);
      }
    return;
  }
  NVFP4_CHECK(s.k % fmt::kMxBlock == 0, "MXFP4 expert ", w.expert, ": K=", s.k, " is not a multiple of 32");
  const int64_t kb32 = s.k / fmt::kMxBlock, block_bytes = fmt::kMxBlock / 2;
  for (int64_t grp = 0; grp < s.groups; ++grp) {
    const int64_t r0 = grp * s.group_rows, r1 = r0 + s.group_rows;
    // The smallest and largest byte over the blocks that hold a non-zero code.
    int lo = 256, hi = -1;
    int64_t lo_at = 0, hi_at = 0;
    for (int64_t i = r0 * kb32; i < r1 * kb32; ++i) {
      if (!any_nonzero_code(w.codes + i * block_bytes, block_bytes)) continue;
      const int b = w.scales[i];
      if (b < lo) lo = b, lo_at = i;
      if (b > hi) hi = b, hi_at = i;
    }
    const int base = hi < 0 ? 127 : lo;  // an all-zero row group: any base
    if (hi >= 0) {
      NVFP4_CHECK(hi - lo < kMxfp4Window, "MXFP4 expert ", w.expert, " ", group_name(w.projection, grp),
                  ": UE8M0 byte 0x", std::hex, hi, " (row ", std::dec, hi_at / kb32, ", block ", hi_at % kb32,
                  ") is 2^", hi - lo, " times the smallest non-zero block's 0x", std::hex, lo, std::dec, " (row ",
                  lo_at / kb32, ", block ", lo_at % kb32, "); the CUDA kernels hold at most ", kMxfp4Window,
                  " binades of scales per expert and projection");
      NVFP4_CHECK(lo <= kMxfp4MaxBase, "MXFP4 expert ", w.expert, " ", group_name(w.projection, grp),
                  ": every non-zero block's UE8M0 byte is at least 0x", std::hex, lo, std::dec, " (row ",
                  lo_at / kb32, ", block ", lo_at % kb32, ", 2^", lo - 127, "); above 0x", std::hex, kMxfp4MaxBase,
                  std::dec, " the CUDA kernels' FP32 epilogue factor overflows");
    }
    mx_factors[grp] = mxfp4_row_group_factor(base);
    for (int64_t i = r0 * kb32; i < r1 * kb32; ++i) {
      const bool zero = !any_nonzero_code(w.codes + i * block_bytes, block_bytes);
      const uint8_t d = zero ? uint8_t(0) : mxfp4_multiplier_byte(w.scales[i], base);
      if (zero) std::memset(codes + i * block_bytes, 0, size_t(block_bytes));
      mult[2 * i] = d;  // two 16-column blocks per 32-column block (row-major: i = r * kb32 + c)
      mult[2 * i + 1] = d;
    }
  }
}

void decode_weight_scales(ExpertFormat f, Projection p, int64_t hidden, int64_t inter, const uint8_t* mult,
                          const float* mx_factors, uint8_t* scales) {
  const Shape s = shape_of(p, hidden, inter);
  const int64_t kb16 = s.k / fmt::kBlock;
  if (f == ExpertFormat::Nvfp4) {
    for (int64_t i = 0; i < s.rows * kb16; ++i) scales[i] = nvfp4_scale_byte(mult[i]);
    return;
  }
  const int64_t kb32 = s.k / fmt::kMxBlock;
  for (int64_t r = 0; r < s.rows; ++r) {
    const int base = int((fmt::float_to_bits(mx_factors[r / s.group_rows]) >> 23) & 0xffu) - 127 + kMxfp4FactorShift;
    for (int64_t c = 0; c < kb32; ++c) {
      const uint8_t d = mult[r * kb16 + 2 * c];
      scales[r * kb32 + c] = d == 0 ? uint8_t(base) : mxfp4_scale_byte(d, base);
    }
  }
}

}  // namespace nvfp4moe::cuda
