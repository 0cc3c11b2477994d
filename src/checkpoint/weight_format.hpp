// The storage format of one linear weight "<prefix>.weight" of a checkpoint,
// told from its tensors' names and dtypes only (no data is read).
#pragma once

#include <string>

#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe {

WeightFormat classify_weight(const ModelDir& dir, const std::string& prefix);

// "<prefix>.weight I8 [16, 16] with .scale F8_E8M0 [16, 1]": the tensors the
// classification saw, for messages.
std::string describe_weight(const ModelDir& dir, const std::string& prefix);

// "[16, 16]".
std::string shape_text(const std::vector<int64_t>& s);

}  // namespace nvfp4moe
