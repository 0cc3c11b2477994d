// Grouping of routed (token, slot) pairs by LOCAL expert on the GPU: counts,
// offsets, the permutation, and the GEMM's work list — all on the device, so
// no host synchronisation is needed to size anything (the launch grids use
// upper bounds and surplus blocks exit).
//
// Slot ids are GLOBAL: -1 is skipped; an id outside [-1, E) is skipped with
// no memory access through it and recorded in the error word; an id of
// another rank's expert is skipped. Positions inside one expert's group come
// from atomics, so their order varies run to run, but every row is computed
// independently of its position, so results do not.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/layout/grouped_gemm_plan.hpp"

namespace nvfp4moe::cuda {

struct GroupingArgs {
  const void* topk_ids = nullptr;  // [T, k] global ids
  bool ids_i64 = false;
  int64_t tokens = 0;
  int top_k = 0;
  int64_t experts = 0;             // global E
  int64_t first_expert = 0, local_experts = 0;
  int tile_rows = 64;

  int32_t* ids_out = nullptr;        // [T*k] the ids as int32 (out-of-range ones as -1), or null
  int32_t* offsets = nullptr;        // [local+1] group starts; offsets[local] = live positions
  int32_t* pair_of_pos = nullptr;    // [T*k] position -> pair (t*k + j)
  int32_t* pos_of_pair = nullptr;    // [T*k] pair -> position, -1 when not computed here
  int32_t* expert_of_pos = nullptr;  // [T*k]
  GemmTile* tiles = nullptr;         // [max_tiles(T*k)]
  int32_t* num_tiles = nullptr;      // [1]
  uint32_t* error_word = nullptr;
};

// The grouping of a forward: one block of 1024 threads; the per-expert scan
// and the work list are built by the whole block (group_pairs_ref, its
// reference, does them with one thread: same offsets, work list and error word).
void group_pairs(const GroupingArgs& args, cudaStream_t stream);

// The host checks both grouping kernels share (expert range, pair count,
// shared memory); returns the dynamic shared memory the kernels need.
size_t check_grouping_args(const GroupingArgs& args, const char* kernel);

}  // namespace nvfp4moe::cuda
