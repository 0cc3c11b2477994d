// DeviceRouter: a layer's router on the GPU (kernels/router.hpp) — the gate
// uploaded once, transposed to [H, E] so that a warp's 32 experts read 128
// contiguous bytes, the correction bias, tid2eid for hash-routed layers — and
// the GLOBAL ids and weights of a forward of up to max_tokens tokens. The
// single-GPU backend and every expert-parallel rank (on its own tokens) use it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cuda {

class DeviceRouter {
 public:
  // `router` as validate_router (moe/forward_checks.hpp) accepts it; an empty
  // gate leaves routing to the caller.
  DeviceRouter(const RouterWeights& router, const MoeConfig& config, int64_t max_tokens);

  // Host checks of a forward that routes here, before any work is queued.
  void check(bool has_token_ids, int64_t tokens) const;
  // Routes `tokens` rows of x [tokens, H]: ids() / weights() [tokens, k]. A
  // hash layer's token id outside [0, vocab) is recorded in error_word
  // (kErrTokenIdOutOfRange) and its slots get -1.
  void route(const void* x, bool x_is_bf16, int64_t tokens, const void* token_ids, bool token_ids_i64,
             uint32_t* error_word, cudaStream_t stream);
  const int32_t* ids() const { return ids_.get(); }
  const float* weights() const { return weights_.get(); }
  int64_t vocab() const { return vocab_; }

 private:
  MoeConfig cfg_;
  int64_t max_tokens_ = 0, vocab_ = 0;
  DeviceBuffer<float> gate_t_, bias_;  // [H, E], [E]
  DeviceBuffer<int32_t> tid2eid_;      // [vocab, k]
  DeviceBuffer<int32_t> ids_;          // [max_tokens, k]
  DeviceBuffer<float> weights_;        // [max_tokens, k]
};

}  // namespace nvfp4moe::cuda
