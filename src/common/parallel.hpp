// parallel_for: split [0, n) into contiguous chunks over the machine's cores.
//
// Threads are started per call (tens of microseconds), so callers use it only
// for work of a millisecond or more and pass a grain that keeps small inputs on
// the calling thread. No global pool: nothing outlives the call.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace nvfp4moe {

// Number of worker threads to use: `requested` if > 0, else the core count.
inline int thread_count(int requested = 0) {
  if (requested > 0) return requested;
  unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : int(hc);
}

// fn(begin, end) over chunks of at least `grain` items; exceptions from any
// chunk are rethrown on the caller.
template <typename Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn, int threads = 0) {
  if (n <= 0) return;
  int64_t workers = std::min<int64_t>(thread_count(threads), std::max<int64_t>(1, n / std::max<int64_t>(1, grain)));
  if (workers <= 1) {
    fn(int64_t(0), n);
    return;
  }
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> failures(static_cast<size_t>(workers), nullptr);
  int64_t chunk = (n + workers - 1) / workers;
  for (int64_t w = 1; w < workers; ++w) {
    int64_t b = w * chunk, e = std::min(n, b + chunk);
    if (b >= e) break;
    pool.emplace_back([&, w, b, e] {
      try {
        fn(b, e);
      } catch (...) {
        failures[size_t(w)] = std::current_exception();
      }
    });
  }
  try {
    fn(int64_t(0), std::min(n, chunk));
  } catch (...) {
    failures[0] = std::current_exception();
  }
  for (auto& t : pool) t.join();
  for (auto& e : failures)
    if (e) std::rethrow_exception(e);
}

}  // namespace nvfp4moe
