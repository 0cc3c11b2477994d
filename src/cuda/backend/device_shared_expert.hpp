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
// through kernels/shared_expert_fp8.hpp (its GEMV form up to 16 tokens,
// beyond its wgmma form with power-of-two tile scales, else its split form;
// the wgmma form's x scratch and TMA maps are made here once), or, for a
// batch of kFp8GemmMinTokens or more with power-of-two tile scales, the weights
// dequantized exactly to BF16 in row chunks of kFp8GemmChunkRows, each
// multiplied by cuBLAS while it is in L2 (a forward that long is bound by
// the tensor cores, not by the weight bytes). run_ref(): the scalar
// reference.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/shared_expert_fp8.hpp"
#include "cuda/layout/fp8_fragment_layout.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cuda {

// From this many tokens an FP8 forward with power-of-two tile scales runs
// as dequantization + BF16 GEMM (measured crossover on the H200,
// docs/performance.md); rows dequantized per GEMM.
constexpr int64_t kFp8GemmMinTokens = 1024;
constexpr int64_t kFp8GemmChunkRows = 2048;

class DeviceSharedExpert {
 public:
  // Nothing is uploaded when config.shared_experts == 0 (present() false).
  DeviceSharedExpert(const SharedExpertWeights& weights, const MoeConfig& config, int64_t max_tokens);

  bool present() const { return inter_ > 0; }
  // x [tokens, H] bf16 or f32 on the device -> out [tokens, H] f32; tokens <= max_tokens.
  void run(const void* x, bool x_is_bf16, int64_t tokens, float* out, cudaStream_t stream);
  void run_ref(const void* x, bool x_is_bf16, int64_t tokens, float* out, cudaStream_t stream);
  // FP8 weights: how a forward runs (the defaults: chosen per call;
  // benchmarks and tests compare the others).
  struct Fp8Choice {
    Fp8SharedPath kernels = Fp8SharedPath::Auto;
    int splits = 0;         // K splits of the split kernels, 0: chosen from the grid
    int dequant_gemm = -1;  // -1: from the token count and the scales; 0: never; 1: always (power-of-two scales)
    int gemv_stages = 0;    // register stages of the GEMV form (2 or 3), 0: chosen from the grid
    int gemv_warps = 0;     // warps a CTA of the GEMV form (3 or 4), 0: chosen from the grid
  };
  void set_fp8_choice(const Fp8Choice& c) { fp8_choice_ = c; }
  // Whether the dequantization + GEMM path can run: power-of-two FP8 factors
  // and a layer sized for at least kFp8GemmMinTokens tokens (its BF16 chunk).
  bool fp8_dequant_gemm_available() const { return fp8_chunk_.size() > 0; }

 private:
  void check_tokens(int64_t tokens) const;
  void run_fp8_dequant_gemm(const __nv_bfloat16* x, int64_t tokens, float* out, cudaStream_t stream);
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
  DeviceBuffer<__nv_bfloat16> fp8_chunk_;  // Fp8Block, max_tokens >= kFp8GemmMinTokens, power-of-two scales:
                                           // [kFp8GemmChunkRows, max(H, Is)] dequantized rows
  bool fp8_fold_ = false;                   // Fp8Block: tile factors 2^-117 .. 2^7 (the wgmma form)
  DeviceBuffer<__nv_bfloat16> x_perm_;      // Fp8Block, fp8_fold_, H and Is multiples of 64: [max_tokens, H]
  std::unique_ptr<Fp8WgmmaMaps> wgmma_maps_;  // of x_perm_ and h_
  int sms_ = 0;
  Fp8GemvShapes gemv_shapes_;               // Fp8Block: the GEMV launches' shapes on this device
  Fp8Choice fp8_choice_;
  DeviceBuffer<uint8_t> cublas_ws_;       // declared before the handle: outlives it
  std::unique_ptr<CublasHandle> cublas_;
  DeviceBuffer<__nv_bfloat16> xb_, h_;    // [max_tokens, H], [max_tokens, Is]
  DeviceBuffer<float> gate_up_;           // [max_tokens, 2 Is] (cuBLAS path), or h in FP32 (reference)
};

}  // namespace nvfp4moe::cuda
