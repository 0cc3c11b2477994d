// Pattern: regular expressions for user-given filters (`quantize --include`)
// run over names read from untrusted files. Matching is a Thompson NFA
// simulation: time O(text length x pattern length), memory O(pattern length),
// and a stack that grows with neither (std::regex recurses per character and
// overflows the stack on names of a few tens of thousands of characters).
//
// Syntax, a subset of ECMAScript with the same meaning:
//   x            a literal byte (any byte but the ones below)
//   \x           x literally, for any non-alphanumeric x (\. \* \( \\ \[ ...)
//   \d \w \s     digit [0-9], word [A-Za-z0-9_], space [ \t\n\r\f\v]; \D \W \S the complements
//   \n \r \t     newline, carriage return, tab
//   .            any byte but \n and \r
//   [abc] [a-z]  a class; [^...] its complement; \-escapes as above inside
//   e* e+ e?     zero or more, one or more, zero or one (a trailing ? is
//                accepted as ECMAScript's lazy mark; it changes nothing for search)
//   e1|e2        alternatives; ( ) and (?: ) group
//   ^ $          the start and the end of the text
// Refused with an error naming the offset: counted repetition {m,n},
// back-references, lookaround, named or flagged groups, word boundaries,
// nesting deeper than kMaxNesting groups and patterns longer than kMaxLength.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nvfp4moe {

class Pattern {
 public:
  static constexpr size_t kMaxLength = 4096;
  static constexpr int kMaxNesting = 64;

  // Compiles `source`; throws nvfp4moe::Error "<what> '<source>': <problem> at offset N".
  explicit Pattern(std::string_view source, std::string_view what = "pattern");

  // Whether some substring of `text` matches (std::regex_search's question).
  bool search(std::string_view text) const;

  const std::string& source() const { return source_; }

  // One instruction of the compiled program.
  struct Inst {
    enum class Op : uint8_t { Byte, Class, Split, Jump, Begin, End, Match } op;
    uint8_t byte = 0;  // Byte
    int32_t x = 0;     // Class: index into classes_; Split, Jump: target
    int32_t y = 0;     // Split: second target
  };
  using ByteSet = std::array<uint64_t, 4>;  // bit b set: byte b is in the class

 private:
  std::string source_;
  std::vector<Inst> prog_;
  std::vector<ByteSet> classes_;
};

}  // namespace nvfp4moe
