// The cuda backend end to end against the CPU backend through the same
// nvfp4moe::Moe API: router selection identical, outputs within docs/numerics.md §8's
// tolerance (rel L2 <= 1e-2) on a random token subset, every output written,
// caller routing with -1 slots, bad ids reported without a crash, capacity,
// NaN isolation, CUDA-graph replay.
#include "cuda_moe_harness.hpp"
#include "support/shared_fp8_util.hpp"

namespace nvfp4moe {
namespace {

using namespace nvfp4moe::test;

MoeConfig odd_config() {
  MoeConfig c;
  c.hidden = 208;
  c.intermediate = 144;
  c.experts = 10;
  c.top_k = 3;
  c.shared_experts = 0;
  c.routed_scaling_factor = 2.5f;
  return c;
}

TEST(CudaMoe, SmallGeometriesRouterMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  MoeConfig k1 = small_demo_config();
  k1.experts = 4;
  k1.top_k = 1;
  k1.scoring = Scoring::Sigmoid;
  for (MoeConfig cfg : {small_demo_config(), odd_config(), k1}) {
    MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
    Moe gpu = gpu_moe(w, 300);
    Moe cpu = cpu_twin(w);
    for (int64_t T : {1, 7, 64, 300}) check_against_cpu(gpu, cpu, w, T, rng.next());
  }
}

TEST(CudaMoe, Bf16InputAndInt64Ids) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const MoeConfig cfg = small_demo_config();
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
  Moe gpu = gpu_moe(w, 64);
  Moe cpu = cpu_twin(w);
  check_against_cpu(gpu, cpu, w, 33, rng.next(), nullptr, nullptr, /*x_bf16=*/true);
  std::vector<int32_t> ids;
  std::vector<float> wt;
  ep_routing(rng, 40, cfg.top_k, cfg.experts, 0, cfg.experts, ids, wt);
  check_against_cpu(gpu, cpu, w, 40, rng.next(), &ids, &wt, false, /*ids64=*/true);
}

TEST(CudaMoe, StaticInputScales) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  MoeConfig cfg = small_demo_config();
  cfg.l1_input = InputScaleMode::Static;
  cfg.l2_input = InputScaleMode::Static;
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
  Moe gpu = gpu_moe(w, 128);
  Moe cpu = cpu_twin(w);
  check_against_cpu(gpu, cpu, w, 128, rng.next());
}

TEST(CudaMoe, HashRoutingMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  MoeConfig cfg = small_demo_config();
  cfg.hash_routed = true;
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next(), 0, 0, 512);
  Moe gpu = gpu_moe(w, 64);
  Moe cpu = cpu_twin(w);
  const int64_t T = 50, H = cfg.hidden;
  std::vector<float> x = random_normal(rng, T * H);
  std::vector<int32_t> tok(static_cast<size_t>(T));
  for (auto& t : tok) t = int32_t(rng.below(512));
  GpuOutput g = gpu_forward(gpu, x, T, nullptr, nullptr, &tok);
  const HostResult c = cpu.forward_host({.x = x, .tokens = T, .token_ids = tok});
  EXPECT_EQ(g.ids, c.topk_ids);
  EXPECT_LE(rel_l2(g.y, c.y), kTol);
  // A token id outside [0, vocab) is reported, not a crash.
  tok[3] = 100000;
  gpu_forward(gpu, x, T, nullptr, nullptr, &tok);
  try {
    gpu.sync_errors();
    FAIL() << "bad token id not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("100000"), std::string::npos) << e.what();
  }
}

