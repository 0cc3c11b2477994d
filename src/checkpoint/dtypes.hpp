// safetensors dtypes as the checkpoint code needs them: the header spelling,
// the byte count of a whole tensor (sub-byte dtypes included), and the value
// of one element of every floating-point dtype that a loader reads as floats.
//
// The dtype list is that of the safetensors reference implementation
// (huggingface/safetensors, safetensors/src/tensor.rs, enum Dtype): sizes are
// in bits there, a tensor's byte count is numel * bits / 8 and must be whole.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4moe/types.hpp"

namespace nvfp4moe::dtypes {

// numel * bits / 8 with every product checked for overflow; throws naming
// `what` for a negative dimension, an overflow, or a bit count that is not a
// whole number of bytes (an F4 tensor of odd numel).
uint64_t tensor_bytes(DType dtype, const std::vector<int64_t>& shape, const std::string& what);

// Values of single elements (bit patterns in, FP32 out; every one is exact).
float f16_value(uint16_t h);
float e5m2_value(uint8_t b);       // float8_e5m2: the high byte of an F16
float e8m0_value(uint8_t b);       // UE8M0: 2^(b - 127); 0xFF is NaN; 0x00 is 2^-127
float e4m3fnuz_value(uint8_t b);   // bias 8, subnormals m * 2^-10, 0x80 NaN
float e5m2fnuz_value(uint8_t b);   // bias 16, subnormals m * 2^-17, 0x80 NaN

// True for the dtypes to_f32 converts (F64 F32 F16 BF16 and the FP8 ones).
bool is_float_readable(DType t);
// Element i of `data` (of dtype `t`, is_float_readable) as FP32.
float element_value(DType t, const uint8_t* data, int64_t i);

}  // namespace nvfp4moe::dtypes
