// DeviceSharedExpert: the shared expert of a layer on the GPU — its weights
// uploaded once in their checkpoint format (gate and up fused as [2 Is, H]
// rows, down [H, Is]; BF16, or block-scaled FP8 bytes with a table of tile
// scales per 8-row group), the cuBLAS handle with a fixed workspace
// (graph-capturable) and the scratch of a forward of up to max_tokens
// tokens. The single-GPU backend and every expert-parallel rank (on its own
// tokens) use it.
//
//   out[T, H] f32 = W2s . (silu(min(W1s x, L)) * clamp(W3s x, -L, L))
//
// run(): x rounded to BF16 first; BF16 weights through kernels/shared_expert.hpp
// (tensor-core GEMV kernels up to 8 tokens, cuBLAS beyond), FP8 weights
// through kernels/shared_expert_fp8.hpp. run_ref(): the scalar reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "cuda/cuda_check.hpp"
#include "cuda/layout/fp8_fragment_layout.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cuda {

class DeviceSharedExpert {
 public:
  // Nothing is uploaded when config.shared_experts == 0 (present() false).
  DeviceSharedExpert(const SharedExpertWeights& weights, const MoeConfig& config, int64_t max_tokens);

  bool present() const { return inter_ > 0; }
  // x [tokens, H] bf16 or f32 on the device -> out [tokens, H] f32; tokens <= max_tokens.
  void run(const void* x, bool x_is_bf16, int64_t tokens, float* out, cudaStream_t stream);
  void run_ref(const void* x, bool x_is_bf16, int64_t tokens, float* out, cudaStream_t stream);
  // FP8 weights: the K splits of their kernels (0, the default: chosen per
  // call from the grid; benchmarks compare the others).
  void set_fp8_splits(int splits) { fp8_splits_ = splits; }

 private:
  void check_tokens(int64_t tokens) const;
  Fp8FragmentGeometry gate_up_fragments() const { return {.rows = 2 * inter_, .cols = hidden_, .pairs = true}; }
  Fp8FragmentGeometry down_fragments() const { return {.rows = hidden_, .cols = inter_, .pairs = false}; }

  int64_t hidden_ = 0, inter_ = 0, max_tokens_ = 0;
  std::optional<float> limit_;
  SharedExpertFormat format_ = SharedExpertFormat::Bf16;
  DeviceBuffer<__nv_bfloat16> w13_, w2_;  // Bf16: [2 Is, H] gate rows then up rows; [H, Is]
  DeviceBuffer<uint8_t> w13_fp8_, w2_fp8_;  // Fp8Block: the same as E4M3 bytes, fp8_fragments
  DeviceBuffer<float> w13_scale_, w2_scale_;  // Fp8Block: group scale tables (fp8_group_scales)
  DeviceBuffer<float> partial_;             // Fp8Block: split-K sums
  DeviceBuffer<int32_t> counters_;          // Fp8Block: split-K arrivals, zero at rest
  int sms_ = 0;
  int fp8_splits_ = 0;
  DeviceBuffer<uint8_t> cublas_ws_;       // declared before the handle: outlives it
  std::unique_ptr<CublasHandle> cublas_;
  DeviceBuffer<__nv_bfloat16> xb_, h_;    // [max_tokens, H], [max_tokens, Is]
  DeviceBuffer<float> gate_up_;           // [max_tokens, 2 Is] (cuBLAS path), or h in FP32 (reference)
};

}  // namespace nvfp4moe::cuda
