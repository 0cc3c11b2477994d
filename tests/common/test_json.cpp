// The JSON parser and writer: values, escapes, exact integers, every class of
// malformed input with its byte offset, the depth limit, round trips.
#include <cmath>
#include <string>

#include "checkpoint/checkpoint_files.hpp"
#include "common/json.hpp"
#include "nvfp4moe/error.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

TEST(Json, ParsesScalarsArraysObjects) {
  json::Value v = json::parse(R"( {"a": 1, "b": [true, false, null], "c": -2.5e3, "d": "x", "e": {}} )");
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.members().size(), 5u);
  EXPECT_EQ(v.find("a")->as_int(), 1);
  EXPECT_TRUE(v.find("a")->is_integer());
  const auto& b = v.find("b")->items();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_TRUE(b[0].as_bool());
  EXPECT_FALSE(b[1].as_bool());
  EXPECT_TRUE(b[2].is_null());
  EXPECT_EQ(v.find("c")->as_double(), -2500.0);
  EXPECT_FALSE(v.find("c")->is_integer());
  EXPECT_EQ(v.find("d")->as_string(), "x");
  EXPECT_TRUE(v.find("e")->is_object());
  EXPECT_EQ(v.find("zz"), nullptr);
  // Member order is kept.
  EXPECT_EQ(v.members()[2].first, "c");
}

TEST(Json, IntegersAreExactBeyond2To53) {
  json::Value v = json::parse("[9007199254740993, -9223372036854775808, 9223372036854775807]");
  EXPECT_EQ(v.items()[0].as_int(), 9007199254740993LL);  // 2^53 + 1: a double would round it
  EXPECT_EQ(v.items()[1].as_int(), INT64_MIN);
  EXPECT_EQ(v.items()[2].as_int(), INT64_MAX);
  // Beyond int64 it is only a double, and as_int refuses it.
  json::Value big = json::parse("18446744073709551616");
  EXPECT_FALSE(big.is_integer());
  EXPECT_ERROR_CONTAINS(big.as_int("offset"), "offset", "expected an integer");
}

