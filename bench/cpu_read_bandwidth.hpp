// Read bandwidth of a WorkerPool's threads, for the CPU benches' memory floors.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include <immintrin.h>

#include "common/worker_pool.hpp"

namespace nvfp4moe::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Sum of 64-bit words [b, e) with 256-bit loads where the CPU has AVX2 (a
// scalar loop does not reach the memory bandwidth of a core).
__attribute__((target("avx2"))) inline uint64_t read_words_avx2(const uint64_t* p, int64_t n) {
  __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
  for (int64_t i = 0; i + 16 <= n; i += 16)
    for (int l = 0; l < 4; ++l)
      acc[l] = _mm256_add_epi64(acc[l], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4 * l)));
  alignas(32) uint64_t v[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(v), _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]),
                                                                     _mm256_add_epi64(acc[2], acc[3])));
  return v[0] + v[1] + v[2] + v[3];
}
inline uint64_t read_words(const uint64_t* p, int64_t n) {
  if (__builtin_cpu_supports("avx2")) return read_words_avx2(p, n);
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];
  return s;
}

// Read bandwidth of the pool's workers streaming disjoint parts of a buffer
// larger than the caches (bytes / s, median of 5).
inline double read_bandwidth(WorkerPool& pool, const std::vector<uint64_t>& buf) {
  std::vector<double> t;
  std::atomic<uint64_t> sink{0};
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    parallel_for(pool, int64_t(buf.size()), 1 << 16,
                 [&](int64_t b, int64_t e) { sink += read_words(buf.data() + b, e - b); });
    t.push_back(seconds_since(t0));
  }
  return double(buf.size() * 8) / median(t);
}

}  // namespace nvfp4moe::bench
