// nvfp4moe — expert parallelism on the CPU: R logical ranks in one process
// (docs/numerics.md §6). The semantics every expert-parallel path must have, in
// their simplest form; the GPU paths (ep_cuda.hpp) share the indexing of
// src/ep/ep_index.hpp.
//
//   * E % R == 0; rank r owns GLOBAL experts [r*E/R, (r+1)*E/R) and holds ONLY
//     that slice (ExpertWeights::slice), indexed LOCALLY: local = global - r*E/R.
//   * The batch's tokens are split over ranks in contiguous chunks
//     (ep_index.hpp token_chunk_begin); the router runs on the token's rank.
//   * Dispatch: every (token, slot) with a GLOBAL id goes to the owner rank
//     with its activation row, slot, weight and LOCAL id; -1 slots go nowhere.
//   * The owner computes o_e (QDQ of x, grouped NVFP4 GEMMs) and sends back
//     w_j * o_e; the token's rank sums every slot in slot order plus the
//     shared expert, and rounds to BF16 once — so any R gives the same bits
//     as R = 1.
//   * Capacity: a rank may receive at most `recv_capacity` pairs per forward;
//     more is an nvfp4moe::Error naming the rank, the count and the capacity,
//     raised before any expert work (never silent corruption).
//   * An expert id outside [-1, E) is an Error naming token, slot and id.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

struct CpuEpOptions {
  int threads = 0;              // 0 = all cores
  int64_t recv_capacity = 0;    // pairs a rank may receive per forward; 0 = unlimited
};

// Per-forward dispatch statistics (for tests and the CLI).
struct CpuEpStats {
  std::vector<int64_t> tokens;    // [R] tokens held by each rank
  std::vector<int64_t> received;  // [R] pairs each rank computed
  std::vector<int64_t> sent;      // [R] pairs each rank's tokens sent (to any rank, itself included)
};

class CpuEpMoe final : public MoeLayer {
 public:
  // `weights`: the whole layer; rank r keeps its slice only. Throws when
  // E % R != 0 (naming E and R) or the weights are invalid.
  CpuEpMoe(const MoeWeights& weights, int ranks, const CpuEpOptions& options = {});
  ~CpuEpMoe() override;
  CpuEpMoe(CpuEpMoe&&) noexcept;
  CpuEpMoe& operator=(CpuEpMoe&&) noexcept;

  int ranks() const;
  const MoeConfig& config() const override;
  DeviceKind device() const override { return DeviceKind::Cpu; }
  // Rank r's experts: count E/R, first_expert r*E/R, local indexing.
  const ExpertWeights& rank_experts(int rank) const;

  // The contract of MoeLayer on host tensors (options are ignored): the
  // router runs on each token's rank, the caller's GLOBAL ids are checked
  // before any work, errors are thrown at once (sync_errors has nothing to do).
  void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
               const ForwardOptions& options = {}) override;
  void sync_errors() override {}

  // Statistics of the last forward.
  const CpuEpStats& last_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvfp4moe
