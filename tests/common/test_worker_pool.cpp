// WorkerPool: every worker index runs once per job on distinct threads, the
// pool is reusable, exceptions reach the caller, and a nested or concurrent
// run() executes its workers inline instead of deadlocking.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/worker_pool.hpp"
#include "cpu/work_queue.hpp"

namespace nvfp4moe::test {
namespace {

TEST(WorkerPool, RunsEachWorkerOnceOnItsOwnThreadAndIsReusable) {
  WorkerPool pool(3);
  ASSERT_EQ(pool.size(), 3);
  for (int job = 0; job < 200; ++job) {
    std::vector<std::thread::id> ids(3);
    std::atomic<int> calls{0};
    const int n = 1 + job % 3;
    pool.run(n, [&](int w) {
      ids[size_t(w)] = std::this_thread::get_id();
      ++calls;
    });
    ASSERT_EQ(calls.load(), n) << "job " << job;
    ASSERT_EQ(ids[0], std::this_thread::get_id()) << "worker 0 is the caller";
    std::set<std::thread::id> distinct(ids.begin(), ids.begin() + n);
    ASSERT_EQ(int(distinct.size()), n) << "job " << job;
  }
}

TEST(WorkerPool, RunItemsCoversEveryItemOnceAndRethrows) {
  WorkerPool pool(2);
  std::vector<std::atomic<int>> hits(1000);
  cpu::run_items(1000, pool, [&](int64_t i, int w) {
    ASSERT_LT(w, 2);
    ++hits[size_t(i)];
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << "item " << i;
  EXPECT_THROW(cpu::run_items(100, pool,
                              [&](int64_t i, int) {
                                if (i == 57) throw std::runtime_error("item 57");
                              }),
               std::runtime_error);
  // Still usable after a failure.
  std::atomic<int64_t> sum{0};
  cpu::run_items(100, pool, [&](int64_t i, int) { sum += i; });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(WorkerPool, NestedRunExecutesInline) {
  WorkerPool pool(2);
  std::atomic<int> inner{0};
  pool.run(2, [&](int) { pool.run(2, [&](int) { ++inner; }); });
  EXPECT_EQ(inner.load(), 4);
  std::atomic<int64_t> sum{0};
  parallel_for(pool, 10000, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 10000LL * 9999 / 2);
}

}  // namespace
}  // namespace nvfp4moe::test
