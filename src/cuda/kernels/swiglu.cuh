// The SwiGLU of docs/numerics.md §5 with the optional limit L, as every CUDA
// kernel applies it (fused GEMM epilogues, the shared expert, references):
//   silu(min(gate, L)) * clamp(up, -L, L)
#pragma once

namespace nvfp4moe::cuda {

__device__ __forceinline__ float swiglu_limited(float gate, float up, bool has_limit, float limit) {
  if (has_limit) {  // written so that NaN propagates (fminf / fmaxf would drop it)
    gate = gate > limit ? limit : gate;
    up = up > limit ? limit : (up < -limit ? -limit : up);
  }
  return gate / (1.0f + expf(-gate)) * up;
}

}  // namespace nvfp4moe::cuda
