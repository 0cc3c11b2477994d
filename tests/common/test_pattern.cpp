// Pattern: the documented regex subset (hand-worked answers of
// std::regex_search under ECMAScript for each case), the refused syntax with
// its offset, and inputs whose size would overflow a backtracking or
// recursive matcher: they must finish quickly and give the right answer.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "common/pattern.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

struct Case {
  const char* pattern;
  const char* text;
  bool match;
};

TEST(Pattern, SearchAnswersOfTheSupportedSyntax) {
  const Case cases[] = {
      {"", "", true},
      {"", "abc", true},
      {"b", "abc", true},
      {"d", "abc", false},
      {"abc", "xxabcxx", true},
      {"abd", "abcabd", true},
      {"abd", "abcab", false},
      {"^abc", "abcd", true},
      {"^abc", "xabc", false},
      {"abc$", "xabc", true},
      {"abc$", "abcx", false},
      {"^$", "", true},
      {"^$", "a", false},
      {"a^b", "a^b", false},  // ^ is an assertion, not a character
      {"a\\^b", "a^b", true},
      {"a.c", "abc", true},
      {"a.c", "ac", false},
      {"a.c", "a\nc", false},  // . stops at line terminators
      {"a\\.c", "abc", false},
      {"a\\.c", "a.c", true},
      {"ab*c", "ac", true},
      {"ab*c", "abbbc", true},
      {"ab+c", "ac", false},
      {"ab+c", "abbc", true},
      {"ab?c", "abc", true},
      {"ab?c", "abbc", false},
      {"^ab*?c$", "abbc", true},  // lazy marks are accepted
      {"^a+?$", "aaa", true},
      {"gate|up", "x.up_proj", true},
      {"gate|up", "down", false},
      {"^(gate|up)_proj$", "up_proj", true},
      {"^(gate|up)_proj$", "xup_proj", false},
      {"^(?:gate|up)_proj$", "gate_proj", true},
      {"^(|x)y$", "y", true},
      {"^(|x)y$", "xy", true},
      {"^(a|b|c)+$", "abcabc", true},
      {"^(a|b|c)+$", "abcd", false},
      {"^(a*)*$", "aaaa", true},  // empty loops terminate
      {"^(a*)*b$", "aaaa", false},
      {"[abc]", "xxbxx", true},
      {"^[abc]+$", "abcx", false},
      {"^[a-z0-9_]+$", "up_proj3", true},
      {"^[a-z]+$", "Up", false},
      {"^[^a-z]+$", "ABC1", true},
      {"^[^a-z]+$", "ABc", false},
      {"^[-a]+$", "-a-", true},
      {"^[a-]+$", "a--", true},
      {"^[\\]]$", "]", true},
      {"^[\\d.]+$", "3.14", true},
      {"^[\\D]$", "5", false},
      {"^\\d+$", "0123456789", true},
      {"^\\d+$", "12a", false},
      {"^\\w+$", "A_z9", true},
      {"^\\w+$", "a-b", false},
      {"^\\W$", "-", true},
      {"^a\\sb$", "a\tb", true},
      {"^a\\Sb$", "a b", false},
      {"^\\t\\n\\r$", "\t\n\r", true},
      {"\\(x\\)", "f(x)", true},
      {"\\\\", "a\\b", true},
      {"mlp\\.experts\\.[0-9]+\\.(gate|up|down)_proj\\.weight$", "model.layers.3.mlp.experts.17.down_proj.weight", true},
      {"mlp\\.experts\\.[0-9]+\\.(gate|up|down)_proj\\.weight$", "model.layers.3.mlp.experts.17.down_proj.weight_scale", false},
      {"mlp\\.experts\\.[0-9]+\\.(gate|up|down)_proj\\.weight$", "model.layers.3.mlp.experts..down_proj.weight", false},
      {".*weight$", "a.weight", true},
      {".*weight$", "a.weights", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string("pattern '") + c.pattern + "' on '" + c.text + "'");
    EXPECT_EQ(Pattern(c.pattern).search(c.text), c.match);
  }
}

