// shared_expert_gemv (see shared_expert_gemv.hpp).
#include "cuda/kernels/shared_expert_gemv.hpp"

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/swiglu.cuh"
#include "cuda/ptx/sm80_mma_cp_async.cuh"
#include "cuda/ptx/sm90_ld_cvt.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = 32;   // K columns of one chunk: 8 per lane quad
constexpr int kInFlight = 4;  // chunks of one pipeline stage (4 KB of weights a warp)

// One chunk: lane (g, t) holds columns 8t..8t+7 of A rows g (lo) and g + 8
// (hi) and of token g (b); they feed k-slots 2t, 2t+1 (pair 0 / pair 2) and
// 2t+8, 2t+9 (pair 1 / pair 3) of two m16n8k16 steps.
__device__ __forceinline__ void mma_chunk(const uint4& lo, const uint4& hi, const uint4& b, float (&acc0)[4],
                                          float (&acc1)[4]) {
  const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y}, a1[4] = {lo.z, hi.z, lo.w, hi.w};
  ptx::mma_m16n8k16_bf16(acc0, a0, b.x, b.y);
  ptx::mma_m16n8k16_bf16(acc1, a1, b.z, b.w);
}

// grid: one CTA per unit (kSwiGlu: 8 gate rows + their up rows; else 16 rows).
// x [tokens, K] bf16, w [rows, K] bf16 (kSwiGlu: gate rows then up rows, Is =
// half_rows each). kSwiGlu writes h [tokens, half_rows] bf16, else out
// [tokens, rows] f32.
template <bool kSwiGlu>
__global__ void __launch_bounds__(kThreads) shared_gemv_kernel(const __nv_bfloat16* x, int32_t tokens, int32_t K,
                                                               const __nv_bfloat16* w, int32_t half_rows,
                                                               bool has_limit, float limit, __nv_bfloat16* h,
                                                               float* out, int32_t out_rows) {
  __shared__ float partial[kWarps][4][32];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, g = lane / 4, t = lane % 4;
  const int64_t u = blockIdx.x;
  const int64_t row_lo = kSwiGlu ? 8 * u + g : 16 * u + g;
  const int64_t row_hi = kSwiGlu ? half_rows + 8 * u + g : 16 * u + 8 + g;
  const __nv_bfloat16* wl = w + row_lo * K + 8 * t;
  const __nv_bfloat16* wh = w + row_hi * K + 8 * t;
  const bool live = g < tokens;  // lanes of token columns past T multiply zeros
  const __nv_bfloat16* xr = x + int64_t(live ? g : 0) * K + 8 * t;
  const int chunks = K / kChunk;

  // Software pipeline: the next stage's loads are issued before this
  // stage's mmas (left to itself, ptxas put each load right before its mma,
  // leaving a warp one or two loads in flight). Chunks past K load zeros.
  uint4 lo[kInFlight], hi[kInFlight], b[kInFlight];
  auto load_stage = [&](int c0) {
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      const int ci = c0 + i * kWarps;
      const int64_t k = int64_t(ci) * kChunk;
      const bool in = ci < chunks;
      lo[i] = in ? ptx::ld_global_stream_v4(wl + k) : make_uint4(0u, 0u, 0u, 0u);
      hi[i] = in ? ptx::ld_global_stream_v4(wh + k) : make_uint4(0u, 0u, 0u, 0u);
      b[i] = in && live ? ptx::ld_global_nc_v4(xr + k) : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  float acc0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, acc1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  load_stage(warp);
  for (int c = warp; c < chunks; c += kInFlight * kWarps) {
    uint4 clo[kInFlight], chi[kInFlight], cb[kInFlight];
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) {
      clo[i] = lo[i];
      chi[i] = hi[i];
      cb[i] = b[i];
    }
    load_stage(c + kInFlight * kWarps);
#pragma unroll
    for (int i = 0; i < kInFlight; ++i) mma_chunk(clo[i], chi[i], cb[i], acc0, acc1);
  }

#pragma unroll
  for (int j = 0; j < 4; ++j) partial[warp][j][lane] = acc0[j] + acc1[j];
  __syncthreads();
  if (warp != 0) return;
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = partial[0][j][lane] + partial[1][j][lane] + partial[2][j][lane] + partial[3][j][lane];
  // v: (row lo, token 2t), (row lo, token 2t + 1), (row hi, token 2t), (row hi, token 2t + 1).
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int tok = 2 * t + j;
    if (tok >= tokens) continue;
    if constexpr (kSwiGlu) {
      h[int64_t(tok) * half_rows + 8 * u + g] = __float2bfloat16_rn(swiglu_limited(v[j], v[2 + j], has_limit, limit));
    } else {
      out[int64_t(tok) * out_rows + row_lo] = v[j];
      out[int64_t(tok) * out_rows + row_hi] = v[2 + j];
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool shared_expert_gemv_supports(const SharedExpertArgs& a) {
  return a.tokens >= 1 && a.tokens <= kSharedGemvMaxTokens && a.hidden > 0 && a.inter > 0 && a.hidden % kChunk == 0 &&
         a.inter % kChunk == 0 && a.hidden < (int64_t(1) << 30) && a.inter < (int64_t(1) << 30) && aligned16(a.x) &&
         aligned16(a.w13) && aligned16(a.w2) && aligned16(a.h);
}

void shared_expert_gemv(const SharedExpertArgs& a, cudaStream_t stream) {
  NVFP4_CHECK(shared_expert_gemv_supports(a), "shared_expert_gemv: unsupported T=", a.tokens, " H=", a.hidden,
              " Is=", a.inter, " (T in [1, ", kSharedGemvMaxTokens,
              "], H and Is multiples of 32, 16-byte aligned x, weights and h)");
  const int32_t T = int32_t(a.tokens), H = int32_t(a.hidden), Is = int32_t(a.inter);
  shared_gemv_kernel<true><<<unsigned(Is / 8), kThreads, 0, stream>>>(a.x, T, H, a.w13, Is, a.has_limit, a.limit,
                                                                       a.h, nullptr, 0);
  NVFP4_CUDA_CHECK_LAUNCH("shared_gemv_kernel<gate/up>");
  shared_gemv_kernel<false><<<unsigned(H / 16), kThreads, 0, stream>>>(a.h, T, Is, a.w2, 0, false, 0.0f, nullptr,
                                                                        a.out, H);
  NVFP4_CUDA_CHECK_LAUNCH("shared_gemv_kernel<down>");
}

}  // namespace nvfp4moe::cuda
