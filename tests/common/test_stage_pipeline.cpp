// run_stages: each stage takes the items in order, an item passes the
// stages in order, at most `slots` items are in flight (their slots
// distinct), the stages overlap in time, and a failure stops the chain and
// reaches the caller.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/stage_pipeline.hpp"

namespace nvfp4moe::test {
namespace {

struct Event {
  int stage;
  int64_t item;
  int slot;
  bool begin;
};

// Runs n items through `stages_n` stages that log their begin and end.
std::vector<Event> logged_run(int64_t n, int slots, int stages_n, std::chrono::microseconds work) {
  std::mutex m;
  std::vector<Event> log;
  std::vector<Stage> stages;
  for (int s = 0; s < stages_n; ++s)
    stages.push_back([&, s](int64_t i, int slot) {
      {
        std::lock_guard<std::mutex> lock(m);
        log.push_back({s, i, slot, true});
      }
      std::this_thread::sleep_for(work);
      std::lock_guard<std::mutex> lock(m);
      log.push_back({s, i, slot, false});
    });
  const std::vector<StageTimes> t = run_stages(n, slots, stages);
  EXPECT_EQ(t.size(), size_t(stages_n));
  return log;
}

TEST(StagePipeline, ItemsPassEveryStageInOrderWithinTheirSlots) {
  for (int slots : {1, 2, 3, 4}) {
    const int64_t n = 23;
    const int S = 3;
    const std::vector<Event> log = logged_run(n, slots, S, std::chrono::microseconds(200));
    ASSERT_EQ(log.size(), size_t(n * S * 2)) << "slots " << slots;
    // Position of each event in the log.
    auto at = [&](int s, int64_t i, bool begin) {
      for (size_t k = 0; k < log.size(); ++k)
        if (log[k].stage == s && log[k].item == i && log[k].begin == begin) return int64_t(k);
      return int64_t(-1);
    };
    std::vector<int64_t> last_item(S, -1);
    for (const Event& e : log) {
      EXPECT_EQ(e.slot, int(e.item % slots)) << "slots " << slots << " stage " << e.stage << " item " << e.item;
      if (!e.begin) continue;
      EXPECT_EQ(e.item, last_item[size_t(e.stage)] + 1) << "slots " << slots << " stage " << e.stage;
      last_item[size_t(e.stage)] = e.item;
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int s = 1; s < S; ++s)
        EXPECT_GT(at(s, i, true), at(s - 1, i, false)) << "slots " << slots << " item " << i << " stage " << s;
      // Slot i % slots is free: item i - slots has left the last stage.
      if (i >= slots) {
        EXPECT_GT(at(0, i, true), at(S - 1, i - slots, false)) << "slots " << slots << " item " << i;
      }
    }
  }
}

TEST(StagePipeline, StagesOverlapInTime) {
  // Three stages of 2 ms over 20 items: about 44 ms when they overlap, 120 ms
  // one after another.
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Event> log = logged_run(20, 3, 3, std::chrono::milliseconds(2));
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms, 100.0) << "20 items, 3 stages of 2 ms";
  // Some stage began an item while another stage had one open.
  int open = 0, most = 0;
  for (const Event& e : log) {
    open += e.begin ? 1 : -1;
    most = std::max(most, open);
  }
  EXPECT_GE(most, 2);
}

TEST(StagePipeline, AFailureStopsTheChainAndReachesTheCaller) {
  std::atomic<int64_t> first_stage_items{0}, middle_last_item{-1}, last_stage_last_item{-1};
  const std::vector<Stage> stages = {
      [&](int64_t, int) { ++first_stage_items; },
      [&](int64_t i, int) {
        middle_last_item = i;
        if (i == 5) throw std::runtime_error("item 5 failed");
      },
      [&](int64_t i, int) { last_stage_last_item = i; }};
  try {
    run_stages(100, 2, stages);
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "item 5 failed");
  }
  EXPECT_EQ(middle_last_item.load(), 5) << "the failing stage takes no further item";
  EXPECT_LT(last_stage_last_item.load(), 5) << "the failed item goes no further";
  EXPECT_LE(first_stage_items.load(), 5 + 2) << "stage 0 stays within the slots of the last finished item";
}

TEST(StagePipeline, NoItemsRunsNothingAndReportsEveryStage) {
  int calls = 0;
  const std::vector<StageTimes> t = run_stages(0, 3, {[&](int64_t, int) { ++calls; }, [&](int64_t, int) { ++calls; }});
  EXPECT_EQ(calls, 0);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].busy_ms, 0.0);
}

TEST(StagePipeline, WritesOfAStageAreSeenByTheLaterStagesOfTheItem) {
  const int64_t n = 1000;
  std::vector<int64_t> a(n, -1), b(n, -1);
  std::atomic<int64_t> wrong{0};
  run_stages(n, 3,
             {[&](int64_t i, int) { a[size_t(i)] = i * 3; },
              [&](int64_t i, int) { b[size_t(i)] = a[size_t(i)] + 1; },
              [&](int64_t i, int) {
                if (b[size_t(i)] != i * 3 + 1) ++wrong;
              }});
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace nvfp4moe::test
