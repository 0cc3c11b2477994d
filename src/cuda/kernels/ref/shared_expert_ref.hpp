// shared_expert_ref: the scalar reference of the shared expert
// (kernels/shared_expert.hpp): one thread per output element, FP32 sums over
// the weights (BF16, or E4M3 x the tile scale of their 8-row group, as
// kernels/shared_expert_fp8.hpp holds them, read through fp8_fragment_offset) and the unquantized x, h kept in
// FP32 between the two projections. Compiled without fast math: silu uses expf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/layout/fp8_fragment_layout.hpp"

namespace nvfp4moe::cuda {

struct SharedExpertRefArgs {
  const void* x = nullptr;  // [T, H] bf16 or f32
  bool x_is_bf16 = false;
  int64_t tokens = 0, hidden = 0, inter = 0;
  const __nv_bfloat16* w13 = nullptr;  // [2*Is, H]: gate rows then up rows (BF16 weights)
  const __nv_bfloat16* w2 = nullptr;   // [H, Is]
  const uint8_t* w13_fp8 = nullptr;    // FP8 weights instead: [2*Is, H] E4M3 in w13_geometry
  const float* w13_scale = nullptr;    //   [2*Is / 8, ceil(H / 128)]
  const uint8_t* w2_fp8 = nullptr;     //   [H, Is] E4M3 in w2_geometry
  const float* w2_scale = nullptr;     //   [H / 8, ceil(Is / 128)]
  Fp8FragmentGeometry w13_geometry, w2_geometry;
  bool has_limit = false;
  float limit = 0.0f;
  float* h = nullptr;                  // scratch [T, Is]
  float* out = nullptr;                // [T, H]
};

// Once per process before the first call outside any stream capture.
void shared_expert_ref_prepare(int64_t hidden, int64_t inter);
void shared_expert_ref(const SharedExpertRefArgs& a, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
