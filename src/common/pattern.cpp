// Pattern (see pattern.hpp): a recursive-descent parser to a small syntax
// tree (its depth bounded by kMaxNesting, so the recursion is too), the
// tree compiled to Thompson's instructions, and a breadth-first simulation
// over the text that keeps each instruction at most once per position.
#include "common/pattern.hpp"

#include <memory>

#include "common/parse_int.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

using Inst = Pattern::Inst;
using ByteSet = Pattern::ByteSet;

void add(ByteSet& s, unsigned b) { s[b >> 6] |= uint64_t(1) << (b & 63); }
bool has(const ByteSet& s, unsigned b) { return (s[b >> 6] >> (b & 63)) & 1; }
void add_range(ByteSet& s, unsigned lo, unsigned hi) {
  for (unsigned b = lo; b <= hi; ++b) add(s, b);
}
ByteSet complement(ByteSet s) {
  for (auto& w : s) w = ~w;
  return s;
}
bool is_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

struct Node {
  enum class Kind : uint8_t { Empty, Byte, Class, Begin, End, Concat, Alt, Star, Plus, Quest } kind = Kind::Empty;
  uint8_t byte = 0;
  ByteSet set{};
  std::vector<Node> kids;
};

class Parser {
 public:
  Parser(std::string_view src, std::string_view what) : s_(src), what_(what) {}

  Node pattern() {
    Node n = alternation(0);
    if (pos_ < s_.size()) fail("unmatched ')'");  // alternation stops only at ')' or the end
    return n;
  }

 private:
  [[noreturn]] void fail(const char* problem) const {
    NVFP4_FAIL(what_, " '", abbreviate(s_, 80), "': ", problem, " at offset ", pos_);
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }

