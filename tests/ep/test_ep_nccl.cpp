// Expert parallelism over NCCL symmetric memory: R = 1 in this process (NCCL
// refuses two ranks on one GPU), and R = 2..8 ranks in separate processes on
// a multi-GPU machine, each rank's output against the single-GPU result.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/cuda_check.hpp"
#include "ep/nccl_launcher.hpp"
#include "test_ep_util.hpp"

namespace nvfp4moe::test {
namespace {

constexpr double kTol = 1e-2;

bool nccl_usable() { return gpu_available() && nccl_ep_available() && !ep::rank_env(); }

TEST(EpNccl, SingleRankMatchesEmulationAndSingleGpu) {
  if (!nccl_usable()) GTEST_SKIP() << "needs a CUDA device and a build with NCCL";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed ^ 0xacc);
  const int64_t T = 29, H = cfg.hidden;
  const std::vector<float> x = random_normal(rng, T * H);
  const EpRouting r = random_routing(rng, T, cfg.top_k, 0, cfg.experts, 0.2);

  ep::NcclComm comm = ep::NcclComm::single_rank();
  EpCudaOptions o;
  o.max_tokens_per_rank = 32;
  NcclEpMoe nccl(comm.get(), w, o);
  EXPECT_EQ(nccl.rank(), 0);
  EXPECT_EQ(nccl.ranks(), 1);
  EpCudaEmulation emu(w, 1, o);
  EXPECT_EQ(nccl.symm_bytes(), emu.segment_bytes()) << "one layout for both transports";

  const std::vector<float> y = nccl.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
  nccl.sync_errors();
  EXPECT_EQ(count_non_finite(y), 0);
  EXPECT_LE(rel_l2(y, single_device_forward(w, x, T, r)), kTol);
  const std::vector<float> y_emu = emu.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
  EXPECT_LE(rel_l2(y, y_emu), 1e-5) << "NCCL R=1 differs from the emulation R=1";
  {  // with the row-independent scalar compute both transports give the same bits
    EpCudaOptions ro = o;
    ro.reference_compute = true;
    NcclEpMoe nccl_ref(comm.get(), w, ro);
    EpCudaEmulation emu_ref(w, 1, ro);
    const std::vector<float> a = nccl_ref.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
    const std::vector<float> b = emu_ref.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << "NCCL R=1 and emulation R=1 differ (reference)";
    EXPECT_LE(rel_l2(a, y), kTol) << "reference compute vs grouped GEMM";
  }

  // A second forward on the same buffers (flags, counters reset by staging).
  const EpRouting r2 = random_routing(rng, T, cfg.top_k, 0, cfg.experts, 0.5);
  const std::vector<float> y2 = nccl.forward_host({.x = x, .tokens = T, .topk_ids = r2.ids, .topk_weights = r2.weights}).y;
  nccl.sync_errors();
  EXPECT_LE(rel_l2(y2, single_device_forward(w, x, T, r2)), kTol);
}

TEST(EpNccl, SingleRankReportsCapacityAndBadIds) {
  if (!nccl_usable()) GTEST_SKIP() << "needs a CUDA device and a build with NCCL";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed + 9);
  const int64_t T = 10, H = cfg.hidden, k = cfg.top_k;
  const std::vector<float> x = random_normal(rng, T * H);
  EpRouting r = random_routing(rng, T, k, 0, cfg.experts, 0.0);
  r.ids[3] = 1000;
  ep::NcclComm comm = ep::NcclComm::single_rank();
  NcclEpMoe nccl(comm.get(), w, EpCudaOptions{T, /*recv_capacity=*/7, 0.0f, false, false});
  // The device forward: forward_host would report the errors before returning y.
  const EpDeviceBatch b(x, T, H, r, k);
  nccl.forward(b.x, b.routing, b.out);
  const std::vector<float> y = b.y_values();
  try {
    nccl.sync_errors();
    ADD_FAILURE() << "errors not reported";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("expert parallel rank 0 of 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("expert id outside [-1, E=16)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("receive capacity 7 exceeded"), std::string::npos) << msg;
  }
  EXPECT_EQ(count_non_finite(y), 0);
  EXPECT_NO_THROW(nccl.sync_errors()) << "the error word is cleared once reported";