// A block-scaled FP8 shared expert (DeepSeek-V4's format: E8M0 tile scales,
// powers of two, or arbitrary F32 weight_scale_inv factors) runs on its FP8
// bytes: within the tolerance of the CPU backend's FP8 path, through the
// GEMV-width and the 64-token tiles alike; with power-of-two scales it is
// the same layer as its BF16 twin, up to the summation order (the outputs
// differ by BF16 rounding steps, far inside the tolerance).
TEST(CudaMoe, Fp8BlockScaledSharedExpert) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const MoeConfig cfg = small_demo_config();
  for (const TileScales kind : {TileScales::PowersOfTwo, TileScales::Arbitrary}) {
    MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
    w.shared = random_fp8_shared(rng, cfg.hidden, cfg.shared_inter(), kind);
    Moe gpu = gpu_moe(w, 100);
    Moe cpu = cpu_twin(w);
    for (int64_t T : {3, 100}) check_against_cpu(gpu, cpu, w, T, rng.next());
    if (kind != TileScales::PowersOfTwo) continue;
    MoeWeights w16 = w;
    w16.shared = bf16_twin(w.shared, cfg.hidden, cfg.shared_inter());
    Moe gpu16 = gpu_moe(w16, 100);
    const std::vector<float> x = random_normal(rng, 17 * cfg.hidden);
    const std::vector<float> y8 = gpu.forward_host({.x = x, .tokens = 17}).y;
    const std::vector<float> y16 = gpu16.forward_host({.x = x, .tokens = 17}).y;
    EXPECT_LT(rel_l2(y8, y16), 2e-3);
  }
}

TEST(CudaMoe, CallerRoutingWithMinusOneSlots) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  MoeConfig cfg = small_demo_config();
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
  Moe gpu = gpu_moe(w, 100);
  Moe cpu = cpu_twin(w);
  std::vector<int32_t> ids;
  std::vector<float> wt;
  ep_routing(rng, 100, cfg.top_k, cfg.experts, 0, cfg.experts, ids, wt);
  for (int64_t j = 0; j < cfg.top_k; ++j) ids[size_t(5 * cfg.top_k + j)] = -1;  // token 5: shared expert only
  for (size_t i = 0; i < ids.size(); i += 7) ids[i] = -1;
  check_against_cpu(gpu, cpu, w, 100, rng.next(), &ids, &wt);
}

// DeepSeek-V4-Pro geometry, one EP8 rank: 48 local experts of 384, the pairs
// the rank receives from 8T tokens (non-local slots -1, tokens with none dropped).
TEST(CudaMoe, DeepSeekV4ProEp8Rank) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const MoeConfig cfg = dsv4_pro_config();
  const int64_t rank = rng.below(8), first = rank * 48;
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next(), first, 48);
  Moe gpu = gpu_moe(w, 4096);
  Moe cpu = cpu_twin(w);
  for (int64_t T : {1, 64, 512}) {
    std::vector<int32_t> ids, kept;
    std::vector<float> wt, kept_w;
    ep_routing(rng, 8 * T, cfg.top_k, cfg.experts, first, 48, ids, wt);
    for (int64_t t = 0; t < 8 * T; ++t) {
      bool any = false;
      for (int64_t j = 0; j < cfg.top_k; ++j) any |= ids[size_t(t * cfg.top_k + j)] >= 0;
      if (!any && !(t == 0 && kept.empty() && 8 * T == 8)) continue;
      kept.insert(kept.end(), ids.begin() + t * cfg.top_k, ids.begin() + (t + 1) * cfg.top_k);
      kept_w.insert(kept_w.end(), wt.begin() + t * cfg.top_k, wt.begin() + (t + 1) * cfg.top_k);
    }
    const int64_t Tin = int64_t(kept.size()) / cfg.top_k;
    if (Tin == 0) continue;
    check_against_cpu(gpu, cpu, w, Tin, rng.next(), &kept, &kept_w);
  }
}

// DeepSeek-V4-Pro geometry, all 384 experts on one GPU, the router on.
TEST(CudaMoe, DeepSeekV4ProEp1Router) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  const MoeConfig cfg = dsv4_pro_config();
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
  Moe gpu = gpu_moe(w, 4096);
  Moe cpu = cpu_twin(w);
  w = MoeWeights{};  // 14 GB less on the host
  MoeWeights meta;
  meta.config = cfg;
  meta.experts.count = cfg.experts;
  for (int64_t T : {1, 4096}) check_against_cpu(gpu, cpu, meta, T, rng.next());
}

