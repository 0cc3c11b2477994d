// The one argument parser of every subcommand. A command declares its
// options in a table, one line per option, and parsing checks every rule
// before the command does any work:
//
//   const Args args(argc, argv, {flag("help"), text("model"),
//                                integer("layer", 0, kMaxLayer),
//                                choice("device", {"cpu", "cuda"}),
//                                int_list("tokens", 1, kMaxTokens)});
//
// Rules, the same for all commands: options are `--name value` or
// `--name=value` (a flag takes no value); an option not in the table, an
// option given twice, a missing value, a flag given a value, an integer that
// is not one or lies outside its bounds, a choice not among its values and a
// positional argument beyond the command's count are errors naming the
// option and the value. A value after a space may not start with "--" (a
// forgotten value would otherwise swallow the next option; --name=--x is
// accepted), and a positional argument may not start with "-".
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace nvfp4moe::cli {

// Bounds shared by the commands' tables.
constexpr int64_t kMaxThreads = 1024;      // --threads: worker threads of the CPU backend
constexpr int64_t kMaxLayer = 65535;       // --layer: a block index (DeepSeek-V4 has 61)
constexpr int64_t kMaxTokens = 1 << 24;    // --tokens, --max-tokens
constexpr int64_t kMaxIters = 1000000;     // --iters, --warmup
constexpr int64_t kMaxRanks = 64;          // --ep
constexpr int64_t kMaxSeed = INT64_MAX;    // --seed: any non-negative 64-bit integer
constexpr int64_t kMaxGpuIndex = 255;      // bench --device N

struct Option {
  enum class Kind : uint8_t { Flag, Text, Integer, IntList, Choice };
  std::string name;  // without the leading "--"
  Kind kind = Kind::Flag;
  int64_t lo = 0, hi = 0;            // Integer, IntList: the accepted range
  std::vector<std::string> choices;  // Choice
};

inline Option option(std::string name, Option::Kind kind, int64_t lo = 0, int64_t hi = 0,
                     std::vector<std::string> choices = {}) {
  Option o;
  o.name = std::move(name);
  o.kind = kind;
  o.lo = lo;
  o.hi = hi;
  o.choices = std::move(choices);
  return o;
}
inline Option flag(std::string name) { return option(std::move(name), Option::Kind::Flag); }
inline Option text(std::string name) { return option(std::move(name), Option::Kind::Text); }
inline Option integer(std::string name, int64_t lo, int64_t hi) {
  return option(std::move(name), Option::Kind::Integer, lo, hi);
}
// A comma-separated list of integers in [lo, hi] ("1,8,64").
inline Option int_list(std::string name, int64_t lo, int64_t hi) {
  return option(std::move(name), Option::Kind::IntList, lo, hi);
}
inline Option choice(std::string name, std::vector<std::string> choices) {
  return option(std::move(name), Option::Kind::Choice, 0, 0, std::move(choices));
}

class Args {
 public:
  // Parses argv[0, argc) (the arguments after the command's name) against
  // `options`, allowing at most `max_positional` positional arguments.
  Args(int argc, char** argv, std::vector<Option> options, size_t max_positional = 0);

  bool has(const std::string& name) const;
  std::optional<std::string> value(const std::string& name) const;  // Text, Choice
  std::string get(const std::string& name, const std::string& fallback) const;
  std::string require(const std::string& name) const;  // throws "missing required option --name"
  int64_t get_int(const std::string& name, int64_t fallback) const;
  int64_t require_int(const std::string& name) const;
  std::vector<int64_t> get_int_list(const std::string& name, const std::string& fallback) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  // The option's declaration, checked against the accessor's kind (a
  // mismatch is a defect in the command, reported as such).
  const Option& declared(const std::string& name, Option::Kind kind) const;
  void check_value(const Option& o, const std::string& v) const;

  std::map<std::string, Option> options_;
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
  std::vector<std::string> positional_;
};

// Whether argv[0, argc) gives option --name (as "--name" or "--name=..."):
// for a command that hands its arguments to another's table (bench --ep).
bool mentions(int argc, char** argv, const std::string& name);

}  // namespace nvfp4moe::cli
