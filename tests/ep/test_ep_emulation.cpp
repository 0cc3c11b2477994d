// Expert parallelism on one GPU: R logical ranks (EpCudaEmulation) running the
// same kernels and indexing as the NCCL path, against the single-GPU MoE.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "cuda/cuda_check.hpp"
#include "test_ep_util.hpp"

namespace nvfp4moe::test {
namespace {

constexpr double kTol = 1e-2;  // docs/numerics.md §5: relative L2 against the reference

class EpEmulation : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!gpu_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// Fresh random routing with -1 slots, uneven token split: every R matches the
// single-GPU layer; the scalar reference compute gives bit-identical results
// for every R (position in the receive area never changes a row's value).
TEST_P(EpEmulation, MatchesSingleGpuOnRandomRouting) {
  const int R = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed ^ 0x5eed);
  const int64_t T = 37, H = cfg.hidden;
  const std::vector<float> x = random_normal(rng, T * H);
  const EpRouting r = random_routing(rng, T, cfg.top_k, 0, cfg.experts, 0.15);

  std::string which;
  const std::vector<float> ref = single_device_forward(w, x, T, r, &which);
  SCOPED_TRACE("single-device reference: " + which);

  EpCudaOptions o;
  o.max_tokens_per_rank = T;  // R = 1 holds them all
  EpCudaEmulation ep(w, R, o);
  const std::vector<float> y = ep.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
  ep.sync_errors();
  EXPECT_EQ(count_non_finite(y), 0);
  EXPECT_LE(rel_l2(y, ref), kTol);
  EXPECT_LE(rel_l2(y, cpu_forward(w, x, T, r)), kTol);

  EpCudaOptions ob = o;  // BF16 on the way back: within tolerance too
  ob.combine_bf16 = true;
  EpCudaEmulation ep_bf16(w, R, ob);
  const std::vector<float> y_bf16 = ep_bf16.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
  ep_bf16.sync_errors();
  EXPECT_EQ(count_non_finite(y_bf16), 0);
  EXPECT_LE(rel_l2(y_bf16, ref), kTol) << "BF16 combine";

  o.reference_compute = true;
  EpCudaEmulation ep_ref(w, R, o), ep_ref1(w, 1, o);
  const std::vector<float> y_ref = ep_ref.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
  const std::vector<float> y_ref1 = ep_ref1.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
  EXPECT_LE(rel_l2(y_ref, ref), kTol) << "scalar reference compute";
  EXPECT_EQ(std::memcmp(y_ref.data(), y_ref1.data(), y_ref.size() * 4), 0)
      << "R=" << R << " differs from R=1 with the same (reference) compute";
}

// A layer built for batches far larger than the one it runs: the forward
// works in its batch's token bound (the largest chunk, forward_layout), so
// it gives what a layer built for exactly that batch gives — bit for bit with
// the row-independent compute — and a large batch right after it on the same
// buffers is unaffected by the small forward's bound.
TEST_P(EpEmulation, SmallBatchOnALayerBuiltForLargeOnes) {
  const int R = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed ^ 0xb0d);
  const int64_t T = 2 * R + 1, H = cfg.hidden, k = cfg.top_k;  // chunks of 3 and 2 tokens: bound 3
  const std::vector<float> x = random_normal(rng, T * H);
  const EpRouting r = random_routing(rng, T, k, 0, cfg.experts, 0.1);
  const std::vector<float> ref = single_device_forward(w, x, T, r);
  for (const bool reference : {true, false}) {
    SCOPED_TRACE(reference ? "reference compute" : "grouped GEMM");
    EpCudaEmulation big(w, R, EpCudaOptions{64, 0, 0.0f, false, reference});
    EpCudaEmulation exact(w, R, EpCudaOptions{3, 0, 0.0f, false, reference});
    const std::vector<float> y_big = big.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
    const std::vector<float> y_exact = exact.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
    big.sync_errors();
    exact.sync_errors();
    EXPECT_EQ(count_non_finite(y_big), 0);
    EXPECT_LE(rel_l2(y_big, ref), kTol);
    if (reference)
      EXPECT_EQ(std::memcmp(y_big.data(), y_exact.data(), y_big.size() * 4), 0) << "layer built for 64 vs for 3 tokens";
    else
      EXPECT_LE(rel_l2(y_big, y_exact), 1e-6) << "layer built for 64 vs for 3 tokens";

    const int64_t T2 = 60 * R + 3;  // then a large batch (61 and 60 tokens per rank) on the same buffers
    const std::vector<float> x2 = random_normal(rng, T2 * H);
    const EpRouting r2 = random_routing(rng, T2, k, 0, cfg.experts, 0.1);
    const std::vector<float> y2 = big.forward_host({.x = x2, .tokens = T2, .topk_ids = r2.ids, .topk_weights = r2.weights}).y;
    big.sync_errors();
    EXPECT_LE(rel_l2(y2, single_device_forward(w, x2, T2, r2)), kTol) << "large batch after a small one";
  }
}