TEST(CudaMoe, OutOfRangeExpertIdIsReportedOthersIntact) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const MoeConfig cfg = small_demo_config();
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
  Moe gpu = gpu_moe(w, 64);
  const int64_t T = 20, H = cfg.hidden, k = cfg.top_k;
  std::vector<float> x = random_normal(rng, T * H);
  std::vector<int32_t> ids;
  std::vector<float> wt;
  ep_routing(rng, T, k, cfg.experts, 0, cfg.experts, ids, wt);
  std::vector<int32_t> good = ids;
  good[size_t(4 * k + 2)] = -1;
  good[size_t(9 * k + 0)] = -1;
  GpuOutput ref = gpu_forward(gpu, x, T, &good, &wt);
  gpu.sync_errors();  // nothing recorded
  std::vector<int32_t> bad = ids;
  bad[size_t(4 * k + 2)] = 999;
  bad[size_t(9 * k + 0)] = -5;
  GpuOutput got = gpu_forward(gpu, x, T, &bad, &wt);
  try {
    gpu.sync_errors();
    FAIL() << "out-of-range expert id not reported";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("expert id"), std::string::npos) << m;
    EXPECT_TRUE(m.find("999") != std::string::npos || m.find("-5") != std::string::npos) << m;
  }
  EXPECT_NO_THROW(gpu.sync_errors()) << "the error word must be cleared once reported";
  // Bad slots contribute nothing: identical to the -1 run, bit for bit.
  EXPECT_EQ(std::memcmp(got.y.data(), ref.y.data(), got.y.size() * 4), 0);
  // checked mode reports at once.
  Moe checked = gpu_moe(w, 64, /*checked=*/true);
  EXPECT_THROW(gpu_forward(checked, x, T, &bad, &wt), Error);
  // forward_host is synchronising: it reports too.
  EXPECT_THROW(gpu.forward_host({.x = x, .tokens = T, .topk_ids = bad, .topk_weights = wt}).y, Error);
}

