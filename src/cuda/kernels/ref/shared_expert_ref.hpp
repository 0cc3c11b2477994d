// shared_expert_ref: the scalar reference of the shared expert
// (kernels/shared_expert.hpp): one thread per output element, FP32 sums over
// the BF16 weights and the unquantized x, h kept in FP32 between the two
// projections. Compiled without fast math: silu uses expf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nvfp4moe::cuda {

struct SharedExpertRefArgs {
  const void* x = nullptr;  // [T, H] bf16 or f32
  bool x_is_bf16 = false;
  int64_t tokens = 0, hidden = 0, inter = 0;
  const __nv_bfloat16* w13 = nullptr;  // [2*Is, H]: gate rows then up rows
  const __nv_bfloat16* w2 = nullptr;   // [H, Is]
  bool has_limit = false;
  float limit = 0.0f;
  float* h = nullptr;                  // scratch [T, Is]
  float* out = nullptr;                // [T, H]
};

// Once per process before the first call outside any stream capture.
void shared_expert_ref_prepare(int64_t hidden, int64_t inter);
void shared_expert_ref(const SharedExpertRefArgs& a, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