  // A slice that is neither the full layer nor this rank's experts.
  MoeWeights half = w;
  half.experts = w.experts.slice(0, 8);
  try {
    NcclEpMoe bad(comm.get(), half, EpCudaOptions{});
    ADD_FAILURE() << "wrong slice accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected the full layer or exactly [0, 16)"), std::string::npos)
        << e.what();
  }
}

// A layer of ep_test_config() and one batch of T tokens on the device for it
// (random routing, a fraction `unrouted` of the slots -1).
struct SingleRankBatch {
  MoeConfig cfg = ep_test_config();
  MoeWeights w;
  int64_t T, H = cfg.hidden, k = cfg.top_k;
  std::unique_ptr<EpDeviceBatch> batch;
  SingleRankBatch(uint64_t seed, int64_t tokens, double unrouted) : w(make_synthetic_moe(cfg, seed)), T(tokens) {
    Rng rng(seed + uint64_t(tokens));
    const std::vector<float> x = random_normal(rng, T * H);
    batch = std::make_unique<EpDeviceBatch>(x, T, H, random_routing(rng, T, k, 0, cfg.experts, unrouted), k);
  }
};

// One forward of `nccl` on `batch` captured from `stream` and instantiated
// (RAII: the graph and its executable are destroyed with it).
struct CapturedForward {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  CapturedForward(NcclEpMoe& nccl, const EpDeviceBatch& batch, cudaStream_t stream) {
    NVFP4_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    nccl.forward(batch.x, batch.routing, batch.out, {.stream = stream});
    NVFP4_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    NVFP4_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  }
  ~CapturedForward() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  CapturedForward(const CapturedForward&) = delete;
  CapturedForward& operator=(const CapturedForward&) = delete;
};

TEST(EpNccl, SingleRankReplaysAsGraph) {
  if (!nccl_usable()) GTEST_SKIP() << "needs a CUDA device and a build with NCCL";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const SingleRankBatch c(seed, 13, 0.25);
  const int64_t T = c.T, H = c.H;
  EpDeviceBatch& batch = *c.batch;
  ep::NcclComm comm = ep::NcclComm::single_rank();
  NcclEpMoe nccl(comm.get(), c.w, EpCudaOptions{T, 0, 0.0f, false, false});
  const std::vector<uint16_t> poison(size_t(T * H), kPoisonBf16);
  cuda::CudaStream stream;
  batch.dy.upload(poison.data(), poison.size(), stream.get());
  nccl.forward(batch.x, batch.routing, batch.out, {.stream = stream.get()});
  const std::vector<uint16_t> eager = batch.y_bits(stream.get());
  for (uint16_t b : eager) ASSERT_NE(b, kPoisonBf16) << "output left unwritten";

  batch.dy.upload(poison.data(), poison.size(), stream.get());
  const CapturedForward g(nccl, batch, stream.get());
  for (int rep = 0; rep < 3; ++rep) NVFP4_CUDA_CHECK(cudaGraphLaunch(g.exec, stream.get()));
  const std::vector<uint16_t> replay = batch.y_bits(stream.get());
  EXPECT_EQ(std::memcmp(eager.data(), replay.data(), eager.size() * 2), 0);
  nccl.sync_errors();
}

