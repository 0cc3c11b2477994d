// run_items: a dynamic work queue over [0, n) for the CPU backend's tiles.
//
// parallel_for splits work into equal contiguous chunks; expert tiles are not
// equal (an expert with 40 tokens costs 40x one with 1), so workers here take
// the next item from an atomic counter instead. Threads live for one call
// only (no global pool); `worker` (0..threads-1) indexes per-thread scratch.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "common/parallel.hpp"

namespace nvfp4moe::cpu {

// Workers that run_items will use for n items.
inline int item_workers(int64_t n, int threads) {
  return int(std::max<int64_t>(1, std::min<int64_t>(thread_count(threads), n)));
}

// fn(item, worker) for every item; the first exception is rethrown on the
// caller after all workers stop (later items are skipped once one failed).
template <typename Fn>
void run_items(int64_t n, int threads, Fn&& fn) {
  if (n <= 0) return;
  const int workers = item_workers(n, threads);
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(workers));
  auto work = [&](int worker) {
    try {
      for (int64_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) fn(i, worker);
    } catch (...) {
      errors[size_t(worker)] = std::current_exception();
      failed = true;
    }
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work, w);
  work(0);
  for (auto& t : pool) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace nvfp4moe::cpu
