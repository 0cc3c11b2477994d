// group_pairs: group_pairs_ref (grouping.hpp) with the per-expert scan and
// the work list built by all 1024 threads instead of one — the same offsets,
// work list and error word; positions inside a group come from atomics, as in
// group_pairs_ref. For decode this takes the grouping from ~9 us (48 experts) /
// ~22 us (384) to the cost of one small kernel, whose launch overlaps the
// kernel before it (programmatic dependent launch).
#include "cuda/cuda_check.hpp"
#include "cuda/dependent_launch.hpp"
#include "cuda/kernels/grouping.hpp"
#include "cuda/kernels/grouping_slots.cuh"
#include "cuda/kernels/warp_scan.cuh"
#include "cuda/ptx/sm90_griddep.cuh"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 1024;

// Exclusive scan of one int per thread over the block; returns the block total.
__device__ int32_t block_exclusive_scan(int32_t v, int32_t& excl, int32_t* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int32_t inc = warp_inclusive_sum(v);
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    warp_sums[lane] = warp_inclusive_sum(lane < int(blockDim.x / 32) ? warp_sums[lane] : 0);  // inclusive over warps
  }
  __syncthreads();
  const int32_t before = warp == 0 ? 0 : warp_sums[warp - 1];
  const int32_t total = warp_sums[blockDim.x / 32 - 1];
  excl = before + inc - v;
  __syncthreads();  // warp_sums reused by the next call
  return total;
}

__global__ void __launch_bounds__(kThreads) group_kernel(const __grid_constant__ GroupingArgs a) {
  extern __shared__ int32_t sm[];
  int32_t* count = sm;                     // [local]
  int32_t* cursor = sm + a.local_experts;  // [local]
  __shared__ int32_t warp_sums[32];
  // Launched to overlap the kernel before it: wait for it before any access.
  ptx::griddep_launch_dependents();
  ptx::griddep_wait();
  for (int64_t e = threadIdx.x; e < a.local_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();

  count_local_slots(a, count);
  __syncthreads();

  // Scan of counts and of tiles per expert, 1024 experts per round.
  int32_t run = 0, tiles = 0;
  for (int64_t e0 = 0; e0 < a.local_experts; e0 += blockDim.x) {
    const int64_t e = e0 + threadIdx.x;
    const int32_t c = e < a.local_experts ? count[e] : 0;
    const int32_t nt = (c + a.tile_rows - 1) / a.tile_rows;
    int32_t c_excl, t_excl;
    const int32_t c_total = block_exclusive_scan(c, c_excl, warp_sums);
    const int32_t t_total = block_exclusive_scan(nt, t_excl, warp_sums);
    if (e < a.local_experts) {
      const int32_t start = run + c_excl;
      a.offsets[e] = start;
      cursor[e] = start;
      write_expert_tiles(int32_t(e), start, c, a.tile_rows, a.tiles + tiles + t_excl);
    }
    run += c_total;
    tiles += t_total;
  }
  if (threadIdx.x == 0) {
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
  NVFP4_CHECK(a.tile_rows > 0, "group_pairs: tile_rows must be positive, got ", a.tile_rows);
  allow_smem_at_least(group_kernel, smem);
  launch_dependent(group_kernel, dim3(1), dim3(kThreads), smem, stream, true, a);
}

}  // namespace nvfp4moe::cuda