// Phase timing: the phases of an eager forward add up to its total, the
// shared expert's branch is timed, the output is the untimed forward's bit
// for bit, a captured forward records nothing (and still replays), and
// asking before any timed forward names what is missing.
TEST(EpNccl, SingleRankPhaseTimes) {
  if (!nccl_usable()) GTEST_SKIP() << "needs a CUDA device and a build with NCCL";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const SingleRankBatch c(seed, 11, 0.2);
  ASSERT_GT(c.cfg.shared_experts, 0);
  const int64_t T = c.T, H = c.H;
  EpDeviceBatch& batch = *c.batch;
  ep::NcclComm comm = ep::NcclComm::single_rank();
  NcclEpMoe nccl(comm.get(), c.w, EpCudaOptions{T, 0, 0.0f, false, false});
  cuda::CudaStream stream;
  nccl.forward(batch.x, batch.routing, batch.out, {.stream = stream.get()});
  const std::vector<uint16_t> untimed = batch.y_bits(stream.get());
  expect_error([&] { nccl.phase_times(); }, {"no forward was timed"});

  nccl.set_phase_timing(true);
  expect_error([&] { nccl.phase_times(); }, {"no forward was timed"});
  const std::vector<uint16_t> poison(size_t(T * H), kPoisonBf16);
  batch.dy.upload(poison.data(), poison.size(), stream.get());
  nccl.forward(batch.x, batch.routing, batch.out, {.stream = stream.get()});
  const EpPhaseTimes t = nccl.phase_times();
  EXPECT_EQ(std::memcmp(untimed.data(), batch.y_bits(stream.get()).data(), untimed.size() * 2), 0);
  float sum = 0.0f;
  for (const auto phase : kEpPhases) {
    EXPECT_GE(t.*phase, 0.0f);
    sum += t.*phase;
  }
  EXPECT_GT(t.total, 0.0f);
  EXPECT_GT(t.experts, 0.0f);
  EXPECT_NEAR(sum, t.total, 1e-3f + 1e-3f * t.total) << "the main-stream phases are back to back";
  EXPECT_GT(t.shared_expert, 0.0f);
  EXPECT_LE(t.shared_expert, t.total) << "the branch runs inside the forward";

  // Captured with timing on: no events in the graph; the eager times stay.
  const CapturedForward g(nccl, batch, stream.get());
  batch.dy.upload(poison.data(), poison.size(), stream.get());
  NVFP4_CUDA_CHECK(cudaGraphLaunch(g.exec, stream.get()));
  EXPECT_EQ(std::memcmp(untimed.data(), batch.y_bits(stream.get()).data(), untimed.size() * 2), 0);
  EXPECT_EQ(nccl.phase_times().total, t.total);

  nccl.set_phase_timing(false);
  expect_error([&] { nccl.phase_times(); }, {"no forward was timed"});
  nccl.sync_errors();
}

// One forward of `nccl` on device buffers with the token bound `bound`
// (NcclEpMoe::forward); returns y as floats.
std::vector<float> forward_bounded(NcclEpMoe& nccl, const std::vector<float>& x, int64_t T, int64_t H,
                                   const EpRouting& r, int64_t k, int64_t bound) {
  EpDeviceBatch b(x, T, H, r, k);
  nccl.forward(b.x, b.routing, b.out, {.max_tokens_any_rank = bound});
  return b.y_values();
}

// The token bound of a forward on a layer built for 32 tokens: a 3-token
// batch with bound 3 gives what it gives unbounded, a 20-token batch after
// it is unaffected, and a bound below T or above max_tokens_per_rank is a
// host error naming the values.
TEST(EpNccl, SingleRankTokenBound) {
  if (!nccl_usable()) GTEST_SKIP() << "needs a CUDA device and a build with NCCL";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed + 23);
  const int64_t H = cfg.hidden, k = cfg.top_k;
  ep::NcclComm comm = ep::NcclComm::single_rank();
  NcclEpMoe nccl(comm.get(), w, EpCudaOptions{32, 0, 0.0f, false, false});
  for (const int64_t T : {int64_t(3), int64_t(20)}) {
    SCOPED_TRACE("T=" + std::to_string(T));
    const std::vector<float> x = random_normal(rng, T * H);
    const EpRouting r = random_routing(rng, T, k, 0, cfg.experts, 0.1);
    const std::vector<float> y = forward_bounded(nccl, x, T, H, r, k, T);
    nccl.sync_errors();
    EXPECT_EQ(count_non_finite(y), 0);
    EXPECT_LE(rel_l2(y, single_device_forward(w, x, T, r)), kTol);
    EXPECT_LE(rel_l2(y, forward_bounded(nccl, x, T, H, r, k, 0)), 1e-6) << "bound T vs none";
  }
  const std::vector<float> x = random_normal(rng, 3 * H);
  const EpRouting r = random_routing(rng, 3, k, 0, cfg.experts, 0.1);
  expect_error([&] { forward_bounded(nccl, x, 3, H, r, k, 2); },
               {"rank 0 has T=3 tokens, above max_tokens_any_rank=2"});
  expect_error([&] { forward_bounded(nccl, x, 3, H, r, k, 33); },
               {"max_tokens_any_rank=33 must be in [0, max_tokens_per_rank=32]"});
  expect_error([&] { forward_bounded(nccl, x, 3, H, r, k, -1); }, {"max_tokens_any_rank=-1 must be in"});
  nccl.sync_errors();
}

