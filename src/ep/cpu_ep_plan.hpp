// Dispatch bookkeeping of the CPU expert-parallel emulation: counts per
// (source, destination) rank, receive offsets, the capacity check. Built on
// the per-pair rules of ep_index.hpp (owner rank, local id, token chunks) that
// the GPU paths use too, so both place pairs the same way: in a destination's
// receive buffer, pairs arrive grouped by source rank (ascending), and within
// a source in (token, slot) order.
#pragma once

#include <cstdint>
#include <vector>

namespace nvfp4moe::ep {

struct CpuDispatchPlan {
  int32_t ranks = 0;
  int32_t experts_per_rank = 0;
  std::vector<int64_t> token_begin;  // [R + 1] token chunk of each rank
  std::vector<int64_t> send_count;   // [R * R] (src, dst): pairs src's tokens send to dst
  std::vector<int64_t> recv_count;   // [R] pairs dst receives
  std::vector<int64_t> recv_offset;  // [R * R] (src, dst): first row of src's block in dst's buffer
};

// Plans one forward: ids [T, k] GLOBAL (already checked to be in [-1, E)).
// Throws naming the rank, its count and the capacity when a rank would
// receive more than `recv_capacity` pairs (0 = unlimited).
CpuDispatchPlan plan_cpu_dispatch(const int32_t* ids, int64_t tokens, int32_t top_k, int32_t experts,
                                  int32_t ranks, int64_t recv_capacity);

}  // namespace nvfp4moe::ep
