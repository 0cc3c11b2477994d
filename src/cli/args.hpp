// A small argument parser shared by every subcommand: --name value, --flag,
// positionals. Unknown options are an error that names them.
#pragma once

#include <map>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace nvfp4moe::cli {

class Args {
 public:
  // `flags` are options without a value; every other --option takes one.
  Args(int argc, char** argv, std::set<std::string> flags = {});
  bool has(const std::string& name) const { return flags_.count(name) || values_.count(name); }
  std::string get(const std::string& name, const std::string& fallback) const;
  std::string require(const std::string& name) const;  // throws "missing --name"
  std::optional<std::string> value(const std::string& name) const;
  long long get_int(const std::string& name, long long fallback) const;
  double get_double(const std::string& name, double fallback) const;
  // A comma-separated list of integers in [lo, hi] ("1,8,64"); throws naming
  // the option and the item that is not one.
  std::vector<int64_t> get_int_list(const std::string& name, const std::string& fallback, int64_t lo,
                                    int64_t hi) const;
  const std::vector<std::string>& positional() const { return positional_; }
  // Throws naming any option not in `known`.
  void allow_only(const std::set<std::string>& known) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
  std::vector<std::string> positional_;
};

}  // namespace nvfp4moe::cli