  Node alternation(int depth) {
    Node alt{Node::Kind::Alt};
    alt.kids.push_back(concatenation(depth));
    while (!at_end() && peek() == '|') {
      ++pos_;
      alt.kids.push_back(concatenation(depth));
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Node concatenation(int depth) {
    Node cat{Node::Kind::Concat};
    while (!at_end() && peek() != '|' && peek() != ')') cat.kids.push_back(repetition(depth));
    if (cat.kids.empty()) return Node{Node::Kind::Empty};
    return cat.kids.size() == 1 ? std::move(cat.kids[0]) : cat;
  }

  static bool is_quantifier(char c) { return c == '*' || c == '+' || c == '?'; }

  Node repetition(int depth) {
    if (is_quantifier(peek())) fail("nothing to repeat");
    Node atom_node = atom(depth);
    if (at_end() || !is_quantifier(peek())) return atom_node;
    if (atom_node.kind == Node::Kind::Begin || atom_node.kind == Node::Kind::End) fail("nothing to repeat");
    const char q = s_[pos_++];
    if (!at_end() && peek() == '?') ++pos_;  // lazy: the same answer for search
    if (!at_end() && is_quantifier(peek())) fail("nothing to repeat");
    Node r{q == '*' ? Node::Kind::Star : q == '+' ? Node::Kind::Plus : Node::Kind::Quest};
    r.kids.push_back(std::move(atom_node));
    return r;
  }

  Node atom(int depth) {
    const char c = s_[pos_];
    switch (c) {
      case '(': {
        if (depth + 1 > Pattern::kMaxNesting) fail("groups nested too deeply (the limit is 64)");
        ++pos_;
        if (!at_end() && peek() == '?') {
          if (pos_ + 1 < s_.size() && s_[pos_ + 1] == ':') pos_ += 2;
          else fail("unsupported group '(?'; only '(' and '(?:' are supported");
        }
        Node inner = alternation(depth + 1);
        if (at_end()) fail("missing ')'");
        ++pos_;
        return inner;
      }
      case ')': fail("unmatched ')'");
      case '{':
      case '}': fail("counted repetition {m,n} is not supported (write \\{ or \\} for the character)");
      case '^': ++pos_; return Node{Node::Kind::Begin};
      case '$': ++pos_; return Node{Node::Kind::End};
      case '.': {
        ++pos_;
        Node n{Node::Kind::Class};
        n.set = complement(ByteSet{});
        n.set[0] &= ~((uint64_t(1) << '\n') | (uint64_t(1) << '\r'));
        return n;
      }
      case '[': return byte_class();
      case '\\': {
        Node n{Node::Kind::Class};
        if (escape(n.set, n.byte)) return n;
        n.kind = Node::Kind::Byte;
        return n;
      }
      default: ++pos_; return Node{Node::Kind::Byte, uint8_t(c)};
    }
  }

  // At a backslash: a class escape (fills `set`, returns true) or one byte
  // (sets `byte`, returns false).
  bool escape(ByteSet& set, uint8_t& byte) {
    ++pos_;
    if (at_end()) fail("trailing backslash");
    const char e = s_[pos_++];
    ByteSet s{};
    switch (e) {
      case 'd': case 'D': add_range(s, '0', '9'); break;
      case 'w': case 'W':
        add_range(s, '0', '9'), add_range(s, 'a', 'z'), add_range(s, 'A', 'Z'), add(s, '_');
        break;
      case 's': case 'S':
        for (char w : {' ', '\t', '\n', '\r', '\f', '\v'}) add(s, uint8_t(w));
        break;
      case 'n': byte = '\n'; return false;
      case 'r': byte = '\r'; return false;
      case 't': byte = '\t'; return false;
      default:
        if (is_alnum(e)) {
          --pos_;
          fail("unsupported escape (back-references, \\b and the like are not supported)");
        }
        byte = uint8_t(e);
        return false;
    }
    set = (e >= 'A' && e <= 'Z') ? complement(s) : s;
    return true;
  }

  Node byte_class() {
    ++pos_;  // '['
    Node n{Node::Kind::Class};
    const bool negate = !at_end() && peek() == '^';
    if (negate) ++pos_;
    bool any = false;
    while (true) {
      if (at_end()) fail("missing ']'");
      if (peek() == ']') break;
      // One item: a byte, a class escape, or a range lo-hi of bytes.
      uint8_t lo = 0;
      if (peek() == '\\') {
        ByteSet esc{};
        if (escape(esc, lo)) {
          for (size_t w = 0; w < 4; ++w) n.set[w] |= esc[w];
          if (!at_end() && peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']')
            fail("a range cannot start with a class escape");
          any = true;
          continue;
        }
      } else {
        lo = uint8_t(s_[pos_++]);
      }
      uint8_t hi = lo;
      if (!at_end() && peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
        ++pos_;
        if (peek() == '\\') {
          ByteSet esc{};
          if (escape(esc, hi)) fail("a range cannot end with a class escape");
        } else {
          hi = uint8_t(s_[pos_++]);
        }
        if (hi < lo) fail("range out of order in a character class");
      }
      add_range(n.set, lo, hi);
      any = true;
    }
    if (!any) fail("empty character class");
    ++pos_;  // ']'
    if (negate) n.set = complement(n.set);
    return n;
  }

  std::string_view s_;
  std::string_view what_;
  size_t pos_ = 0;
};

class Compiler {
 public:
  Compiler(std::vector<Inst>& prog, std::vector<ByteSet>& classes) : prog_(prog), classes_(classes) {}

  void emit(const Node& n) {
    switch (n.kind) {
      case Node::Kind::Empty: return;
      case Node::Kind::Byte: prog_.push_back({Inst::Op::Byte, n.byte}); return;
      case Node::Kind::Class:
        classes_.push_back(n.set);
        prog_.push_back({Inst::Op::Class, 0, int32_t(classes_.size() - 1)});
        return;
      case Node::Kind::Begin: prog_.push_back({Inst::Op::Begin}); return;
      case Node::Kind::End: prog_.push_back({Inst::Op::End}); return;
      case Node::Kind::Concat:
        for (const Node& k : n.kids) emit(k);
        return;
      case Node::Kind::Alt: {
        // Split(a, next); a; Jump(end); next: Split(b, next2); b; Jump(end); ... last
        std::vector<size_t> jumps;
        for (size_t i = 0; i + 1 < n.kids.size(); ++i) {
          const size_t split = prog_.size();
          prog_.push_back({Inst::Op::Split, 0, int32_t(split + 1)});
          emit(n.kids[i]);
          jumps.push_back(prog_.size());
          prog_.push_back({Inst::Op::Jump});
          prog_[split].y = here();
        }
        emit(n.kids.back());
        for (size_t j : jumps) prog_[j].x = here();
        return;
      }
      case Node::Kind::Star: {  // L: Split(body, out); body; Jump(L); out:
        const size_t split = prog_.size();
        prog_.push_back({Inst::Op::Split, 0, int32_t(split + 1)});
        emit(n.kids[0]);
        prog_.push_back({Inst::Op::Jump, 0, int32_t(split)});
        prog_[split].y = here();
        return;
      }
      case Node::Kind::Plus: {  // L: body; Split(L, out); out:
        const int32_t body = here();
        emit(n.kids[0]);
        prog_.push_back({Inst::Op::Split, 0, body, int32_t(prog_.size() + 1)});
        return;
      }
      case Node::Kind::Quest: {  // Split(body, out); body; out:
        const size_t split = prog_.size();
        prog_.push_back({Inst::Op::Split, 0, int32_t(split + 1)});
        emit(n.kids[0]);
        prog_[split].y = here();
        return;
      }
    }
  }

 private:
  int32_t here() const { return int32_t(prog_.size()); }
  std::vector<Inst>& prog_;
  std::vector<ByteSet>& classes_;
};

}  // namespace

Pattern::Pattern(std::string_view source, std::string_view what) : source_(source) {
  NVFP4_CHECK(source.size() <= kMaxLength, what, " '", abbreviate(source, 80), "': ", source.size(),
              " characters, the limit is ", kMaxLength);
  const Node tree = Parser(source, what).pattern();
  Compiler(prog_, classes_).emit(tree);
  prog_.push_back({Inst::Op::Match});
}

bool Pattern::search(std::string_view text) const {
  const size_t n = text.size(), m = prog_.size();
  // mark[pc] == position + 1: pc is already in the list of that position.
  std::vector<size_t> mark(m, 0);
  std::vector<int32_t> current, next, stack;
  current.reserve(m), next.reserve(m), stack.reserve(m);
  // Follows the non-consuming instructions from `start` at `pos`, adding the
  // consuming ones to `list`; true when Match is reached.
  auto add_thread = [&](std::vector<int32_t>& list, int32_t start, size_t pos) {
    stack.push_back(start);
    while (!stack.empty()) {
      const int32_t pc = stack.back();
      stack.pop_back();
      if (mark[size_t(pc)] == pos + 1) continue;
      mark[size_t(pc)] = pos + 1;
      const Inst& in = prog_[size_t(pc)];
      switch (in.op) {
        case Inst::Op::Byte:
        case Inst::Op::Class: list.push_back(pc); break;
        case Inst::Op::Jump: stack.push_back(in.x); break;
        case Inst::Op::Split:
          stack.push_back(in.y);
          stack.push_back(in.x);
          break;
        case Inst::Op::Begin:
          if (pos == 0) stack.push_back(pc + 1);
          break;
        case Inst::Op::End:
          if (pos == n) stack.push_back(pc + 1);
          break;
        case Inst::Op::Match: stack.clear(); return true;
      }
    }
    return false;
  };
  if (add_thread(current, 0, 0)) return true;
  for (size_t pos = 0; pos < n; ++pos) {
    const uint8_t b = uint8_t(text[pos]);
    next.clear();
    for (const int32_t pc : current) {
      const Inst& in = prog_[size_t(pc)];
      const bool takes = in.op == Inst::Op::Byte ? in.byte == b : has(classes_[size_t(in.x)], b);
      if (takes && add_thread(next, pc + 1, pos + 1)) return true;
    }
    if (add_thread(next, 0, pos + 1)) return true;  // a match may start at any position
    current.swap(next);
  }
  return false;
}

}  // namespace nvfp4moe
