// Shared expert through cuBLAS (see shared_expert.hpp).
#include "cuda/kernels/shared_expert.hpp"

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/shared_expert_gemv.hpp"

namespace nvfp4moe::cuda {

void gemm_bf16_rowmajor_bt(cublasHandle_t h, const __nv_bfloat16* a, const __nv_bfloat16* b, float* c,
                           int64_t m, int64_t n, int64_t k, int64_t ldc) {
  // Column-major view: C^T [n, m] = B [n, k] . A^T [k, m], with B stored as
  // the column-major k x n matrix B^T (hence OP_T).
  if (ldc == 0) ldc = n;
  NVFP4_CHECK(m < (int64_t(1) << 31) && n < (int64_t(1) << 31) && k < (int64_t(1) << 31) && ldc >= n &&
                  ldc < (int64_t(1) << 31),
              "bf16 gemm: dimensions too large or ldc < n: m=", m, " n=", n, " k=", k, " ldc=", ldc);
  const float alpha = 1.0f, beta = 0.0f;
  NVFP4_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(n), int(m), int(k), &alpha, b, CUDA_R_16BF,
                                  int(k), a, CUDA_R_16BF, int(k), &beta, c, CUDA_R_32F, int(ldc),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void shared_expert_forward(cublasHandle_t handle, const SharedExpertArgs& a, cudaStream_t stream) {
  // Few tokens: one pass over the weights per projection, SwiGLU fused
  // (cuBLAS splits these into GEMV-shaped GEMMs, a split-K reduction and a
  // SwiGLU kernel: 49 us at T=1 on DeepSeek-V4-Pro, against 39 us for the
  // GEMV pair).
  if (shared_expert_gemv_supports(a)) {
    shared_expert_gemv(a, stream);
    return;
  }
  shared_expert_cublas(handle, a, stream);
}

void shared_expert_cublas(cublasHandle_t handle, const SharedExpertArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return;
  NVFP4_CUBLAS_CHECK(cublasSetStream(handle, stream));
  gemm_bf16_rowmajor_bt(handle, a.x, a.w13, a.gate_up, a.tokens, 2 * a.inter, a.hidden);
  swiglu_to_bf16(a.gate_up, a.tokens, a.inter, a.has_limit, a.limit, a.h, stream);
  gemm_bf16_rowmajor_bt(handle, a.h, a.w2, a.out, a.tokens, a.hidden, a.inter);
}

}  // namespace nvfp4moe::cuda
