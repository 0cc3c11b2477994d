// parse_int / try_parse_int: every number read from a name, a config or an
// argument goes through them, so each way text can fail to be an in-range
// integer is checked here, with the message that names it.
#include <gtest/gtest.h>

#include <string>

#include "common/parse_int.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

TEST(ParseInt, AcceptsExactlyDecimalIntegersInRange) {
  struct Case {
    const char* text;
    int64_t lo, hi;
    IntParse want;
    int64_t value;
  };
  const Case cases[] = {
      {"0", 0, 10, IntParse::Ok, 0},
      {"7", 0, 10, IntParse::Ok, 7},
      {"10", 0, 10, IntParse::Ok, 10},
      {"11", 0, 10, IntParse::OutOfRange, 0},
      {"-1", 0, 10, IntParse::OutOfRange, 0},
      {"-1", -5, 5, IntParse::Ok, -1},
      {"007", 0, 10, IntParse::Ok, 7},
      {"9223372036854775807", INT64_MIN, INT64_MAX, IntParse::Ok, INT64_MAX},
      {"-9223372036854775808", INT64_MIN, INT64_MAX, IntParse::Ok, INT64_MIN},
      {"9223372036854775808", INT64_MIN, INT64_MAX, IntParse::OutOfRange, 0},
      {"-9223372036854775809", INT64_MIN, INT64_MAX, IntParse::OutOfRange, 0},
      {"4294967297", 1, 1024, IntParse::OutOfRange, 0},  // would be 1 truncated to 32 bits
      {"99999999999999", 1, 1024, IntParse::OutOfRange, 0},
      {"", 0, 10, IntParse::NotAnInteger, 0},
      {"-", 0, 10, IntParse::NotAnInteger, 0},
      {"+1", 0, 10, IntParse::NotAnInteger, 0},
      {" 1", 0, 10, IntParse::NotAnInteger, 0},
      {"1 ", 0, 10, IntParse::NotAnInteger, 0},
      {"1x", 0, 10, IntParse::NotAnInteger, 0},
      {"0x10", 0, 100, IntParse::NotAnInteger, 0},
      {"1e3", 0, 10000, IntParse::NotAnInteger, 0},
      {"1.0", 0, 10, IntParse::NotAnInteger, 0},
      {"--1", -10, 10, IntParse::NotAnInteger, 0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string("'") + c.text + "' in [" + std::to_string(c.lo) + ", " + std::to_string(c.hi) + "]");
    int64_t v = -12345;
    EXPECT_EQ(try_parse_int(c.text, c.lo, c.hi, v), c.want);
    EXPECT_EQ(v, c.want == IntParse::Ok ? c.value : -12345);  // untouched unless Ok
  }
}

TEST(ParseInt, HugeDigitStringsAreOutOfRangeNotACrash) {
  const std::string digits(300000, '9');
  int64_t v = 0;
  EXPECT_EQ(try_parse_int(digits, 0, INT64_MAX, v), IntParse::OutOfRange);
  EXPECT_EQ(try_parse_int("-" + digits, INT64_MIN, 0, v), IntParse::OutOfRange);
  EXPECT_EQ(try_parse_int(digits + "x", 0, INT64_MAX, v), IntParse::NotAnInteger);
  // Leading zeros do not count towards overflow.
  EXPECT_EQ(try_parse_int(std::string(100000, '0') + "42", 0, 100, v), IntParse::Ok);
  EXPECT_EQ(v, 42);
}

TEST(ParseInt, MessagesNameTheSourceTheTextAndTheRange) {
  EXPECT_EQ(parse_int("12", 0, 100, "--threads"), 12);
  EXPECT_ERROR_CONTAINS(parse_int("4294967297", 1, 1024, "--threads"),
                        "--threads: 4294967297 is out of range [1, 1024]");
  EXPECT_ERROR_CONTAINS(parse_int("four", 1, 1024, "--threads"), "--threads: 'four' is not an integer");
  // Long text is abbreviated in the message, with its length.
  const std::string digits(30000, '9');
  try {
    parse_int(digits, 0, 10, "tensor name 'x': layer index");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_LT(msg.size(), 200u) << msg;
    EXPECT_NE(msg.find("tensor name 'x': layer index: 999"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(30000 characters) is out of range [0, 10]"), std::string::npos) << msg;
  }
}

TEST(ParseInt, Abbreviate) {
  EXPECT_EQ(abbreviate("short"), "short");
  EXPECT_EQ(abbreviate(std::string(80, 'a')), std::string(80, 'a'));
  EXPECT_EQ(abbreviate(std::string(81, 'a')), std::string(80, 'a') + "... (81 characters)");
  EXPECT_EQ(abbreviate("abcdef", 3), "abc... (6 characters)");
}

}  // namespace
}  // namespace nvfp4moe
