// The last steps of a forward: y[t] = sum over slots j, in slot order, of
// y_pair[t*k + j] (only slots computed here: pos_of_pair >= 0) + shared[t],
// rounded to BF16 once. Deterministic; every output element is written.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nvfp4moe::cuda {

struct CombineArgs {
  const float* y_pair = nullptr;       // [T*k, H]
  const int32_t* pos_of_pair = nullptr;  // [T*k]
  const float* shared = nullptr;       // [T, H] or null
  int64_t tokens = 0, hidden = 0;
  int top_k = 0;
  __nv_bfloat16* y = nullptr;          // [T, H]
};
// Vectorized when H % 4 == 0, top_k <= 64 and the rows are aligned (combine_vectorized),
// else the scalar reference; both give the same bytes.
void combine_slots(const CombineArgs& args, cudaStream_t stream);
bool combine_vectorized(const CombineArgs& args);

// CTAs per token of a combine that sums 4 columns per thread and step with
// `threads` threads: few tokens split their H / 4 column vectors over CTAs
// until there are about two CTAs per SM (one load round trip per thread
// instead of one per step); many tokens take one CTA each. Shared by
// combine_slots and the expert-parallel combine (src/ep).
int64_t combine_column_splits(int64_t tokens, int64_t hidden, int threads);

}  // namespace nvfp4moe::cuda
