#include "common/json.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::json {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Null: return "null";
    case Kind::Bool: return "bool";
    case Kind::Number: return "number";
    case Kind::String: return "string";
    case Kind::Array: return "array";
    case Kind::Object: return "object";
  }
  return "?";
}

// ---- Value ------------------------------------------------------------------

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::Bool;
  v.bool_ = b;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::Number;
  v.num_ = d;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::Number;
  v.is_int_ = true;
  v.int_ = i;
  v.num_ = double(i);
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::String;
  v.str_ = std::move(s);
  return v;
}
Value Value::array(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::Array;
  v.items_ = std::move(items);
  return v;
}
Value Value::object(std::vector<Member> members) {
  Value v;
  v.kind_ = Kind::Object;
  v.members_ = std::move(members);
  return v;
}

namespace {
[[noreturn]] void wrong_kind(std::string_view what, const char* want, Kind got) {
  NVFP4_FAIL(what, ": expected a JSON ", want, ", got ", kind_name(got));
}
}  // namespace

bool Value::as_bool(std::string_view what) const {
  if (kind_ != Kind::Bool) wrong_kind(what, "bool", kind_);
  return bool_;
}
double Value::as_double(std::string_view what) const {
  if (kind_ != Kind::Number) wrong_kind(what, "number", kind_);
  return num_;
}
int64_t Value::as_int(std::string_view what) const {
  if (kind_ != Kind::Number) wrong_kind(what, "integer", kind_);
  NVFP4_CHECK(is_int_, what, ": expected an integer, got ", num_,
              std::fabs(num_) >= 9.2e18 ? " (beyond the 64-bit integer range)" : "");
  return int_;
}
const std::string& Value::as_string(std::string_view what) const {
  if (kind_ != Kind::String) wrong_kind(what, "string", kind_);
  return str_;
}
const std::vector<Value>& Value::items(std::string_view what) const {
  if (kind_ != Kind::Array) wrong_kind(what, "array", kind_);
  return items_;
}
const std::vector<Value::Member>& Value::members(std::string_view what) const {
  if (kind_ != Kind::Object) wrong_kind(what, "object", kind_);
  return members_;
}

const Value* Value::find(std::string_view key) const {
  if (kind_ != Kind::Object) return nullptr;
  for (const auto& m : members_)
    if (m.first == key) return &m.second;
  return nullptr;
}

Value& Value::set(std::string key, Value v) {
  if (kind_ == Kind::Null) kind_ = Kind::Object;
  NVFP4_CHECK(kind_ == Kind::Object, "json::Value::set(\"", key, "\") on a ", kind_name(kind_));
  for (auto& m : members_)
    if (m.first == key) return m.second = std::move(v);
  members_.emplace_back(std::move(key), std::move(v));
  return members_.back().second;
}

Value& Value::push(Value v) {
  if (kind_ == Kind::Null) kind_ = Kind::Array;
  NVFP4_CHECK(kind_ == Kind::Array, "json::Value::push on a ", kind_name(kind_));
  items_.push_back(std::move(v));
  return items_.back();
}

// ---- parser -----------------------------------------------------------------

namespace {

class Parser {
 public:
  Parser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  Value document() {
    skip_ws();
    Value v = value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("trailing characters after the JSON value");
    return v;
  }

 private:
  std::string_view s_;
  std::string_view source_;
  size_t pos_ = 0;