// ---- R GPUs, one process each ----------------------------------------------------

constexpr const char* kEnvSeed = "NVFP4MOE_EP_TEST_SEED";

// The parent: starts R copies of this binary running only the worker below.
TEST(EpMultiGpu, EveryRankMatchesSingleGpu) {
  if (!nccl_usable()) GTEST_SKIP() << "needs CUDA devices and a build with NCCL";
  int devices = 0;
  NVFP4_CUDA_CHECK(cudaGetDeviceCount(&devices));
  if (devices < 2) GTEST_SKIP() << "needs at least 2 GPUs, found " << devices;
  const int R = devices >= 8 ? 8 : devices >= 4 ? 4 : 2;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R));
  setenv(kEnvSeed, std::to_string(seed).c_str(), 1);
  EXPECT_EQ(ep::launch_ranks(R, {"nvfp4moe_gpu_tests", "--gtest_filter=EpMultiGpuWorker.*"}), 0);
}

// One rank (runs only when launched by the test above): the whole batch is
// generated from the shared seed on every rank; this rank's chunk goes
// through NcclEpMoe and must match the single-GPU layer and the emulation.
TEST(EpMultiGpuWorker, Rank) {
  const std::optional<ep::RankEnv> env = ep::rank_env();
  if (!env) GTEST_SKIP() << "runs only inside launch_ranks";
  const char* s = std::getenv(kEnvSeed);
  const uint64_t seed = s ? std::strtoull(s, nullptr, 10) : 1;
  const int R = env->world, me = env->rank;
  SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R) + " rank=" + std::to_string(me));
  ep::NcclComm comm(*env);
  MoeConfig cfg = ep_test_config();
  cfg.experts = 32;
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  MoeWeights mine = w;  // odd ranks get only their slice, even ranks the full layer
  if (me % 2) mine.experts = w.experts.slice(int64_t(me) * (cfg.experts / R), cfg.experts / R);
  Rng rng(seed ^ 0x3a3a);
  const int64_t T = 8 * R + 3, H = cfg.hidden, k = cfg.top_k;
  const std::vector<float> x = random_normal(rng, T * H);
  const EpRouting routings[2] = {random_routing(rng, T, k, 0, cfg.experts, 0.15),
                                 random_routing(rng, T, k, cfg.experts - cfg.experts / R, cfg.experts, 0.0)};
  NcclEpMoe nccl(comm.get(), mine, EpCudaOptions{16, 0, 0.0f, false, false});
  EpCudaEmulation emu(w, R, EpCudaOptions{16, 0, 0.0f, false, false});
  const int64_t b = ep_token_begin(T, R, me), e = ep_token_begin(T, R, me + 1);
  for (const EpRouting& r : routings) {
    EpRouting chunk;
    chunk.ids.assign(r.ids.begin() + b * k, r.ids.begin() + e * k);
    chunk.weights.assign(r.weights.begin() + b * k, r.weights.begin() + e * k);
    const std::vector<float> xc = rows_of(x, H, b, e);
    const std::vector<float> y = nccl.forward_host({.x = xc, .tokens = e - b, .topk_ids = chunk.ids, .topk_weights = chunk.weights}).y;
    nccl.sync_errors();
    EXPECT_EQ(count_non_finite(y), 0);
    EXPECT_LE(rel_l2(y, single_device_forward(w, xc, e - b, chunk)), kTol);
    const std::vector<float> y_emu = rows_of(emu.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y, H, b, e);
    EXPECT_LE(rel_l2(y, y_emu), 1e-5) << "NCCL rank differs from the emulated rank";
  }
  {  // Ranks passing different token bounds (each its own T: a misuse). A
     // rank counts only a peer's first `its bound` tokens: the excess pairs
     // (a bigger chunk's last token, to a smaller chunk's rank) are dropped
     // and reported on both sides, the rest is exact.
    const EpRouting& r = routings[0];
    std::vector<int64_t> n(static_cast<size_t>(R));
    for (int q = 0; q < R; ++q) n[size_t(q)] = ep_token_begin(T, R, q + 1) - ep_token_begin(T, R, q);
    const int64_t epr = cfg.experts / R;
    EpRouting chunk;
    chunk.ids.assign(r.ids.begin() + b * k, r.ids.begin() + e * k);
    chunk.weights.assign(r.weights.begin() + b * k, r.weights.begin() + e * k);
    EpRouting kept = chunk;  // what arrives: slots whose owner's bound is below the token's index dropped
    bool dropped = false;
    for (int64_t t = 0; t < e - b; ++t)
      for (int64_t j = 0; j < k; ++j) {
        const int32_t id = chunk.ids[size_t(t * k + j)];
        if (id >= 0 && t >= n[size_t(id / epr)]) {
          kept.ids[size_t(t * k + j)] = -1;
          dropped = true;
        }
      }
    const bool excess_seen = n[size_t(me)] < *std::max_element(n.begin(), n.end());
    const std::vector<float> xc = rows_of(x, H, b, e);
    const std::vector<float> y = forward_bounded(nccl, xc, e - b, H, chunk, k, e - b);
    EXPECT_EQ(count_non_finite(y), 0);
    EXPECT_LE(rel_l2(y, single_device_forward(w, xc, e - b, kept)), kTol) << "mismatched bounds";
    if (dropped || excess_seen)
      expect_error([&] { nccl.sync_errors(); }, {"pairs dropped"});
    else
      EXPECT_NO_THROW(nccl.sync_errors());
  }
  {  // A receive-capacity overflow on rank 0: the first half of the batch
     // sends every slot to rank 0's experts (4 T/2 pairs into a capacity of
     // T), the second half one slot each to rank 1's. Rank 0 reports the
     // overflow; nothing is garbage; the second half's tokens are exact.
    const int64_t epr = cfg.experts / R;
    EpRouting over = random_routing(rng, T, k, 0, epr, 0.0);
    const EpRouting to1 = random_routing(rng, T, k, epr, 2 * epr, 0.0);
    for (int64_t t = T / 2; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) over.ids[size_t(t * k + j)] = j == 0 ? to1.ids[size_t(t * k)] : -1;
    NcclEpMoe small(comm.get(), mine, EpCudaOptions{16, /*recv_capacity=*/T, 0.0f, false, false});
    EpRouting chunk;
    chunk.ids.assign(over.ids.begin() + b * k, over.ids.begin() + e * k);
    chunk.weights.assign(over.weights.begin() + b * k, over.weights.begin() + e * k);
    const std::vector<float> xc = rows_of(x, H, b, e);
    const EpDeviceBatch batch(xc, e - b, H, chunk, k);
    small.forward(batch.x, batch.routing, batch.out);
    const std::vector<float> y = batch.y_values();
    if (me == 0) {
      expect_error([&] { small.sync_errors(); }, {"rank 0 of", "receive capacity " + std::to_string(T) + " exceeded"});
    } else {
      try {  // a rank whose tokens lost slots reports them too; which ones depends on arrival order
        small.sync_errors();
      } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("pairs dropped"), std::string::npos) << err.what();
      }
    }
    EXPECT_EQ(count_non_finite(y), 0) << "dropped pairs must contribute nothing, not garbage";
    const int64_t first = std::max(b, T / 2);  // this rank's tokens of the second half
    if (first < e) {
      const std::vector<float> ref = single_device_forward(w, xc, e - b, chunk);
      EXPECT_LE(rel_l2(rows_of(y, H, first - b, e - b), rows_of(ref, H, first - b, e - b)), kTol)
          << "tokens within capacity";
    }
  }
  // BF16 on the way back (collective: every rank builds it).
  NcclEpMoe nccl_bf16(comm.get(), mine, EpCudaOptions{16, 0, 0.0f, false, false, /*combine_bf16=*/true});
  EpRouting chunk;
  chunk.ids.assign(routings[0].ids.begin() + b * k, routings[0].ids.begin() + e * k);
  chunk.weights.assign(routings[0].weights.begin() + b * k, routings[0].weights.begin() + e * k);
  const std::vector<float> xc = rows_of(x, H, b, e);
  const std::vector<float> y = nccl_bf16.forward_host({.x = xc, .tokens = e - b, .topk_ids = chunk.ids, .topk_weights = chunk.weights}).y;
  nccl_bf16.sync_errors();
  EXPECT_LE(rel_l2(y, single_device_forward(w, xc, e - b, chunk)), kTol) << "BF16 combine";
}

}  // namespace
}  // namespace nvfp4moe::test