// All tokens routed to the experts of one rank (the last): one rank receives
// every pair, the others none.
TEST_P(EpEmulation, SkewedRoutingToOneRank) {
  const int R = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R));
  MoeConfig cfg = ep_test_config();
  cfg.experts = 32;  // E/R >= k for R = 8
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed + 1);
  const int64_t T = 24, H = cfg.hidden, epr = cfg.experts / R;
  const std::vector<float> x = random_normal(rng, T * H);
  const EpRouting r = random_routing(rng, T, cfg.top_k, cfg.experts - epr, cfg.experts, 0.1);
  EpCudaEmulation ep(w, R, EpCudaOptions{T, 0, 0.0f, false, false});
  const std::vector<float> y = ep.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
  ep.sync_errors();
  EXPECT_EQ(count_non_finite(y), 0);
  EXPECT_LE(rel_l2(y, single_device_forward(w, x, T, r)), kTol);
}

// A receive capacity too small for rank 0's pairs: reported through the error
// word, the dropped slots contribute nothing, the tokens that only use other
// ranks' experts are exact, nothing is NaN, and the next forward is clean.
TEST_P(EpEmulation, CapacityOverflowIsReportedNotCorrupting) {
  const int R = GetParam();
  if (R < 2) GTEST_SKIP() << "needs a second rank whose tokens stay within capacity";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R));
  MoeConfig cfg = ep_test_config();
  cfg.experts = 32;
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed + 2);
  const int64_t T = 16, H = cfg.hidden, k = cfg.top_k, epr = cfg.experts / R;
  const std::vector<float> x = random_normal(rng, T * H);
  // First half: every slot to rank 0 (8 * k = 32 pairs > capacity 12).
  // Second half: every slot to rank 1 (32 pairs > 12 too) -> use k = 1 slot there.
  EpRouting r = random_routing(rng, T, k, 0, epr, 0.0);
  const EpRouting r1 = random_routing(rng, T, k, epr, 2 * epr, 0.0);
  for (int64_t t = T / 2; t < T; ++t)
    for (int64_t j = 0; j < k; ++j) r.ids[size_t(t * k + j)] = j == 0 ? r1.ids[size_t(t * k)] : -1;
  const int64_t capacity = 12;  // rank 1 receives T/2 = 8 pairs: fits
  EpCudaEmulation ep(w, R, EpCudaOptions{T, capacity, 0.0f, false, false});
  // The device forward: forward_host would report the error before returning y.
  const EpDeviceBatch b(x, T, H, r, k);
  ep.forward(b.x, b.routing, b.out);
  const std::vector<float> y = b.y_values();
  try {
    ep.sync_errors();
    ADD_FAILURE() << "capacity overflow was not reported";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("receive capacity 12 exceeded"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  }
  EXPECT_EQ(count_non_finite(y), 0) << "dropped pairs must contribute nothing, not garbage";
  const std::vector<float> ref = single_device_forward(w, x, T, r);
  EXPECT_LE(rel_l2(rows_of(y, H, T / 2, T), rows_of(ref, H, T / 2, T)), kTol) << "tokens within capacity";

  // Within capacity again: clean and correct (the error word was cleared).
  EpRouting ok = r;
  for (int64_t t = 0; t < T / 2; ++t)
    for (int64_t j = 1; j < k; ++j) ok.ids[size_t(t * k + j)] = -1;  // rank 0 now gets 8 pairs
  const std::vector<float> y2 = ep.forward_host({.x = x, .tokens = T, .topk_ids = ok.ids, .topk_weights = ok.weights}).y;
  EXPECT_NO_THROW(ep.sync_errors());
  EXPECT_LE(rel_l2(y2, single_device_forward(w, x, T, ok)), kTol);
}

