// Shared pieces of the CUDA MoE tests: device forward with poisoned outputs,
// EP8-style routing, and the CPU-backend comparison on a token subset
// (check_against_cpu, on the CPU twin of a GPU Moe).
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "moe/random_weights.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {

#define SKIP_WITHOUT_GPU() \
  if (!::nvfp4moe::cuda_available()) GTEST_SKIP() << "no CUDA device"

struct GpuOutput {
  std::vector<float> y;          // [T, H]
  std::vector<int32_t> ids;      // [T, k]
  std::vector<float> weights;    // [T, k]
};

// Device forward: y poisoned first, then every element checked written.
// ids/weights (caller routing) may be null; int64 ids when ids64 is set.
inline GpuOutput gpu_forward(Moe& m, const std::vector<float>& x, int64_t T, const std::vector<int32_t>* ids,
                             const std::vector<float>* w, const std::vector<int32_t>* token_ids = nullptr,
                             bool x_bf16 = false, bool ids64 = false, cudaStream_t stream = nullptr) {
  using cuda::DeviceBuffer;
  const MoeConfig& c = m.config();
  const int64_t H = c.hidden, k = c.top_k;
  DeviceBuffer<float> dx{x.size()}, dw{size_t(T * k)}, dwo{size_t(T * k)};
  DeviceBuffer<uint16_t> dxb{x.size()}, dy{size_t(T * H)};
  DeviceBuffer<int32_t> di{size_t(T * k)}, dio{size_t(T * k)}, dt{size_t(T)};
  DeviceBuffer<int64_t> di64{size_t(T * k)};
  TensorView vx;
  if (x_bf16) {
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_from_float(x[i]).bits;
    dxb.upload(xb.data(), xb.size());
    vx = make_view(dxb.get(), DType::BF16, {T, H}, DeviceKind::Cuda);
  } else {
    dx.upload(x.data(), x.size());
    vx = make_view(dx.get(), DType::F32, {T, H}, DeviceKind::Cuda);
  }
  RoutingArgs r;
  if (ids) {
    if (ids64) {
      std::vector<int64_t> i64(ids->begin(), ids->end());
      di64.upload(i64.data(), i64.size());
      r.topk_ids = make_view(di64.get(), DType::I64, {T, k}, DeviceKind::Cuda);
    } else {
      di.upload(ids->data(), ids->size());
      r.topk_ids = make_view(di.get(), DType::I32, {T, k}, DeviceKind::Cuda);
    }
    dw.upload(w->data(), w->size());
    r.topk_weights = make_view(dw.get(), DType::F32, {T, k}, DeviceKind::Cuda);
  }
  if (token_ids) {
    dt.upload(token_ids->data(), token_ids->size());
    r.token_ids = make_view(dt.get(), DType::I32, {T}, DeviceKind::Cuda);
  }
  std::vector<uint16_t> poison(size_t(T * H), kPoisonBf16);
  dy.upload(poison.data(), poison.size());
  ForwardOutputs o;
  o.y = make_view(dy.get(), DType::BF16, {T, H}, DeviceKind::Cuda);
  o.topk_ids = make_view(dio.get(), DType::I32, {T, k}, DeviceKind::Cuda);
  o.topk_weights = make_view(dwo.get(), DType::F32, {T, k}, DeviceKind::Cuda);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  m.forward(vx, r, o, {.stream = stream});
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  GpuOutput out;
  std::vector<uint16_t> yb(size_t(T * H));
  dy.download(yb.data(), yb.size());
  out.ids.resize(size_t(T * k));
  out.weights.resize(size_t(T * k));
  dio.download(out.ids.data(), out.ids.size());
  dwo.download(out.weights.data(), out.weights.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  out.y.resize(yb.size());
  int64_t unwritten = 0;
  for (size_t i = 0; i < yb.size(); ++i) {
    unwritten += yb[i] == kPoisonBf16;
    out.y[i] = bf16_to_float(Bf16{yb[i]});
  }
  EXPECT_EQ(unwritten, 0) << "output elements left unwritten (poison 0x7fa5) out of " << yb.size();
  return out;
}

// EP8-style routing for one rank: `tokens` tokens x top-k over E experts
// drawn uniformly (distinct per token); slots of experts outside
// [first, first + count) become -1. Weights positive, normalised.
inline void ep_routing(Rng& rng, int64_t tokens, int64_t k, int64_t E, int64_t first, int64_t count,
                       std::vector<int32_t>& ids, std::vector<float>& w, bool keep_all = false) {
  ids.assign(size_t(tokens * k), -1);
  w.assign(size_t(tokens * k), 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      bool dup;
      do {
        e = int32_t(rng.below(E));
        dup = false;
        for (int64_t i = 0; i < j; ++i) dup |= ids[size_t(t * k + i)] == e;
      } while (dup);
      ids[size_t(t * k + j)] = e;
      w[size_t(t * k + j)] = 0.2f + float(rng.uniform());
      sum += w[size_t(t * k + j)];
    }
    for (int64_t j = 0; j < k; ++j) {
      w[size_t(t * k + j)] *= 1.5f / sum;
      const int32_t e = ids[size_t(t * k + j)];
      if (!keep_all && (e < first || e >= first + count)) ids[size_t(t * k + j)] = -1;
    }
  }
}

