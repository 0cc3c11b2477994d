// Shared test utilities: deterministic generators (one place), fresh seeds
// that every failure prints, and comparisons that report the first mismatch.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "nvfp4moe/error.hpp"

#include "common/splitmix.hpp"
#include "nvfp4moe/types.hpp"

namespace nvfp4moe::test {

// splitmix64: small, fast, reproducible across platforms.
class Rng {
 public:
  explicit Rng(uint64_t seed) : g_{seed} {}
  uint64_t next() { return g_.next(); }
  double uniform() { return g_.uniform(); }                                 // [0, 1)
  float uniform(float lo, float hi) { return lo + float(uniform()) * (hi - lo); }
  float normal();
  int64_t below(int64_t n) { return int64_t(next() % uint64_t(n)); }

 private:
  SplitMix64 g_;
};

// A fresh seed per run (NVFP4MOE_TEST_SEED overrides), so tests see new inputs
// each time; tests put it in SCOPED_TRACE so a failure can be replayed.
uint64_t fresh_seed();

std::vector<float> random_normal(Rng& rng, int64_t n, float stddev = 1.0f);
std::vector<float> random_uniform(Rng& rng, int64_t n, float lo, float hi);

// Relative L2 error ||a - b|| / ||b||, computed in double.
double rel_l2(const std::vector<float>& a, const std::vector<double>& b);
double rel_l2(const std::vector<float>& a, const std::vector<float>& b);

// Index of the first differing byte, or -1.
int64_t first_mismatch(const uint8_t* a, const uint8_t* b, int64_t n);

// Poison value for outputs (a BF16 NaN with a recognisable payload).
constexpr uint16_t kPoisonBf16 = 0x7fa5;

bool gpu_available();

// Runs `fn` and expects an nvfp4moe::Error whose message holds every piece
// (errors must name what was wrong and the offending values). `what` labels
// the failure when nothing is thrown.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> pieces, const char* what = "the call") {
  try {
    fn();
  } catch (const ::nvfp4moe::Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : pieces)
      EXPECT_NE(msg.find(p), std::string::npos) << "message \"" << msg << "\" lacks \"" << p << "\"";
    return;
  }
  ADD_FAILURE() << what << " did not throw nvfp4moe::Error";
}

}  // namespace nvfp4moe::test

// EXPECT_ERROR_CONTAINS(statement, "piece", ...): the statement throws
// nvfp4moe::Error whose message contains every piece.
#define EXPECT_ERROR_CONTAINS(stmt, ...) \
  ::nvfp4moe::test::expect_error([&] { stmt; }, {__VA_ARGS__}, #stmt)

// Expect byte arrays equal; on failure print the first differing index and both bytes.
#define EXPECT_BYTES_EQ(a, b, n, what)                                                   \
  do {                                                                                   \
    int64_t _i = ::nvfp4moe::test::first_mismatch((a), (b), (n));                        \
    EXPECT_EQ(_i, -1) << what << ": first mismatch at byte " << _i << ": got 0x"         \
                      << std::hex << int(_i >= 0 ? (a)[_i] : 0) << " expected 0x"        \
                      << int(_i >= 0 ? (b)[_i] : 0) << std::dec;                         \
  } while (0)