// An id outside [-1, E) is skipped (no access through it) and reported; the
// rest of that token and the other tokens are unaffected.
TEST_P(EpEmulation, OutOfRangeExpertIdIsReported) {
  const int R = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed + 3);
  const int64_t T = 9, H = cfg.hidden, k = cfg.top_k;
  const std::vector<float> x = random_normal(rng, T * H);
  EpRouting r = random_routing(rng, T, k, 0, cfg.experts, 0.0);
  EpRouting as_none = r;
  r.ids[1] = int32_t(cfg.experts + 3);
  r.ids[size_t(5 * k + 2)] = -7;
  as_none.ids[1] = -1;
  as_none.ids[size_t(5 * k + 2)] = -1;
  EpCudaEmulation ep(w, R, EpCudaOptions{T, 0, 0.0f, false, false});
  // The device forward: forward_host would report the error before returning y.
  const EpDeviceBatch b(x, T, H, r, k);
  ep.forward(b.x, b.routing, b.out);
  const std::vector<float> y = b.y_values();
  try {
    ep.sync_errors();
    ADD_FAILURE() << "out-of-range expert id was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert id outside [-1, E=16)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(count_non_finite(y), 0);
  EXPECT_LE(rel_l2(y, single_device_forward(w, x, T, as_none)), kTol);
}

// NaN in one token's activations: only that token's output is NaN.
TEST_P(EpEmulation, NanStaysInItsToken) {
  const int R = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed + 4);
  const int64_t T = 12, H = cfg.hidden, bad = 5;
  std::vector<float> x = random_normal(rng, T * H);
  x[size_t(bad * H + 17)] = NAN;
  const EpRouting r = random_routing(rng, T, cfg.top_k, 0, cfg.experts, 0.0);
  EpCudaEmulation ep(w, R, EpCudaOptions{T, 0, 0.0f, false, false});
  const std::vector<float> y = ep.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t nan = count_non_finite(rows_of(y, H, t, t + 1));
    if (t == bad)
      EXPECT_GT(nan, 0) << "token " << t;
    else
      EXPECT_EQ(nan, 0) << "token " << t;
  }
  std::vector<float> clean = x;
  clean[size_t(bad * H + 17)] = 0.0f;
  const std::vector<float> ref = single_device_forward(w, clean, T, r);
  EXPECT_LE(rel_l2(rows_of(y, H, 0, bad), rows_of(ref, H, 0, bad)), kTol);
  EXPECT_LE(rel_l2(rows_of(y, H, bad + 1, T), rows_of(ref, H, bad + 1, T)), kTol);
}

