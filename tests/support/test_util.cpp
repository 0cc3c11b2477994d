#include "support/test_util.hpp"

#include <chrono>
#include <cstdlib>
#include <random>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::test {

float Rng::normal() {
  // Box-Muller on two uniforms; (0,1] for the log.
  double u1 = 1.0 - uniform(), u2 = uniform();
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

uint64_t fresh_seed() {
  if (const char* s = std::getenv("NVFP4MOE_TEST_SEED")) return std::strtoull(s, nullptr, 0);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd()) ^
         uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
}

std::vector<float> random_normal(Rng& rng, int64_t n, float stddev) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.normal() * stddev;
  return v;
}

std::vector<float> random_uniform(Rng& rng, int64_t n, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

double rel_l2(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    double d = double(a[i]) - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  return rel_l2(a, std::vector<double>(b.begin(), b.end()));
}

int64_t first_mismatch(const uint8_t* a, const uint8_t* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (a[i] != b[i]) return i;
  return -1;
}

bool gpu_available() { return cuda_available(); }

}  // namespace nvfp4moe::test
