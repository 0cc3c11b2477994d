// The values of a forward's host tensors, widened for the CPU stages.
#pragma once

#include <cstdint>
#include <vector>

#include "nvfp4moe/types.hpp"

namespace nvfp4moe::cpu {

// x (bf16 or f32) as f32 values (bf16 widens exactly).
std::vector<float> values_f32(const TensorView& x);
// An int32 or int64 tensor's values.
std::vector<int32_t> values_i32(const TensorView& t);
std::vector<int64_t> values_i64(const TensorView& t);

}  // namespace nvfp4moe::cpu
