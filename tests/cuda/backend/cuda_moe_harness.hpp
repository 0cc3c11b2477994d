// Shared pieces of the CUDA MoE tests: device forward with poisoned outputs,
// EP8-style routing, and the CPU-backend comparison on a token subset.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
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

}  // namespace nvfp4moe::test