// Outputs poisoned before the run are all written; a CUDA graph of the
// forward replays to the same bytes, and so does an output that is not
// 8-byte aligned.
TEST_P(EpEmulation, WritesEveryOutputAndReplaysAsGraph) {
  const int R = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R));
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, seed);
  Rng rng(seed + 5);
  const int64_t T = 21, H = cfg.hidden, k = cfg.top_k;
  const std::vector<float> x = random_normal(rng, T * H);
  const EpRouting r = random_routing(rng, T, k, 0, cfg.experts, 0.3);
  EpCudaEmulation ep(w, R, EpCudaOptions{T, 0, 0.0f, false, false});

  EpDeviceBatch batch(x, T, H, r, k);
  const std::vector<uint16_t> poison(size_t(T * H), kPoisonBf16);
  batch.dy.upload(poison.data(), poison.size());
  const TensorView& xv = batch.x;
  const RoutingArgs& ra = batch.routing;

  cuda::CudaStream stream;
  ep.forward(xv, ra, batch.out, {.stream = stream.get()});
  const std::vector<uint16_t> eager = batch.y_bits(stream.get());
  int64_t poisoned = 0;
  for (uint16_t b : eager) poisoned += b == kPoisonBf16;
  EXPECT_EQ(poisoned, 0) << "outputs left unwritten";

  batch.dy.upload(poison.data(), poison.size(), stream.get());
  cudaGraph_t graph = nullptr;
  NVFP4_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
  ep.forward(xv, ra, batch.out, {.stream = stream.get()});
  NVFP4_CUDA_CHECK(cudaStreamEndCapture(stream.get(), &graph));
  // Rank 0's shared expert is a branch of its own beside its staging (the
  // graph's other root): it waits for nothing of the routed path.
  ASSERT_GT(cfg.shared_experts, 0);
  size_t roots = 0;
  NVFP4_CUDA_CHECK(cudaGraphGetRootNodes(graph, nullptr, &roots));
  EXPECT_EQ(roots, 2u) << "captured forward: expected rank 0's staging and its shared expert as the two roots";
  cudaGraphExec_t exec = nullptr;
  NVFP4_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 2; ++rep) NVFP4_CUDA_CHECK(cudaGraphLaunch(exec, stream.get()));
  const std::vector<uint16_t> replay = batch.y_bits(stream.get());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  EXPECT_EQ(std::memcmp(eager.data(), replay.data(), eager.size() * 2), 0) << "graph replay differs from eager";

  // An output one BF16 past an 8-byte boundary: the combine's one-value-per-
  // thread path (vector stores would fault there), the same bytes.
  cuda::DeviceBuffer<uint16_t> dy_odd(size_t(T * H) + 1);
  std::vector<uint16_t> odd(size_t(T * H) + 1, kPoisonBf16);
  dy_odd.upload(odd.data(), odd.size());
  ForwardOutputs out_odd;
  out_odd.y = make_view(dy_odd.get() + 1, DType::BF16, {T, H}, DeviceKind::Cuda);
  ep.forward(xv, ra, out_odd, {.stream = stream.get()});
  dy_odd.download(odd.data(), odd.size(), stream.get());
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  EXPECT_EQ(std::memcmp(eager.data(), odd.data() + 1, eager.size() * 2), 0) << "unaligned output differs from eager";
  ep.sync_errors();
}

