// A small JSON value, parser and writer (RFC 8259) for safetensors headers,
// config.json and the index files — no external library, since the GPU
// machines have none.
//
// The parser faces hostile input (it is fuzzed through the safetensors
// reader): nesting is limited to kMaxDepth, every error is an nvfp4moe::Error
// that names the source and the byte offset, duplicate object keys are an
// error (a safetensors header with two entries of one name is malformed), and
// integers are kept exactly as int64 (offsets past 2^53 must not round).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nvfp4moe::json {

constexpr int kMaxDepth = 64;

enum class Kind : uint8_t { Null, Bool, Number, String, Array, Object };
const char* kind_name(Kind k);

class Value {
 public:
  using Member = std::pair<std::string, Value>;

  Value() = default;  // null
  static Value boolean(bool b);
  static Value number(double d);
  static Value integer(int64_t i);
  static Value string(std::string s);
  static Value array(std::vector<Value> items = {});
  static Value object(std::vector<Member> members = {});

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::Null; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  bool is_number() const { return kind_ == Kind::Number; }
  bool is_integer() const { return kind_ == Kind::Number && is_int_; }  // written without . or e
  bool is_string() const { return kind_ == Kind::String; }
  bool is_array() const { return kind_ == Kind::Array; }
  bool is_object() const { return kind_ == Kind::Object; }

  // Typed access; each throws naming `what` and the actual kind on a mismatch.
  bool as_bool(std::string_view what = "value") const;
  double as_double(std::string_view what = "value") const;
  int64_t as_int(std::string_view what = "value") const;  // integers only
  const std::string& as_string(std::string_view what = "value") const;
  const std::vector<Value>& items(std::string_view what = "value") const;
  const std::vector<Member>& members(std::string_view what = "value") const;

  // Object lookup (linear; objects here are small or iterated): nullptr if
  // absent or not an object.
  const Value* find(std::string_view key) const;
  // Appends or replaces a member (turns null into an object).
  Value& set(std::string key, Value v);
  // Appends to an array (turns null into an array).
  Value& push(Value v);

 private:
  Kind kind_ = Kind::Null;
  bool bool_ = false;
  bool is_int_ = false;
  double num_ = 0.0;
  int64_t int_ = 0;
  std::string str_;
  std::vector<Value> items_;
  std::vector<Member> members_;
};

// Parses exactly one JSON document (surrounding whitespace allowed). `source`
// names the input in errors ("model.safetensors header", "config.json").
Value parse(std::string_view text, std::string_view source = "JSON");

// Writes `v`; indent < 0 gives the compact form, else pretty-printed with
// that many spaces. Integers are written as integers, every other number
// with a '.' or an exponent (10.0, not 10), so it reads back as a float.
// Non-finite numbers are an error (JSON has none).
std::string dump(const Value& v, int indent = -1);

// `s` as a quoted JSON string literal.
std::string quote(std::string_view s);

}  // namespace nvfp4moe::json