  [[noreturn]] void fail(std::string_view msg) const {
    NVFP4_FAIL(source_, ": invalid JSON at byte ", pos_, ": ", msg);
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }

  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }

  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail("unexpected character");
    pos_ += lit.size();
  }

  Value value(int depth) {
    if (at_end()) fail("unexpected end of input");
    switch (s_[pos_]) {
      case '{': return object(depth + 1);
      case '[': return array(depth + 1);
      case '"': return Value::string(string());
      case 't': expect_literal("true"); return Value::boolean(true);
      case 'f': expect_literal("false"); return Value::boolean(false);
      case 'n': expect_literal("null"); return Value();
      default: return number();
    }
  }

  void check_depth(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than the limit of " + std::to_string(kMaxDepth));
  }

  Value array(int depth) {
    check_depth(depth);
    ++pos_;  // '['
    std::vector<Value> items;
    skip_ws();
    if (peek() == ']') {
      ++pos_;
      return Value::array(std::move(items));
    }
    for (;;) {
      skip_ws();
      items.push_back(value(depth));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return Value::array(std::move(items));
      }
      fail(at_end() ? "unexpected end of input in an array" : "expected ',' or ']' in an array");
    }
  }

  Value object(int depth) {
    check_depth(depth);
    ++pos_;  // '{'
    std::vector<Value::Member> members;
    std::unordered_set<std::string> seen;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return Value::object(std::move(members));
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail(at_end() ? "unexpected end of input in an object" : "expected a string key");
      size_t key_pos = pos_;
      std::string key = string();
      if (!seen.insert(key).second) {
        pos_ = key_pos;
        fail("duplicate key " + quote(key));
      }
      skip_ws();
      if (peek() != ':') fail("expected ':' after an object key");
      ++pos_;
      skip_ws();
      Value v = value(depth);
      members.emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return Value::object(std::move(members));
      }
      fail(at_end() ? "unexpected end of input in an object" : "expected ',' or '}' in an object");
    }
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') v |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= unsigned(c - 'A' + 10);
      else { --pos_; fail("bad hex digit in a \\u escape"); }
    }
    return v;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  std::string string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      ++pos_;
      if (at_end()) fail("unterminated escape");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low surrogate.
            if (s_.substr(pos_, 2) != "\\u") fail("unpaired high surrogate in a \\u escape");
            pos_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("bad low surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("unpaired low surrogate in a \\u escape");
          }
          put_utf8(out, cp);
          break;
        }
        default: --pos_; fail("unknown escape character");
      }
    }
  }

  Value number() {
    size_t start = pos_;
    bool is_int = true;
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (peek() >= '1' && peek() <= '9') {
      while (peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      fail("unexpected character");
    }
    if (peek() == '.') {
      is_int = false;
      ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("digit expected after '.'");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (peek() == 'e' || peek() == 'E') {
      is_int = false;
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!(peek() >= '0' && peek() <= '9')) fail("digit expected in an exponent");
      while (peek() >= '0' && peek() <= '9') ++pos_;
    }
    const char* b = s_.data() + start;
    const char* e = s_.data() + pos_;
    if (is_int) {
      int64_t i = 0;
      auto r = std::from_chars(b, e, i);
      if (r.ec == std::errc() && r.ptr == e) return Value::integer(i);
      // Too large for int64: keep it as a double (offsets that large are
      // rejected by the callers that need exact integers).
    }
    double d = 0;
    auto r = std::from_chars(b, e, d);
    if (r.ec == std::errc::result_out_of_range) {
      pos_ = start;
      fail("number out of range");
    }
    if (r.ec != std::errc() || r.ptr != e) {
      pos_ = start;
      fail("malformed number");
    }
    return Value::number(d);
  }
};

void dump_to(std::string& out, const Value& v, int indent, int level) {
  auto newline = [&](int lv) {
    if (indent < 0) return;
    out += '\n';
    out.append(size_t(indent * lv), ' ');
  };
  switch (v.kind()) {
    case Kind::Null: out += "null"; return;
    case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::Number: {
      char buf[64];
      std::to_chars_result r;
      if (v.is_integer()) {
        r = std::to_chars(buf, buf + sizeof buf, v.as_int());
      } else {
        double d = v.as_double();
        NVFP4_CHECK(std::isfinite(d), "json::dump: non-finite number ", d, " has no JSON form");
        r = std::to_chars(buf, buf + sizeof buf, d);  // shortest form that reads back exactly
      }
      out.append(buf, r.ptr);
      // A number that is not an integer keeps a '.' or an exponent even when
      // its value is whole (10.0, not 10): strict readers such as typed
      // config classes refuse an integer where a float is declared.
      if (!v.is_integer() && std::find_if(buf, r.ptr, [](char c) { return c == '.' || c == 'e'; }) == r.ptr)
        out += ".0";
      return;
    }
    case Kind::String: out += quote(v.as_string()); return;
    case Kind::Array: {
      const auto& items = v.items();
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        dump_to(out, items[i], indent, level + 1);
      }
      if (!items.empty()) newline(level);
      out += ']';
      return;
    }
    case Kind::Object: {
      const auto& members = v.members();
      out += '{';
      for (size_t i = 0; i < members.size(); ++i) {
        if (i) out += ',';
        newline(level + 1);
        out += quote(members[i].first);
        out += indent < 0 ? ":" : ": ";
        dump_to(out, members[i].second, indent, level + 1);
      }
      if (!members.empty()) newline(level);
      out += '}';
      return;
    }
  }
}

}  // namespace

Value parse(std::string_view text, std::string_view source) { return Parser(text, source).document(); }

std::string dump(const Value& v, int indent) {
  std::string out;
  dump_to(out, v, indent, 0);
  return out;
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace nvfp4moe::json
