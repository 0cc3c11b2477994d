// Helpers of the expert-parallel GPU tests: a small DeepSeek-V4-shaped layer,
// random routing (GLOBAL ids, distinct per token, -1 slots), the single-GPU
// result through the public Moe API, and comparisons that print parameters.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "nvfp4moe/ep_cuda.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {

// Small enough for the CPU reference, with every feature of the layer on:
// shared expert, SwiGLU limit, H != I, E divisible by 1, 2, 4, 8.
inline MoeConfig ep_test_config() {
  MoeConfig c = dsv4_pro_config();
  c.hidden = 256;
  c.intermediate = 96;
  c.experts = 16;
  c.top_k = 4;
  c.routed_scaling_factor = 1.5f;
  return c;
}

struct EpRouting {
  std::vector<int32_t> ids;  // [T, k] GLOBAL, -1 = none
  std::vector<float> weights;
};

// Distinct ids per token drawn from [lo, hi) (hi - lo >= k), each slot -1
// with probability p_none.
inline EpRouting random_routing(Rng& rng, int64_t T, int64_t k, int64_t lo, int64_t hi, double p_none) {
  EpRouting r;
  r.ids.resize(size_t(T * k));
  r.weights.resize(size_t(T * k));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool;
    for (int64_t e = lo; e < hi; ++e) pool.push_back(int32_t(e));
    for (int64_t j = 0; j < k; ++j) {
      const int64_t pick = j + rng.below(int64_t(pool.size()) - j);
      std::swap(pool[size_t(j)], pool[size_t(pick)]);
      r.ids[size_t(t * k + j)] = rng.uniform() < p_none ? -1 : pool[size_t(j)];
      r.weights[size_t(t * k + j)] = rng.uniform(0.1f, 1.0f);
    }
  }
  return r;
}

// The single-GPU MoE (CUDA backend) or, if it cannot be built, the CPU one,
// on the same routing: the result every expert-parallel run must match.
inline std::vector<float> single_device_forward(const MoeWeights& w, const std::vector<float>& x, int64_t T,
                                                const EpRouting& r, std::string* which = nullptr) {
  std::unique_ptr<Moe> moe;
  try {
    MoeOptions o;
    o.backend = Backend::Cuda;
    o.max_tokens = std::max<int64_t>(T, 1);
    if (cudaGetDevice(&o.device) != cudaSuccess) o.device = 0;  // a rank process: its own GPU
    moe = std::make_unique<Moe>(w, o);
    if (which) *which = "cuda";
  } catch (const Error&) {
    moe = std::make_unique<Moe>(w, MoeOptions{});
    if (which) *which = "cpu";
  }
  return moe->forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
}

inline std::vector<float> cpu_forward(const MoeWeights& w, const std::vector<float>& x, int64_t T, const EpRouting& r) {
  Moe moe(w, MoeOptions{});
  return moe.forward_host({.x = x, .tokens = T, .topk_ids = r.ids, .topk_weights = r.weights}).y;
}

// A batch on the device as a forward takes it: x f32 [T, H], the caller's
// routing (GLOBAL int32 ids, f32 weights), y bf16 [T, H], and their views.
struct EpDeviceBatch {
  int64_t T = 0, H = 0;
  cuda::DeviceBuffer<float> dx, dw;
  cuda::DeviceBuffer<int32_t> di;
  cuda::DeviceBuffer<uint16_t> dy;
  TensorView x;
  RoutingArgs routing;
  ForwardOutputs out;

  EpDeviceBatch(const std::vector<float>& xh, int64_t T_, int64_t H_, const EpRouting& r, int64_t k)
      : T(T_), H(H_), dx(size_t(T_ * H_)), dw(size_t(T_ * k)), di(size_t(T_ * k)), dy(size_t(T_ * H_)) {
    dx.upload(xh.data(), xh.size());
    di.upload(r.ids.data(), r.ids.size());
    dw.upload(r.weights.data(), r.weights.size());
    x = make_view(dx.get(), DType::F32, {T, H}, DeviceKind::Cuda);
    routing.topk_ids = make_view(di.get(), DType::I32, {T, k}, DeviceKind::Cuda);
    routing.topk_weights = make_view(dw.get(), DType::F32, {T, k}, DeviceKind::Cuda);
    out.y = make_view(dy.get(), DType::BF16, {T, H}, DeviceKind::Cuda);
  }
  // y's bit patterns, after everything queued on `stream`.
  std::vector<uint16_t> y_bits(cudaStream_t stream = nullptr) const {
    std::vector<uint16_t> y(size_t(T * H));
    dy.download(y.data(), y.size(), stream);
    NVFP4_CUDA_CHECK(cudaStreamSynchronize(stream));
    return y;
  }
  std::vector<float> y_values(cudaStream_t stream = nullptr) const {
    const std::vector<uint16_t> bits = y_bits(stream);
    std::vector<float> y(bits.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = bf16_to_float(Bf16{bits[i]});
    return y;
  }
};

inline int64_t count_non_finite(const std::vector<float>& v) {
  int64_t n = 0;
  for (float f : v) n += !std::isfinite(f);
  return n;
}

// Rows [t0, t1) of a [T, H] matrix.
inline std::vector<float> rows_of(const std::vector<float>& m, int64_t H, int64_t t0, int64_t t1) {
  return std::vector<float>(m.begin() + t0 * H, m.begin() + t1 * H);
}

}  // namespace nvfp4moe::test