TEST(CudaMoe, TokensAboveCapacityAndBadTensorsAreHostErrors) {
  SKIP_WITHOUT_GPU();
  const MoeConfig cfg = small_demo_config();
  MoeWeights w = make_random_nvfp4_moe(cfg, 1);
  Moe gpu = gpu_moe(w, 16);
  std::vector<float> x(size_t(17 * cfg.hidden), 0.5f);
  try {
    gpu.forward_host({.x = x, .tokens = 17}).y;
    FAIL() << "T above capacity accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("T=17"), std::string::npos) << m;
    EXPECT_NE(m.find("max_tokens=16"), std::string::npos) << m;
  }
  // Host tensors handed to a cuda forward, and a wrong width.
  TensorView hx = make_view(x.data(), DType::F32, {17, cfg.hidden});
  std::vector<uint16_t> y(size_t(17 * cfg.hidden));
  ForwardOutputs o;
  o.y = make_view(y.data(), DType::BF16, {17, cfg.hidden});
  try {
    gpu.forward(make_view(x.data(), DType::F32, {2, cfg.hidden}), {}, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x: on cpu"), std::string::npos) << e.what();
  }
  cuda::DeviceBuffer<float> dx(size_t(2 * cfg.hidden));
  try {
    gpu.forward(make_view(dx.get(), DType::F32, {2, cfg.hidden / 2}, DeviceKind::Cuda), {}, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x: shape"), std::string::npos) << e.what();
  }
  (void)hx;
}

TEST(CudaMoe, NanTokenOnlyAffectsItself) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const MoeConfig cfg = small_demo_config();
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
  Moe gpu = gpu_moe(w, 32);
  const int64_t T = 12, H = cfg.hidden, k = cfg.top_k;
  std::vector<float> x = random_normal(rng, T * H);
  std::vector<int32_t> ids;
  std::vector<float> wt;
  ep_routing(rng, T, k, cfg.experts, 0, cfg.experts, ids, wt);
  GpuOutput clean = gpu_forward(gpu, x, T, &ids, &wt);
  x[size_t(3 * H + 17)] = NAN;
  GpuOutput dirty = gpu_forward(gpu, x, T, &ids, &wt);
  for (int64_t t = 0; t < T; ++t) {
    bool any_nan = false;
    for (int64_t h = 0; h < H; ++h) any_nan |= std::isnan(dirty.y[size_t(t * H + h)]);
    if (t == 3) {
      EXPECT_TRUE(any_nan) << "the NaN token's output must be NaN";
    } else {
      EXPECT_EQ(std::memcmp(&dirty.y[size_t(t * H)], &clean.y[size_t(t * H)], size_t(H) * 4), 0) << "token " << t;
    }
  }
}

TEST(CudaMoe, GraphCaptureReplaysIdentically) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const MoeConfig cfg = small_demo_config();
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
  Moe gpu = gpu_moe(w, 64);
  const int64_t T = 64, H = cfg.hidden;
  std::vector<float> x = random_normal(rng, T * H);
  cuda::DeviceBuffer<float> dx(x.size());
  cuda::DeviceBuffer<uint16_t> dy(size_t(T * H));
  dx.upload(x.data(), x.size());
  cuda::CudaStream s;
  ForwardOutputs o;
  o.y = make_view(dy.get(), DType::BF16, {T, H}, DeviceKind::Cuda);
  TensorView vx = make_view(dx.get(), DType::F32, {T, H}, DeviceKind::Cuda);
  gpu.forward(vx, {}, o, {.stream = s.get()});  // eager (also warms cuBLAS up outside the capture)
  std::vector<uint16_t> eager(size_t(T * H)), replay(size_t(T * H));
  dy.download(eager.data(), eager.size(), s.get());
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(s.get()));

  const cuda::CudaGraphExec graph(s.get(), [&] { gpu.forward(vx, {}, o, {.stream = s.get()}); });
  for (int rep = 0; rep < 2; ++rep) {
    NVFP4_CUDA_CHECK(cudaMemsetAsync(dy.get(), 0xFF, dy.bytes(), s.get()));
    graph.launch(s.get());
    dy.download(replay.data(), replay.size(), s.get());
    NVFP4_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    EXPECT_EQ(replay, eager) << "graph replay " << rep << " differs from the eager forward";
  }

  // A forward that throws inside a capture (an input of the wrong shape)
  // ends the capture: the error reaches the caller and the stream takes
  // eager work again.
  const TensorView bad = make_view(dx.get(), DType::F32, {T, H / 2}, DeviceKind::Cuda);
  EXPECT_THROW(cuda::CudaGraphExec(s.get(), [&] { gpu.forward(bad, {}, o, {.stream = s.get()}); }), Error);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  NVFP4_CUDA_CHECK(cudaStreamIsCapturing(s.get(), &status));
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  NVFP4_CUDA_CHECK(cudaMemsetAsync(dy.get(), 0xFF, dy.bytes(), s.get()));
  gpu.forward(vx, {}, o, {.stream = s.get()});
  dy.download(replay.data(), replay.size(), s.get());
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  EXPECT_EQ(replay, eager) << "eager forward after the failed capture";
}

