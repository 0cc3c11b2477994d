// WorkerPool: threads started once by their owner (the CPU backend) and
// reused by every parallel stage of every call, so a stage pays a wake-up
// (microseconds) instead of a thread start (tens of microseconds per thread)
// and both cores stream weights from the start of a batch-1 projection.
//
// One job at a time: run() from inside a job, or from a second thread while a
// job runs, executes that job's workers one after another on the caller (same
// results: jobs here never depend on which thread runs a worker index).
// Idle workers spin briefly for the next stage, then sleep on a futex.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/parallel.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define NVFP4_POOL_PAUSE() _mm_pause()
#else
#define NVFP4_POOL_PAUSE() ((void)0)
#endif

namespace nvfp4moe {

class WorkerPool {
 public:
  // `threads` workers in all, the caller of run() being worker 0
  // (thread_count(threads): 0 means one per core).
  explicit WorkerPool(int threads = 0) : size_(thread_count(threads)) {
    errors_.resize(size_t(size_));
    for (int w = 1; w < size_; ++w) threads_.emplace_back([this, w] { loop(w); });
  }
  ~WorkerPool() {
    stop_.store(true);
    generation_.fetch_add(1);
    generation_.notify_all();
    for (auto& t : threads_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return size_; }

  // fn(worker) for worker in [0, n), n clamped to [1, size()]; returns when all
  // returned. The exception of the lowest-numbered failing worker is rethrown.
  void run(int n, const std::function<void(int)>& fn) {
    n = std::clamp(n, 1, size_);
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (n == 1 || !busy.owns_lock()) {
      for (int w = 0; w < n; ++w) fn(w);
      return;
    }
    fn_ = &fn;
    active_ = n;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    pending_.store(size_ - 1);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    try {
      fn(0);
    } catch (...) {
      errors_[0] = std::current_exception();
    }
    spin_then_wait(pending_, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    for (auto& e : errors_)
      if (e) std::rethrow_exception(e);
  }

 private:
  // Spins up to ~50 us (the gap between two stages of a forward), then
  // sleeps on the atomic until `done()`.
  template <typename A, typename Done>
  static void spin_then_wait(A& atom, Done&& done) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; !done(); ++i) {
      NVFP4_POOL_PAUSE();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() - t0 > std::chrono::microseconds(50)) {
        for (auto v = atom.load(); !done(); v = atom.load()) atom.wait(v);
        return;
      }
    }
  }

  void loop(int w) {
    uint32_t seen = 0;
    for (;;) {
      spin_then_wait(generation_, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load()) return;
      if (w < active_) {
        try {
          (*fn_)(w);
        } catch (...) {
          errors_[size_t(w)] = std::current_exception();
        }
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  const int size_;
  std::vector<std::thread> threads_;
  std::mutex busy_;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  const std::function<void(int)>* fn_ = nullptr;
  int active_ = 0;
  std::vector<std::exception_ptr> errors_;
};

// parallel_for on a pool: fn(begin, end) over contiguous chunks of at least
// `grain` items, at most one per worker.
template <typename Fn>
void parallel_for(WorkerPool& pool, int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  const int64_t workers = std::min<int64_t>(pool.size(), std::max<int64_t>(1, n / std::max<int64_t>(1, grain)));
  if (workers <= 1) {
    fn(int64_t(0), n);
    return;
  }
  const int64_t chunk = (n + workers - 1) / workers;
  pool.run(int(workers), [&](int w) {
    const int64_t b = w * chunk, e = std::min(n, b + chunk);
    if (b < e) fn(b, e);
  });
}

}  // namespace nvfp4moe
