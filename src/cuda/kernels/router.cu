// Router kernel: a block handles kTokens tokens; each thread owns experts and
// accumulates their logits over H serially in double (router_math.hpp), then
// one thread per token selects and weighs (the shared scalar code, so the
// selection is the CPU's by construction).
#include "cuda/cuda_check.hpp"
#include "cuda/error_word.hpp"
#include "cuda/kernels/router.hpp"
#include "moe/router_math.hpp"
#include "nvfp4moe/moe.hpp"

#include <cuda_bf16.h>

namespace nvfp4moe::cuda {

namespace {

constexpr int kTokens = 4;      // tokens per block share each router-weight load
constexpr int kChunk = 512;     // H elements of x staged in shared memory at a time
constexpr int kThreads = 128;
constexpr int kMaxTopK = 32;
constexpr int kLanes = 8;       // H is a multiple of 16, so of 8: no tail lane
static_assert(kChunk % kLanes == 0, "chunks keep lane = h % 8");

__device__ void record_error(uint32_t* word, uint32_t bit, int64_t token, int64_t slot, int64_t value) {
  if (!word) return;
  if ((atomicOr(word, bit) & bit) == 0) {  // first of its kind: keep where it happened
    word[1] = uint32_t(token);
    word[2] = uint32_t(slot);
    word[3] = uint32_t(value);
  }
}

__global__ void router_kernel(RouterArgs a) {
  extern __shared__ float smem[];
  float* xs = smem;                           // [kTokens][kChunk]
  float* logits = xs + kTokens * kChunk;      // [kTokens][E]
  float* scores = logits + kTokens * a.experts;  // [kTokens][E]
  const int64_t t0 = int64_t(blockIdx.x) * kTokens;
  const int nt = int(min(int64_t(kTokens), a.tokens - t0));

  // Logits: thread per expert, H in order, double accumulation.
  for (int e0 = 0; e0 < a.experts; e0 += blockDim.x) {
    const int e = e0 + threadIdx.x;
    // 8 double lanes per token, lane = h % 8, reduced in lane order: the CPU
    // router's order (src/cpu/router.cpp), so the float logits agree bit for bit.
    double acc[kTokens][kLanes] = {};
    for (int64_t h0 = 0; h0 < a.hidden; h0 += kChunk) {
      const int hn = int(min(int64_t(kChunk), a.hidden - h0));
      __syncthreads();
      for (int i = threadIdx.x; i < kTokens * kChunk; i += blockDim.x) {
        const int t = i / kChunk, h = i % kChunk;
        float v = 0.0f;
        if (t < nt && h < hn) {
          const int64_t idx = (t0 + t) * a.hidden + h0 + h;
          v = a.x_is_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(a.x)[idx])
                          : static_cast<const float*>(a.x)[idx];
        }
        xs[i] = v;
      }
      __syncthreads();
      if (e < a.experts)
        for (int h = 0; h < hn; h += kLanes) {
#pragma unroll
          for (int l = 0; l < kLanes; ++l) {
            const float w = a.gate_t[(h0 + h + l) * a.experts + e];
#pragma unroll
            for (int t = 0; t < kTokens; ++t) acc[t][l] = router::add_product(acc[t][l], xs[t * kChunk + h + l], w);
          }
        }
    }
    if (e < a.experts)
      for (int t = 0; t < kTokens; ++t) {
        double sum = 0.0;
        for (int l = 0; l < kLanes; ++l) sum += acc[t][l];
        logits[t * a.experts + e] = router::round_logit(sum);
      }
  }
  __syncthreads();
  if (a.scoring == router::kSoftmax) {
    if (threadIdx.x < nt)
      router::softmax_scores(logits + threadIdx.x * a.experts, a.experts, scores + threadIdx.x * a.experts);
  } else {
    for (int i = threadIdx.x; i < nt * a.experts; i += blockDim.x) scores[i] = router::score_of(a.scoring, logits[i]);
  }
  __syncthreads();
  if (threadIdx.x >= nt) return;

  // Selection and weights: one thread per token, the shared scalar code.
  const int64_t t = t0 + threadIdx.x;
  const float* s = scores + threadIdx.x * a.experts;
  int ids[kMaxTopK];
  float keys[kMaxTopK], sel[kMaxTopK], w[kMaxTopK];
  const int k = a.top_k;
  if (a.tid2eid) {
    const int64_t tid = a.token_ids_i64 ? static_cast<const int64_t*>(a.token_ids)[t]
                                        : static_cast<const int32_t*>(a.token_ids)[t];
    const bool ok = tid >= 0 && tid < a.vocab;
    if (!ok) record_error(a.error_word, kErrTokenIdOutOfRange, t, 0, tid);
    for (int j = 0; j < k; ++j) {
      ids[j] = ok ? a.tid2eid[tid * k + j] : -1;
      sel[j] = (ids[j] >= 0 && ids[j] < a.experts) ? s[ids[j]] : 0.0f;  // bad ids: flagged by grouping
    }
  } else {
    int filled = 0;
    const float* b = a.bias;
    for (int e = 0; e < a.experts; ++e)
      router::topk_insert(router::selection_key(s[e], b ? b[e] : 0.0f), e, k, keys, ids, filled);
    for (int j = 0; j < k; ++j) sel[j] = s[ids[j]];
  }
  router::topk_weights(sel, k, a.rho, a.norm_topk_prob, w);
  for (int j = 0; j < k; ++j) {
    a.topk_ids[t * k + j] = ids[j];
    a.topk_weights[t * k + j] = w[j];
  }
}

}  // namespace

void route_tokens(const RouterArgs& a, cudaStream_t stream) {
  NVFP4_CHECK(a.top_k >= 1 && a.top_k <= kMaxTopK, "cuda router: top_k must be in [1, ", kMaxTopK, "], got ",
              a.top_k);
  NVFP4_CHECK(a.experts >= a.top_k, "cuda router: E=", a.experts, " < top_k=", a.top_k);
  if (a.tokens == 0) return;
  const size_t smem = sizeof(float) * (size_t(kTokens) * kChunk + 2 * size_t(kTokens) * a.experts);
  NVFP4_CHECK(smem <= 200 * 1024, "cuda router: E=", a.experts, " needs ", smem, " bytes of shared memory");
  allow_smem_at_least(router_kernel, smem);
  router_kernel<<<unsigned(ceil_div(a.tokens, kTokens)), kThreads, smem, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("router_kernel");
}

}  // namespace nvfp4moe::cuda
