// The router on the GPU (docs/numerics.md §5): logits, scores, biased top-k
// with ties to the lower id, weights — with the math of src/moe/router_math.hpp so
// that selection is identical to the CPU backend. Hash-routed layers look the
// ids up in tid2eid. Writes GLOBAL ids.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace nvfp4moe::cuda {

struct RouterArgs {
  const void* x = nullptr;          // [T, H]
  bool x_is_bf16 = false;
  int64_t tokens = 0, hidden = 0;
  const float* gate_t = nullptr;    // [H, E]: the router weight TRANSPOSED (coalesced over experts)
  const float* bias = nullptr;      // [E] or null (zeros)
  int experts = 0, top_k = 0;
  int scoring = 0;                  // router::ScoringKind
  float rho = 1.0f;
  bool norm_topk_prob = true;
  // Hash routing (tid2eid set): ids = tid2eid[token_id], weights from the scores.
  const int32_t* tid2eid = nullptr; // [vocab, k]
  int64_t vocab = 0;
  const void* token_ids = nullptr;  // [T]
  bool token_ids_i64 = false;

  int32_t* topk_ids = nullptr;      // [T, k] out
  float* topk_weights = nullptr;    // [T, k] out
  uint32_t* error_word = nullptr;   // device: ErrorBits; error_info[0..2] after it
};

void route_tokens(const RouterArgs& args, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
