// try_parse_int / parse_int (see parse_int.hpp).
#include "common/parse_int.hpp"

#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

IntParse try_parse_int(std::string_view text, int64_t lo, int64_t hi, int64_t& value) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string_view digits = text.substr(negative ? 1 : 0);
  if (digits.empty()) return IntParse::NotAnInteger;
  for (char c : digits)
    if (c < '0' || c > '9') return IntParse::NotAnInteger;
  // Accumulate the magnitude as unsigned; past 2^63 the value is out of any
  // int64 range, so stop there (the remaining digits are already known valid).
  constexpr uint64_t kLimit = uint64_t(1) << 63;
  uint64_t mag = 0;
  for (char c : digits) {
    const uint64_t d = uint64_t(c - '0');
    if (mag > (kLimit - d) / 10) return IntParse::OutOfRange;
    mag = mag * 10 + d;
  }
  if (!negative && mag == kLimit) return IntParse::OutOfRange;
  const int64_t v = negative ? (mag == kLimit ? INT64_MIN : -int64_t(mag)) : int64_t(mag);
  if (v < lo || v > hi) return IntParse::OutOfRange;
  value = v;
  return IntParse::Ok;
}

int64_t parse_int(std::string_view text, int64_t lo, int64_t hi, std::string_view what) {
  int64_t v = 0;
  switch (try_parse_int(text, lo, hi, v)) {
    case IntParse::Ok: return v;
    case IntParse::NotAnInteger: NVFP4_FAIL(what, ": '", abbreviate(text), "' is not an integer");
    case IntParse::OutOfRange: break;
  }
  NVFP4_FAIL(what, ": ", abbreviate(text), " is out of range [", lo, ", ", hi, "]");
}

std::string abbreviate(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max)) + "... (" + std::to_string(text.size()) + " characters)";
}

}  // namespace nvfp4moe