// A random subset of at most n token indices (sorted), always including 0 and T-1.
inline std::vector<int64_t> token_subset(Rng& rng, int64_t T, int64_t n) {
  std::vector<int64_t> s;
  if (T <= n) {
    for (int64_t t = 0; t < T; ++t) s.push_back(t);
    return s;
  }
  std::vector<char> pick(size_t(T), 0);
  pick[0] = pick[size_t(T - 1)] = 1;
  for (int64_t i = 0; i < n - 2; ++i) pick[size_t(rng.below(T))] = 1;
  for (int64_t t = 0; t < T; ++t)
    if (pick[size_t(t)]) s.push_back(t);
  return s;
}

// Rows `sub` of a [T, width] array.
template <typename V>
std::vector<V> rows_of(const std::vector<V>& a, int64_t width, const std::vector<int64_t>& sub) {
  std::vector<V> out;
  for (int64_t t : sub) out.insert(out.end(), a.begin() + t * width, a.begin() + (t + 1) * width);
  return out;
}

inline bool all_finite(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isfinite(f)) return false;
  return true;
}

constexpr double kTol = 1e-2;  // docs/numerics.md §8
constexpr int64_t kSubset = 32;

// A CPU Moe equivalent to a GPU Moe holding experts [first, first+count):
// those experts as a whole layer of E = count (ids then local).
inline Moe cpu_twin(const MoeWeights& w) {
  MoeWeights c = w;
  const int64_t n = w.experts.count, H = w.config.hidden;
  if (w.experts.first_expert != 0 || n != w.config.experts) {
    c.config.experts = n;
    c.config.hash_routed = false;
    c.experts.first_expert = 0;
    c.router.gate.assign(w.router.gate.begin() + w.experts.first_expert * H,
                         w.router.gate.begin() + (w.experts.first_expert + n) * H);
    c.router.bias.assign(w.router.bias.begin() + w.experts.first_expert,
                         w.router.bias.begin() + w.experts.first_expert + n);
    c.router.tid2eid.clear();
    c.router.vocab = 0;
  }
  MoeOptions o;
  o.backend = Backend::Cpu;
  return Moe(std::move(c), o);
}

inline Moe gpu_moe(MoeWeights w, int64_t max_tokens, bool checked = false, bool fp8_mma = true) {
  MoeOptions o;
  o.backend = Backend::Cuda;
  o.max_tokens = max_tokens;
  o.checked = checked;
  o.fp8_mma = fp8_mma;
  return Moe(std::move(w), o);
}

// Runs the GPU Moe on T tokens (router, or caller routing `ids`/`w`), then the
// CPU twin on a subset with the GPU's routing; checks selection (router) and
// error. Returns the GPU output.
inline GpuOutput check_against_cpu(Moe& gpu, Moe& cpu, const MoeWeights& w, int64_t T, uint64_t seed,
                            const std::vector<int32_t>* ids = nullptr, const std::vector<float>* wts = nullptr,
                            bool x_bf16 = false, bool ids64 = false, double tol = kTol) {
  const MoeConfig& c = gpu.config();
  const int64_t H = c.hidden, k = c.top_k, first = w.experts.first_expert, n = w.experts.count;
  SCOPED_TRACE(::testing::Message() << "seed=" << seed << " T=" << T << " H=" << H << " I=" << c.intermediate
                                    << " E=" << c.experts << " k=" << k << " local=[" << first << "," << first + n
                                    << ") router=" << (ids == nullptr) << " bf16=" << x_bf16);
  Rng rng(seed);
  std::vector<float> x = random_normal(rng, T * H);
  if (x_bf16)
    for (float& v : x) v = bf16_to_float(bf16_from_float(v));
  GpuOutput g = gpu_forward(gpu, x, T, ids, wts, nullptr, x_bf16, ids64);
  EXPECT_TRUE(all_finite(g.y)) << "non-finite GPU output";

  const std::vector<int64_t> sub = token_subset(rng, T, kSubset);
  const int64_t S = int64_t(sub.size());
  std::vector<float> xs = rows_of(x, H, sub);
  std::vector<int32_t> gid = rows_of(g.ids, k, sub);
  std::vector<float> gw = rows_of(g.weights, k, sub);
  if (!ids) {  // the router must select identically
    const HostResult c = cpu.forward_host({.x = xs, .tokens = S});
    const std::vector<int32_t>& cid = c.topk_ids;
    const std::vector<float>& cw = c.topk_weights;
    EXPECT_EQ(cid, gid) << "router selection differs from the CPU";
    for (size_t i = 0; i < cw.size(); ++i) EXPECT_NEAR(gw[i], cw[i], 1e-6f * std::fabs(cw[i]) + 1e-7f) << "weight " << i;
  } else {
    EXPECT_EQ(gid, rows_of(*ids, k, sub)) << "topk_ids output is not the caller's routing";
  }
  // CPU on the subset with the GPU's routing (local ids for an EP slice).
  for (int32_t& e : gid) e = (e >= first && e < first + n) ? int32_t(e - first) : -1;
  std::vector<float> ys = cpu.forward_host({.x = xs, .tokens = S, .topk_ids = gid, .topk_weights = gw}).y;
  double norm = 0;
  for (float v : ys) norm += double(v) * v;
  EXPECT_GT(norm, 1e-6 * double(ys.size())) << "the reference output is (nearly) zero: the comparison would prove nothing";
  const double err = rel_l2(rows_of(g.y, H, sub), ys);
  EXPECT_LE(err, tol) << "relative L2 error vs the CPU backend";
  std::printf("    [T=%lld H=%lld E=%lld local=%lld] rel L2 vs cpu = %.3g\n", (long long)T, (long long)H,
              (long long)c.experts, (long long)n, err);
  return g;
}


}  // namespace nvfp4moe::test
