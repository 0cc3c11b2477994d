// run_items: a dynamic work queue over [0, n) for the CPU backend's tiles.
//
// parallel_for splits work into equal contiguous chunks; expert tiles are not
// equal (an expert with 40 tokens costs 40x one with 1), so workers here take
// the next item from an atomic counter instead. The workers are those of a
// WorkerPool (the backend's, started once); `worker` (0..workers-1) indexes
// per-thread scratch.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/worker_pool.hpp"

namespace nvfp4moe::cpu {

// Workers that run_items will use for n items on `pool`.
inline int item_workers(int64_t n, const WorkerPool& pool) {
  return int(std::max<int64_t>(1, std::min<int64_t>(pool.size(), n)));
}

// fn(item, worker) for every item; the first exception is rethrown on the
// caller after all workers stop (later items are skipped once one failed).
template <typename Fn>
void run_items(int64_t n, WorkerPool& pool, Fn&& fn) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  pool.run(item_workers(n, pool), [&](int worker) {
    try {
      for (int64_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < n;) fn(i, worker);
    } catch (...) {
      failed = true;
      throw;
    }
  });
}

}  // namespace nvfp4moe::cpu