TEST(Json, StringEscapesAndUnicode) {
  json::Value v = json::parse(R"("a\"b\\c\/d\b\f\n\r\t\u00e9\u20ac\ud83d\ude00")");
  EXPECT_EQ(v.as_string(), "a\"b\\c/d\b\f\n\r\t\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
}

TEST(Json, MalformedInputNamesSourceAndOffset) {
  struct Case {
    const char* text;
    const char* offset;  // "at byte N"
    const char* what;
  };
  const Case cases[] = {
      {"", "at byte 0", "unexpected end"},
      {"{", "at byte 1", "end of input"},
      {"[1,]", "at byte 3", "unexpected character"},
      {"[1 2]", "at byte 3", "expected ',' or ']'"},
      {"{\"a\" 1}", "at byte 5", "expected ':'"},
      {"{\"a\":1,\"a\":2}", "at byte 7", "duplicate key \"a\""},
      {"{1:2}", "at byte 1", "expected a string key"},
      {"\"abc", "at byte 4", "unterminated string"},
      {"\"a\x01\"", "at byte 2", "control character"},
      {"\"\\x\"", "at byte 2", "unknown escape"},
      {"\"\\u12G4\"", "at byte 5", "bad hex digit"},
      {"\"\\ud800\"", "at byte 7", "unpaired high surrogate"},
      {"\"\\udc00\"", "at byte 7", "unpaired low surrogate"},
      {"01", "at byte 1", "trailing characters"},
      {"1.", "at byte 2", "digit expected after '.'"},
      {"1e", "at byte 2", "exponent"},
      {"-", "at byte 1", "unexpected character"},
      {"tru", "at byte 0", "unexpected character"},
      {"1e999", "at byte 0", "out of range"},
      {"[] x", "at byte 3", "trailing characters"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string("input: ") + c.text);
    EXPECT_ERROR_CONTAINS(json::parse(c.text, "my.json"), "my.json", c.offset, c.what);
  }
}

TEST(Json, DepthLimitRefusesDeepNestingWithoutCrashing) {
  std::string ok(json::kMaxDepth, '['), deep(100000, '[');
  ok += std::string(json::kMaxDepth, ']');
  EXPECT_NO_THROW(json::parse(ok));
  EXPECT_ERROR_CONTAINS(json::parse(deep), "nesting deeper than the limit of 64");
  std::string deep_obj;
  for (int i = 0; i < 1000; ++i) deep_obj += "{\"a\":";
  EXPECT_ERROR_CONTAINS(json::parse(deep_obj), "nesting deeper");
}

TEST(Json, WrongKindNamesWhatWasAsked) {
  json::Value v = json::parse("{\"n\": \"7\"}");
  EXPECT_ERROR_CONTAINS(v.find("n")->as_int("key \"n\""), "key \"n\"", "expected a JSON integer", "got string");
  EXPECT_ERROR_CONTAINS(v.items("root"), "root", "expected a JSON array", "got object");
}

TEST(Json, DumpParsesBackToTheSameValueOnRandomDocuments) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  for (int round = 0; round < 50; ++round) {
    json::Value doc = json::Value::object();
    for (int i = 0; i < 20; ++i) {
      std::string key = "k";
      key += std::to_string(i);
      switch (rng.below(5)) {
        case 0: doc.set(key, json::Value::integer(int64_t(rng.next()))); break;
        case 1: doc.set(key, json::Value::number(double(rng.normal()) * std::pow(10.0, double(rng.below(40)) - 20))); break;
        case 2: {
          std::string s;
          for (int j = 0; j < 12; ++j) s += char(rng.below(127) + 1);  // control chars and quotes too
          doc.set(key, json::Value::string(s));
          break;
        }
        case 3: doc.set(key, json::Value::array({json::Value::boolean(rng.below(2)), json::Value()})); break;
        default: doc.set(key, json::Value::object({{"x", json::Value::integer(rng.below(100))}}));
      }
    }
    for (int indent : {-1, 2}) {
      const std::string text = json::dump(doc, indent);
      json::Value back = json::parse(text);
      EXPECT_EQ(json::dump(back, indent), text);
      for (const auto& [k, v] : doc.members()) {
        const json::Value* b = back.find(k);
        ASSERT_NE(b, nullptr) << k;
        if (v.is_integer()) {
          EXPECT_EQ(b->as_int(), v.as_int()) << k;
        } else if (v.is_number()) {
          EXPECT_EQ(b->as_double(), v.as_double()) << k;  // the shortest form reads back exactly
        } else if (v.is_string()) {
          EXPECT_EQ(b->as_string(), v.as_string()) << k;
        }
      }
    }
  }
}

TEST(Json, DumpGoldenAndRefusesNonFinite) {
  json::Value v = json::Value::object({{"a", json::Value::array({json::Value::integer(1), json::Value::number(0.5)})},
                                       {"b", json::Value::string("q\"\n")}});
  EXPECT_EQ(json::dump(v), "{\"a\":[1,0.5],\"b\":\"q\\\"\\n\"}");
  EXPECT_EQ(json::dump(v, 2), "{\n  \"a\": [\n    1,\n    0.5\n  ],\n  \"b\": \"q\\\"\\n\"\n}");
  EXPECT_ERROR_CONTAINS(json::dump(json::Value::number(NAN)), "non-finite");
}

TEST(Json, WholeFloatsKeepTheirDecimalPoint) {
  // Typed readers (transformers' config classes) refuse 10 where a float is declared.
  json::Value v = json::Value::array({json::Value::number(10.0), json::Value::number(-3.0), json::Value::number(0.0),
                                      json::Value::number(1.5), json::Value::number(1e21), json::Value::integer(10)});
  EXPECT_EQ(json::dump(v), "[10.0,-3.0,0.0,1.5,1e+21,10]");
  const json::Value back = json::parse(json::dump(v));
  EXPECT_FALSE(back.items()[0].is_integer());
  EXPECT_TRUE(back.items()[5].is_integer());
  EXPECT_EQ(json::dump(json::parse("{\"swiglu_limit\": 10.0}")), "{\"swiglu_limit\":10.0}");
}

}  // namespace
}  // namespace nvfp4moe
