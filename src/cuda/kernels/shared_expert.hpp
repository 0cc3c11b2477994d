// The shared expert on the GPU: BF16 weights, FP32 accumulation and output,
// the same SwiGLU + limit as the routed experts:
//   out[T, H] = W2s . (silu(min(W1s x, L)) * clamp(W3s x, -L, L))
// with h rounded to BF16 between the projections. Up to 8 tokens it runs as
// two tensor-core GEMV kernels (shared_expert_gemv.hpp), beyond as cuBLAS
// GEMMs and a SwiGLU kernel.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nvfp4moe::cuda {

// C[M, N] f32 = A[M, K] bf16 (row-major) . B[N, K]^T bf16 (row-major), on the
// handle's stream; C's rows ldc apart (0: N).
void gemm_bf16_rowmajor_bt(cublasHandle_t h, const __nv_bfloat16* a, const __nv_bfloat16* b, float* c,
                           int64_t m, int64_t n, int64_t k, int64_t ldc = 0);

struct SharedExpertArgs {
  const __nv_bfloat16* x = nullptr;   // [T, H]
  int64_t tokens = 0, hidden = 0, inter = 0;
  const __nv_bfloat16* w13 = nullptr; // [2*Is, H]: gate rows then up rows
  const __nv_bfloat16* w2 = nullptr;  // [H, Is]
  bool has_limit = false;
  float limit = 0.0f;
  float* gate_up = nullptr;           // scratch [T, 2*Is] (cuBLAS path)
  __nv_bfloat16* h = nullptr;         // scratch [T, Is]
  float* out = nullptr;               // [T, H]
};
// The GEMV kernels where they apply (shared_expert_gemv_supports), else cuBLAS.
void shared_expert_forward(cublasHandle_t handle, const SharedExpertArgs& args, cudaStream_t stream);
// Always the cuBLAS GEMMs + SwiGLU kernel (any T; uses args.gate_up).
void shared_expert_cublas(cublasHandle_t handle, const SharedExpertArgs& args, cudaStream_t stream);

// x [n] f32 -> BF16 (RNE).
void f32_to_bf16(const float* x, int64_t n, __nv_bfloat16* y, cudaStream_t stream);

// Shared-expert SwiGLU: gu [T, 2*Is] f32 (gate cols then up cols) ->
// h [T, Is] BF16 = silu(min(gate, L)) * clamp(up, -L, L).
void swiglu_to_bf16(const float* gu, int64_t tokens, int64_t inter, bool has_limit, float limit,
                    __nv_bfloat16* h, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
