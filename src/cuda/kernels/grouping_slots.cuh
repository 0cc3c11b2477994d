// The two phases every grouping kernel shares (group_pairs_ref and
// group_pairs differ only in how they scan the counts): classify and
// count the slots, then place each local slot at its expert's cursor. Both
// are block-strided loops over the T * k slots.
#pragma once

#include "cuda/error_word.hpp"
#include "cuda/kernels/grouping.hpp"

namespace nvfp4moe::cuda {

__device__ __forceinline__ int64_t slot_id(const GroupingArgs& a, int64_t p) {
  return a.ids_i64 ? static_cast<const int64_t*>(a.topk_ids)[p] : int64_t(static_cast<const int32_t*>(a.topk_ids)[p]);
}

// Records the first id outside [-1, E) in the error word, writes ids_out,
// resets pos_of_pair and counts the local slots per expert (count zeroed by
// the caller; a barrier must follow).
__device__ __forceinline__ void count_local_slots(const GroupingArgs& a, int32_t* count) {
  const int64_t pairs = a.tokens * a.top_k;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int64_t id = slot_id(a, p);
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
}

// Expert e's positions [begin, begin + rows) as work tiles of at most
// tile_rows consecutive positions, into tiles[0, n); returns n.
__device__ __forceinline__ int32_t write_expert_tiles(int32_t e, int32_t begin, int32_t rows, int32_t tile_rows,
                                                      GemmTile* tiles) {
  int32_t n = 0;
  for (int32_t r = 0; r < rows; r += tile_rows) tiles[n++] = GemmTile{e, begin + r, min(tile_rows, rows - r), 0};
  return n;
}

// Position of each local slot = cursor[expert]++ (cursor: the group starts).
__device__ __forceinline__ void place_local_slots(const GroupingArgs& a, int32_t* cursor) {
  const int64_t pairs = a.tokens * a.top_k;
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int64_t id = slot_id(a, p);
    const int64_t local = id - a.first_expert;
    if (id < 0 || id >= a.experts || local < 0 || local >= a.local_experts) continue;
    const int32_t pos = atomicAdd(&cursor[local], 1);
    a.pair_of_pos[pos] = int32_t(p);
    a.pos_of_pair[p] = pos;
    a.expert_of_pos[pos] = int32_t(local);
  }
}

}  // namespace nvfp4moe::cuda
