// Grouping kernel: one block of 1024 threads (the pair counts of a forward are
// at most max_tokens * k, tens of thousands): count, scan, place, list tiles.
#include "cuda/cuda_check.hpp"
#include "cuda/grouping_slots.cuh"
#include "cuda/grouping.hpp"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 1024;

__global__ void group_pairs_kernel(GroupingArgs a) {
  extern __shared__ int32_t sm[];
  int32_t* count = sm;                          // [local]
  int32_t* cursor = sm + a.local_experts;       // [local]
  for (int64_t e = threadIdx.x; e < a.local_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();

  count_local_slots(a, count);
  __syncthreads();

  // Exclusive scan (serial: local_experts is at most a few hundred) and the work list.
  if (threadIdx.x == 0) {
    int32_t run = 0, tiles = 0;
    for (int64_t e = 0; e < a.local_experts; ++e) {
      a.offsets[e] = run;
      cursor[e] = run;
      tiles += write_expert_tiles(int32_t(e), run, count[e], a.tile_rows, a.tiles + tiles);
      run += count[e];
    }
    a.offsets[a.local_experts] = run;
    *a.num_tiles = tiles;
  }
  __syncthreads();

  place_local_slots(a, cursor);
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
  allow_smem_at_least(group_pairs_kernel, smem);
  group_pairs_kernel<<<1, kThreads, smem, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("group_pairs_kernel");
}

}  // namespace nvfp4moe::cuda
