// Checked integers from untrusted text: tensor names, config values,
// environment variables and command-line arguments. The whole text must be
// the number and the number must lie in the caller's range; errors name where
// the text came from, so "layer index out of range" can point at the tensor.
//
// No std::stoi / strtol: they skip white space, accept trailing junk or a
// '+', throw exceptions whose text is only the function's name ("stol"), and
// strtol clamps silently on overflow.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace nvfp4moe {

enum class IntParse : uint8_t {
  Ok,
  NotAnInteger,  // empty, a sign alone, or a character other than '-' first and digits after
  OutOfRange,    // a well-formed integer outside [lo, hi] (any number of digits)
};

// Decimal: an optional '-', then one or more ASCII digits, nothing else.
// `value` is written only when the result is Ok. Time is linear in the text
// and no memory is allocated, however many digits it holds.
IntParse try_parse_int(std::string_view text, int64_t lo, int64_t hi, int64_t& value);

// The value, or an Error: "<what>: 'x1' is not an integer" or
// "<what>: 4294967297 is out of range [1, 1024]" (long text abbreviated).
int64_t parse_int(std::string_view text, int64_t lo, int64_t hi, std::string_view what);

// `text` for a message: itself when at most `max` characters, else its first
// `max` characters, "..." and its length ("model.layers.99999... (30041 characters)").
std::string abbreviate(std::string_view text, size_t max = 80);

}  // namespace nvfp4moe
