// nvfp4moe — the one exception type and the check macro.
//
// Every failure the library reports is an nvfp4moe::Error whose message names
// what was wrong and the offending values (docs/numerics.md §6).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace nvfp4moe {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
// Builds "file:line: message" from any streamable pieces.
template <typename... Parts>
[[noreturn]] void fail(const char* file, int line, const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  (void)file;
  (void)line;
  throw Error(os.str());
}
}  // namespace detail

}  // namespace nvfp4moe

// NVFP4_CHECK(cond, "what", value, ...): throws nvfp4moe::Error with the
// message pieces streamed together. Callers pass the offending values, e.g.
//   NVFP4_CHECK(k % 16 == 0, "K must be a multiple of 16, got K=", k);
#define NVFP4_CHECK(cond, ...)                                   \
  do {                                                           \
    if (!(cond)) ::nvfp4moe::detail::fail(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#define NVFP4_FAIL(...) ::nvfp4moe::detail::fail(__FILE__, __LINE__, __VA_ARGS__)
