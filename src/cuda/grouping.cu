// Grouping kernel: one block of 1024 threads (the pair counts of a forward are
// at most max_tokens * k, tens of thousands): count, scan, place, list tiles.
#include "cuda/cuda_check.hpp"
#include "cuda/error_word.hpp"
#include "cuda/grouping.hpp"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 1024;

__global__ void group_pairs_kernel(GroupingArgs a) {
  extern __shared__ int32_t sm[];
  int32_t* count = sm;                          // [local]
  int32_t* cursor = sm + a.local_experts;       // [local]
  const int64_t pairs = a.tokens * a.top_k;
  for (int64_t e = threadIdx.x; e < a.local_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();

  // Classify every slot; count local ones.
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int64_t id = a.ids_i64 ? static_cast<const int64_t*>(a.topk_ids)[p]
                                 : int64_t(static_cast<const int32_t*>(a.topk_ids)[p]);
    const bool in_range = id >= -1 && id < a.experts;
    if (!in_range && (atomicOr(a.error_word, kErrExpertIdOutOfRange) & kErrExpertIdOutOfRange) == 0) {
      a.error_word[1] = uint32_t(p / a.top_k);
      a.error_word[2] = uint32_t(p % a.top_k);
      a.error_word[3] = uint32_t(id);
    }
    if (a.ids_out) a.ids_out[p] = in_range ? int32_t(id) : -1;
    const int64_t local = id - a.first_expert;
    a.pos_of_pair[p] = -1;
    if (in_range && id >= 0 && local >= 0 && local < a.local_experts) atomicAdd(&count[local], 1);
  }
  __syncthreads();

  // Exclusive scan (serial: local_experts is at most a few hundred) and the work list.
  if (threadIdx.x == 0) {
    int32_t run = 0, tiles = 0;
    for (int64_t e = 0; e < a.local_experts; ++e) {
      a.offsets[e] = run;
      cursor[e] = run;
      for (int32_t r = 0; r < count[e]; r += a.tile_rows)
        a.tiles[tiles++] = GemmTile{int32_t(e), run + r, min(a.tile_rows, count[e] - r), 0};
      run += count[e];
    }
    a.offsets[a.local_experts] = run;
    *a.num_tiles = tiles;
  }
  __syncthreads();

  // Place: position = cursor[expert]++.
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int64_t id = a.ids_i64 ? static_cast<const int64_t*>(a.topk_ids)[p]
                                 : int64_t(static_cast<const int32_t*>(a.topk_ids)[p]);
    const int64_t local = id - a.first_expert;
    if (id < 0 || id >= a.experts || local < 0 || local >= a.local_experts) continue;
    const int32_t pos = atomicAdd(&cursor[local], 1);
    a.pair_of_pos[pos] = int32_t(p);
    a.pos_of_pair[p] = pos;
    a.expert_of_pos[pos] = int32_t(local);
  }
}

}  // namespace

size_t check_grouping_args(const GroupingArgs& a, const char* kernel) {
  NVFP4_CHECK(a.local_experts > 0 && a.first_expert >= 0 && a.first_expert + a.local_experts <= a.experts,
              kernel, ": local experts [", a.first_expert, ", ", a.first_expert + a.local_experts,
              ") outside [0, ", a.experts, ")");
  NVFP4_CHECK(a.tokens * a.top_k < (int64_t(1) << 31), kernel, ": too many pairs ", a.tokens * a.top_k);
  const size_t smem = sizeof(int32_t) * 2 * size_t(a.local_experts);
  NVFP4_CHECK(smem <= 200 * 1024, kernel, ": ", a.local_experts, " local experts exceed shared memory");
  return smem;
}

void group_pairs(const GroupingArgs& a, cudaStream_t stream) {
  const size_t smem = check_grouping_args(a, "group_pairs");
  if (smem > 48 * 1024)
    NVFP4_CUDA_CHECK(cudaFuncSetAttribute(group_pairs_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  group_pairs_kernel<<<1, kThreads, smem, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("group_pairs_kernel");
}

}  // namespace nvfp4moe::cuda
