// The official release's MXFP4 linear weights in a checkpoint
// (docs/checkpoints.md, "MXFP4"): "<prefix>.weight" packed E2M1, I8 or U8
// [N, K/2] (or F4 [N, K], shapes counting elements), and "<prefix>.scale"
// F8_E8M0 [N, K/32]. Zero copy: the view points into the mapped files.
#pragma once

#include <cstdint>
#include <string>

#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe {

struct Mxfp4WeightView {
  const TensorInfo* weight = nullptr;  // the packed codes, element 2i in the low nibble
  const TensorInfo* scale = nullptr;   // UE8M0 bit patterns
  int64_t rows = 0, cols = 0;          // N, K
  const uint8_t* codes() const { return weight->data; }
  const uint8_t* scales() const { return scale->data; }
};

// Reads and checks "<prefix>.weight" / "<prefix>.scale": dtypes, shapes
// (against N and K when they are >= 0, else taken from the weight), K a
// multiple of 32, and every scale byte (check_mxfp4_scales). Errors name the
// tensor and the offending values.
Mxfp4WeightView read_mxfp4_weight(const ModelDir& dir, const std::string& prefix, int64_t N = -1, int64_t K = -1);

}  // namespace nvfp4moe
