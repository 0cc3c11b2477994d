// group_pairs_ref (ref/grouping_ref.hpp): one block of 1024 threads (the pair counts of a forward are
// at most max_tokens * k, tens of thousands): count, scan, place, list tiles.
#include "cuda/cuda_check.hpp"
#include "cuda/kernels/grouping_slots.cuh"
#include "cuda/kernels/ref/grouping_ref.hpp"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 1024;

__global__ void group_pairs_ref_kernel(GroupingArgs a) {
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

void group_pairs_ref(const GroupingArgs& a, cudaStream_t stream) {
  const size_t smem = check_grouping_args(a, "group_pairs_ref");
  allow_smem_at_least(group_pairs_ref_kernel, smem);
  group_pairs_ref_kernel<<<1, kThreads, smem, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("group_pairs_ref_kernel");
}

}  // namespace nvfp4moe::cuda
