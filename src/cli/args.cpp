#include "cli/args.hpp"

#include <algorithm>
#include <cstdlib>

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cli {

Args::Args(int argc, char** argv, std::set<std::string> flags) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      std::string name = a.substr(2);
      auto eq = name.find('=');
      if (eq != std::string::npos) {
        values_[name.substr(0, eq)] = name.substr(eq + 1);
      } else if (flags.count(name)) {
        flags_.insert(name);
      } else {
        NVFP4_CHECK(i + 1 < argc, "option --", name, " needs a value");
        values_[name] = argv[++i];
      }
    } else {
      positional_.push_back(a);
    }
  }
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Args::require(const std::string& name) const {
  auto it = values_.find(name);
  NVFP4_CHECK(it != values_.end(), "missing required option --", name);
  return it->second;
}

std::optional<std::string> Args::value(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

long long Args::get_int(const std::string& name, long long fallback) const {
  auto v = value(name);
  if (!v) return fallback;
  char* end = nullptr;
  long long r = std::strtoll(v->c_str(), &end, 10);
  NVFP4_CHECK(end && *end == 0 && !v->empty(), "--", name, " expects an integer, got '", *v, "'");
  return r;
}

double Args::get_double(const std::string& name, double fallback) const {
  auto v = value(name);
  if (!v) return fallback;
  char* end = nullptr;
  double r = std::strtod(v->c_str(), &end);
  NVFP4_CHECK(end && *end == 0 && !v->empty(), "--", name, " expects a number, got '", *v, "'");
  return r;
}

std::vector<int64_t> Args::get_int_list(const std::string& name, const std::string& fallback, int64_t lo,
                                        int64_t hi) const {
  const std::string s = get(name, fallback);
  std::vector<int64_t> v;
  size_t begin = 0;
  while (begin <= s.size()) {
    const size_t end = std::min(s.find(',', begin), s.size());
    const std::string item = s.substr(begin, end - begin);
    NVFP4_CHECK(!item.empty() && item.size() <= 18 && item.find_first_not_of("0123456789") == std::string::npos,
                "--", name, ": '", item, "' is not an integer in [", lo, ", ", hi, "]");
    v.push_back(std::stoll(item));
    NVFP4_CHECK(v.back() >= lo && v.back() <= hi, "--", name, ": ", v.back(), " is outside [", lo, ", ", hi, "]");
    begin = end + 1;
  }
  return v;
}

void Args::allow_only(const std::set<std::string>& known) const {
  for (const auto& [k, v] : values_) NVFP4_CHECK(known.count(k), "unknown option --", k);
  for (const auto& k : flags_) NVFP4_CHECK(known.count(k), "unknown option --", k);
}

}  // namespace nvfp4moe::cli