// Forwards queued back to back on new inputs and routing, eagerly and as
// replays of one captured graph, with no synchronisation between them, equal
// bit for bit to the same forwards run one at a time. Kernels of the routed
// path start before the kernel ahead of them has finished (programmatic
// dependent launch) and must read and write only what is already theirs.
// K = 2048 and 1024 let the decode kernel take the few-token forwards, the
// prefill kernel the 64-token ones.
TEST(CudaMoe, BackToBackForwardsEqualIsolatedOnes) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  MoeConfig cfg = dsv4_pro_config();
  cfg.hidden = 2048;
  cfg.intermediate = 1024;
  cfg.experts = 16;
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
  Moe gpu = gpu_moe(w, 64);
  const int64_t H = cfg.hidden, k = cfg.top_k;
  constexpr int kRuns = 6;
  for (const int64_t T : {1, 3, 64}) {
    SCOPED_TRACE(::testing::Message() << "T=" << T);
    const size_t nx = size_t(T * H), nk = size_t(T * k);
    std::vector<float> x_all = random_normal(rng, kRuns * T * H), w_all;
    std::vector<int32_t> ids_all;
    for (int i = 0; i < kRuns; ++i) {
      std::vector<int32_t> ids;
      std::vector<float> wt;
      ep_routing(rng, T, k, cfg.experts, 0, cfg.experts, ids, wt);
      ids_all.insert(ids_all.end(), ids.begin(), ids.end());
      w_all.insert(w_all.end(), wt.begin(), wt.end());
    }
    cuda::DeviceBuffer<float> dx_all(x_all.size()), dw_all(w_all.size()), dx(nx), dw(nk);
    cuda::DeviceBuffer<int32_t> di_all(ids_all.size()), di(nk);
    cuda::DeviceBuffer<uint16_t> dy(nx), dy_all(kRuns * nx);
    dx_all.upload(x_all.data(), x_all.size());
    dw_all.upload(w_all.data(), w_all.size());
    di_all.upload(ids_all.data(), ids_all.size());
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
    cuda::CudaStream s;
    const TensorView vx = make_view(dx.get(), DType::F32, {T, H}, DeviceKind::Cuda);
    RoutingArgs r;
    r.topk_ids = make_view(di.get(), DType::I32, {T, k}, DeviceKind::Cuda);
    r.topk_weights = make_view(dw.get(), DType::F32, {T, k}, DeviceKind::Cuda);
    ForwardOutputs o;
    o.y = make_view(dy.get(), DType::BF16, {T, H}, DeviceKind::Cuda);
    auto d2d = [&](void* dst, const void* src, size_t bytes) {
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s.get()));
    };
    auto inputs = [&](int i) {
      d2d(dx.get(), dx_all.get() + i * nx, nx * sizeof(float));
      d2d(dw.get(), dw_all.get() + i * nk, nk * sizeof(float));
      d2d(di.get(), di_all.get() + i * nk, nk * sizeof(int32_t));
    };
    auto keep = [&](int i) { d2d(dy_all.get() + i * nx, dy.get(), nx * sizeof(uint16_t)); };

    std::vector<uint16_t> isolated(kRuns * nx), queued(kRuns * nx);
    for (int i = 0; i < kRuns; ++i) {
      inputs(i);
      NVFP4_CUDA_CHECK(cudaMemsetAsync(dy.get(), 0xFF, dy.bytes(), s.get()));
      gpu.forward(vx, r, o, {.stream = s.get()});
      dy.download(isolated.data() + i * nx, nx, s.get());
      NVFP4_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    }
    for (int i = 1; i < kRuns; ++i)
      ASSERT_NE(std::vector<uint16_t>(isolated.begin(), isolated.begin() + nx),
                std::vector<uint16_t>(isolated.begin() + i * nx, isolated.begin() + (i + 1) * nx))
          << "forward " << i << " gave forward 0's output: the comparison would prove nothing";

    NVFP4_CUDA_CHECK(cudaMemsetAsync(dy_all.get(), 0xFF, dy_all.bytes(), s.get()));
    for (int i = 0; i < kRuns; ++i) {
      inputs(i);
      gpu.forward(vx, r, o, {.stream = s.get()});
      keep(i);
    }
    dy_all.download(queued.data(), queued.size(), s.get());
    NVFP4_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    EXPECT_EQ(queued, isolated) << "eager forwards queued back to back";

    const cuda::CudaGraphExec graph(s.get(), [&] { gpu.forward(vx, r, o, {.stream = s.get()}); });
    NVFP4_CUDA_CHECK(cudaMemsetAsync(dy_all.get(), 0xFF, dy_all.bytes(), s.get()));
    for (int i = 0; i < kRuns; ++i) {
      inputs(i);
      graph.launch(s.get());
      keep(i);
    }
    dy_all.download(queued.data(), queued.size(), s.get());
    NVFP4_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    EXPECT_EQ(queued, isolated) << "graph replays queued back to back";
  }
}

}  // namespace
}  // namespace nvfp4moe
