// Args (see args.hpp).
#include "cli/args.hpp"

#include <algorithm>

#include "common/parse_int.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cli {

namespace {

std::string option_list(const std::map<std::string, Option>& options) {
  std::string r;
  for (const auto& [name, o] : options) r += (r.empty() ? "--" : ", --") + name;
  return r;
}

const char* kind_name(Option::Kind k) {
  switch (k) {
    case Option::Kind::Flag: return "a flag";
    case Option::Kind::Text: return "a text option";
    case Option::Kind::Integer: return "an integer option";
    case Option::Kind::IntList: return "an integer-list option";
    case Option::Kind::Choice: return "a choice option";
  }
  return "an option";
}

}  // namespace

Args::Args(int argc, char** argv, std::vector<Option> options, size_t max_positional) {
  for (Option& o : options) {
    const std::string name = o.name;
    NVFP4_CHECK(options_.emplace(name, std::move(o)).second, "internal: option --", name, " declared twice");
  }
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
      const size_t eq = a.find('=');
      const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      auto it = options_.find(name);
      NVFP4_CHECK(it != options_.end(), "unknown option --", abbreviate(name), " (this command takes ",
                  option_list(options_), ")");
      const Option& o = it->second;
      NVFP4_CHECK(!flags_.count(name) && !values_.count(name), "option --", name, " is given twice");
      if (o.kind == Option::Kind::Flag) {
        NVFP4_CHECK(eq == std::string::npos, "option --", name, " is a flag and takes no value, got '",
                    abbreviate(a.substr(eq + 1)), "'");
        flags_.insert(name);
        continue;
      }
      std::string v;
      if (eq != std::string::npos) {
        v = a.substr(eq + 1);
      } else {
        NVFP4_CHECK(i + 1 < argc, "option --", name, " needs a value");
        v = argv[++i];
        NVFP4_CHECK(v.compare(0, 2, "--") != 0, "option --", name, " needs a value, got the option '",
                    abbreviate(v), "' (write --", name, "=VALUE for a value that starts with --)");
      }
      check_value(o, v);
      values_[name] = std::move(v);
    } else {
      NVFP4_CHECK(a.size() < 2 || a[0] != '-', "unknown option '", abbreviate(a), "' (options start with --)");
      NVFP4_CHECK(positional_.size() < max_positional, "unexpected argument '", abbreviate(a), "'",
                  " (the command takes at most " + std::to_string(max_positional) + ")");
      positional_.push_back(a);
    }
  }
}

void Args::check_value(const Option& o, const std::string& v) const {
  const std::string what = "--" + o.name;
  switch (o.kind) {
    case Option::Kind::Flag:
    case Option::Kind::Text: return;
    case Option::Kind::Integer: parse_int(v, o.lo, o.hi, what); return;
    case Option::Kind::IntList: {
      size_t begin = 0;
      while (true) {
        const size_t end = std::min(v.find(',', begin), v.size());
        parse_int(std::string_view(v).substr(begin, end - begin), o.lo, o.hi, what + " item");
        if (end == v.size()) return;
        begin = end + 1;
      }
    }
    case Option::Kind::Choice: {
      std::string list;
      for (const std::string& c : o.choices) {
        if (c == v) return;
        list += (list.empty() ? "" : ", ") + c;
      }
      NVFP4_FAIL(what, ": '", abbreviate(v), "' is not one of ", list);
    }
  }
}

const Option& Args::declared(const std::string& name, Option::Kind kind) const {
  auto it = options_.find(name);
  NVFP4_CHECK(it != options_.end(), "internal: option --", name, " is not declared by this command");
  const bool ok = it->second.kind == kind ||
                  (kind == Option::Kind::Text && it->second.kind == Option::Kind::Choice);
  NVFP4_CHECK(ok, "internal: option --", name, " is ", kind_name(it->second.kind), ", read as ", kind_name(kind));
  return it->second;
}

bool Args::has(const std::string& name) const {
  NVFP4_CHECK(options_.count(name), "internal: option --", name, " is not declared by this command");
  return flags_.count(name) || values_.count(name);
}

std::optional<std::string> Args::value(const std::string& name) const {
  declared(name, Option::Kind::Text);
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get(const std::string& name, const std::string& fallback) const {
  return value(name).value_or(fallback);
}

std::string Args::require(const std::string& name) const {
  const std::optional<std::string> v = value(name);
  NVFP4_CHECK(v.has_value(), "missing required option --", name);
  return *v;
}

int64_t Args::get_int(const std::string& name, int64_t fallback) const {
  const Option& o = declared(name, Option::Kind::Integer);
  auto it = values_.find(name);
  return it == values_.end() ? fallback : parse_int(it->second, o.lo, o.hi, "--" + name);
}

int64_t Args::require_int(const std::string& name) const {
  const Option& o = declared(name, Option::Kind::Integer);
  auto it = values_.find(name);
  NVFP4_CHECK(it != values_.end(), "missing required option --", name, " (an integer in [", o.lo, ", ", o.hi, "])");
  return parse_int(it->second, o.lo, o.hi, "--" + name);
}

std::vector<int64_t> Args::get_int_list(const std::string& name, const std::string& fallback) const {
  const Option& o = declared(name, Option::Kind::IntList);
  auto it = values_.find(name);
  const std::string s = it == values_.end() ? fallback : it->second;
  std::vector<int64_t> v;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(s.find(',', begin), s.size());
    v.push_back(parse_int(std::string_view(s).substr(begin, end - begin), o.lo, o.hi, "--" + name + " item"));
    if (end == s.size()) return v;
    begin = end + 1;
  }
}

bool mentions(int argc, char** argv, const std::string& name) {
  const std::string opt = "--" + name;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == opt || a.compare(0, opt.size() + 1, opt + "=") == 0) return true;
  }
  return false;
}

}  // namespace nvfp4moe::cli