TEST(Pattern, BytesOutsideAsciiAreLiterals) {
  EXPECT_TRUE(Pattern("\xc3\xa9").search("caf\xc3\xa9"));
  EXPECT_TRUE(Pattern("^caf.+$").search("caf\xc3\xa9"));
  EXPECT_FALSE(Pattern("^[a-z]+$").search("caf\xc3\xa9"));
  EXPECT_TRUE(Pattern("a.b").search(std::string("a\0b", 3)));
}

TEST(Pattern, RefusedSyntaxNamesTheProblemAndOffset) {
  struct Bad {
    const char* pattern;
    const char* message;
  };
  const Bad bad[] = {
      {"(", "missing ')' at offset 1"},
      {"(ab", "missing ')' at offset 3"},
      {"ab)", "unmatched ')' at offset 2"},
      {"*a", "nothing to repeat at offset 0"},
      {"a|*", "nothing to repeat at offset 2"},
      {"(+)", "nothing to repeat at offset 1"},
      {"a**", "nothing to repeat at offset 2"},
      {"a+*", "nothing to repeat at offset 2"},
      {"^*", "nothing to repeat at offset 1"},
      {"a{2}", "counted repetition {m,n} is not supported"},
      {"a}", "counted repetition"},
      {"[abc", "missing ']' at offset 4"},
      {"[]", "empty character class at offset 1"},
      {"[^]", "empty character class"},
      {"[z-a]", "range out of order in a character class at offset 4"},
      {"[\\d-z]", "a range cannot start with a class escape"},
      {"[a-\\d]", "a range cannot end with a class escape"},
      {"a\\", "trailing backslash at offset 2"},
      {"\\1", "unsupported escape"},
      {"\\bword", "unsupported escape (back-references, \\b and the like are not supported) at offset 1"},
      {"(?=a)", "unsupported group '(?'"},
      {"(?<n>a)", "unsupported group '(?'"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.pattern);
    EXPECT_ERROR_CONTAINS(Pattern(b.pattern, "--include"), std::string("--include '") + b.pattern + "': ",
                          b.message);
  }
  // Nesting and length limits.
  EXPECT_NO_THROW(Pattern(std::string(64, '(') + "a" + std::string(64, ')')));
  EXPECT_ERROR_CONTAINS(Pattern(std::string(65, '(') + "a" + std::string(65, ')')), "groups nested too deeply");
  EXPECT_ERROR_CONTAINS(Pattern(std::string(100000, '(')), "100000 characters, the limit is 4096");
}

double seconds(const std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Inputs that crash std::regex (stack overflow) or take exponential time in
// a backtracking matcher: a correct answer well within a second.
TEST(Pattern, LongTextsAndPathologicalPatternsRunInLinearTime) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string digits(300000, '7');
  const Pattern include("mlp\\.experts\\.[0-9]+\\.(gate|up|down)_proj\\.weight$");
  EXPECT_TRUE(include.search("model.layers.1.mlp.experts." + digits + ".up_proj.weight"));
  EXPECT_FALSE(include.search("model.layers.1.mlp.experts." + digits + ".up_proj.bias"));
  const std::string name(50000, 'a');
  EXPECT_TRUE(Pattern(".*weight$").search(name + "weight"));
  EXPECT_FALSE(Pattern(".*weight$").search(name + "weigh"));
  // (a*)*b on a^n: exponential for backtracking, linear here.
  EXPECT_FALSE(Pattern("^(a*)*b$").search(std::string(20000, 'a')));
  EXPECT_FALSE(Pattern("^(a|aa)+$").search(std::string(20000, 'a') + "b"));
  EXPECT_TRUE(Pattern("^(a|aa)+$").search(std::string(20000, 'a')));
  EXPECT_LT(seconds(t0), 2.0);
}

}  // namespace
}  // namespace nvfp4moe