// No caller routing: each rank runs the router on its own tokens (the CUDA
// backend's router); selection equals the single-GPU layer's, and so does y.
// Hash-routed layers look their ids up by token id on the token's rank.
TEST_P(EpEmulation, RouterRunsOnEachTokensRank) {
  const int R = GetParam();
  for (const bool hash : {false, true}) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed=" + std::to_string(seed) + " R=" + std::to_string(R) + (hash ? " hash" : " scored"));
    MoeConfig cfg = ep_test_config();
    cfg.hash_routed = hash;
    const MoeWeights w = make_synthetic_moe(cfg, seed);
    Rng rng(seed + 6);
    const int64_t T = 19, H = cfg.hidden, k = cfg.top_k;
    const std::vector<float> x = random_normal(rng, T * H);
    std::vector<int32_t> tid(static_cast<size_t>(T));
    for (auto& t : tid) t = int32_t(rng.below(std::max<int64_t>(1, w.router.vocab)));

    std::unique_ptr<Moe> single;
    try {
      MoeOptions mo;
      mo.backend = Backend::Cuda;
      mo.max_tokens = T;
      single = std::make_unique<Moe>(w, mo);
    } catch (const Error&) {
      single = std::make_unique<Moe>(w, MoeOptions{});
    }
    HostBatch batch{.x = x, .tokens = T};
    if (hash) batch.token_ids = tid;
    const HostResult one = single->forward_host(batch);
    const std::vector<float>& ref = one.y;
    const std::vector<int32_t>& ref_ids = one.topk_ids;
    const std::vector<float>& ref_w = one.topk_weights;

    EpCudaEmulation ep(w, R, EpCudaOptions{T, 0, 0.0f, false, false});
    cuda::DeviceBuffer<float> dx(size_t(T * H)), dw(size_t(T * k));
    cuda::DeviceBuffer<int32_t> di(size_t(T * k)), dt(static_cast<size_t>(T));
    cuda::DeviceBuffer<uint16_t> dy(size_t(T * H));
    dx.upload(x.data(), x.size());
    dt.upload(tid.data(), tid.size());
    RoutingArgs ra;  // no topk: the router
    if (hash) ra.token_ids = make_view(dt.get(), DType::I32, {T}, DeviceKind::Cuda);
    ForwardOutputs out;
    out.y = make_view(dy.get(), DType::BF16, {T, H}, DeviceKind::Cuda);
    out.topk_ids = make_view(di.get(), DType::I32, {T, k}, DeviceKind::Cuda);
    out.topk_weights = make_view(dw.get(), DType::F32, {T, k}, DeviceKind::Cuda);
    ep.forward(make_view(dx.get(), DType::F32, {T, H}, DeviceKind::Cuda), ra, out);
    std::vector<int32_t> ids(size_t(T * k));
    std::vector<float> wts(size_t(T * k));
    std::vector<uint16_t> yb(size_t(T * H));
    di.download(ids.data(), ids.size());
    dw.download(wts.data(), wts.size());
    dy.download(yb.data(), yb.size());
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
    ep.sync_errors();
    EXPECT_EQ(ids, ref_ids) << "expert selection differs from the single-GPU router";
    EXPECT_LE(rel_l2(wts, ref_w), 1e-6);
    std::vector<float> y(yb.size());
    for (size_t i = 0; i < yb.size(); ++i) y[i] = bf16_to_float(Bf16{yb[i]});
    EXPECT_EQ(count_non_finite(y), 0);
    EXPECT_LE(rel_l2(y, ref), kTol);

    if (hash) {  // without token ids a hash layer cannot route: a host error, named
      try {
        ep.forward(make_view(dx.get(), DType::F32, {T, H}, DeviceKind::Cuda), RoutingArgs{}, out);
        ADD_FAILURE() << "hash-routed forward without token_ids accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("hash-routed: token_ids [T] is required"), std::string::npos)
            << e.what();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, EpEmulation, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return "R" + std::to_string(i.param); });

// Host-side checks (docs/numerics.md §6): named arguments and values, before any work.
TEST(EpEmulationErrors, BadInputsAreNamed) {
  if (!gpu_available()) GTEST_SKIP() << "no CUDA device";
  const MoeConfig cfg = ep_test_config();
  const MoeWeights w = make_synthetic_moe(cfg, 7);
  try {
    EpCudaEmulation bad(w, 3);
    ADD_FAILURE() << "E=16 over R=3 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("E=16 not divisible by ranks R=3"), std::string::npos) << e.what();
  }
  EpCudaEmulation ep(w, 2, EpCudaOptions{4, 0, 0.0f, false, false});
  const int64_t H = cfg.hidden, k = cfg.top_k;
  auto forward = [&](int64_t T, const std::vector<int32_t>& ids) {
    return [&ep, T, H, ids] {
      ep.forward_host({.x = std::vector<float>(size_t(T * H), 0.5f), .tokens = T, .topk_ids = ids, .topk_weights = std::vector<float>(ids.size(), 1.0f)});
    };
  };
  expect_error(forward(9, std::vector<int32_t>(size_t(9 * k), 0)), {"T=9 tokens exceed the capacity of 8 tokens"});
  expect_error(forward(2, std::vector<int32_t>(size_t(2 * k + 1), 0)),
               {"topk_ids/topk_weights have 9/9 values, expected T*k = 8"});
}

}  // namespace
}  // namespace nvfp4moe::test
