// run_stages: items 0 .. n-1 through a fixed chain of stages, one thread per
// stage, so that stage s works on item i while stage s+1 works on an earlier
// item (reading the next tensor while the GPU quantizes this one and the
// previous one is written).
//
// Ordering: every stage takes the items in order; item i enters stage s only
// after it left stage s-1; it enters stage 0 only after item i - slots left
// the last stage, so the `slots` buffers an item may hold (slot = i % slots)
// are never shared by two items in flight. Everything a stage wrote for an
// item is visible to the later stages of that item (a mutex orders them).
// A stage that throws stops the chain: no stage starts another item, and
// run_stages rethrows the first failure once every thread has returned.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nvfp4moe {

// The time one stage spent in its function and waiting for its next item.
struct StageTimes {
  double busy_ms = 0, wait_ms = 0;
};

using Stage = std::function<void(int64_t item, int slot)>;

inline std::vector<StageTimes> run_stages(int64_t n, int slots, const std::vector<Stage>& stages) {
  using Clock = std::chrono::steady_clock;
  const size_t S = stages.size();
  std::vector<StageTimes> times(S);
  if (n <= 0 || S == 0) return times;
  if (slots < 1) slots = 1;
  std::mutex m;
  std::condition_variable cv;
  std::vector<int64_t> done(S, 0);  // items that left each stage
  std::exception_ptr failure;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };

  auto run = [&](size_t s) {
    for (int64_t i = 0; i < n; ++i) {
      const auto t0 = Clock::now();
      {
        std::unique_lock<std::mutex> lock(m);
        cv.wait(lock, [&] {
          if (failure) return true;
          return s == 0 ? i < done[S - 1] + slots : i < done[s - 1];
        });
        if (failure) return;
      }
      const auto t1 = Clock::now();
      try {
        stages[s](i, int(i % slots));
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!failure) failure = std::current_exception();
        cv.notify_all();
        return;
      }
      const auto t2 = Clock::now();
      times[s].wait_ms += ms(t1 - t0);
      times[s].busy_ms += ms(t2 - t1);
      std::lock_guard<std::mutex> lock(m);
      ++done[s];
      cv.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (size_t s = 1; s < S; ++s) threads.emplace_back(run, s);
  run(0);
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  return times;
}

}  // namespace nvfp4moe
