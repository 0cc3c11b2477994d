// nvfp4moe — expert parallelism on GPUs (docs/numerics.md §6).
//
// Tokens are quantized to NVFP4 ONCE on their own rank, travel to the rank
// that owns their expert, are computed there with LOCAL weight indices, and
// the weighted results come back; each token's output (sum of every slot +
// shared expert) is formed on its own rank.
//
// Two transports, one indexing code (src/ep/ep_index.hpp):
//   * NcclEpMoe: one process per GPU, NCCL 2.28 device API — a symmetric
//     window (ncclMemAlloc + ncclCommWindowRegister NCCL_WIN_COLL_SYMMETRIC),
//     LSA pointers into peers' segments, LSA barriers between phases. No host
//     synchronisation in a forward; CUDA-graph capturable.
//   * EpCudaEmulation: R logical ranks on ONE GPU with plain device buffers
//     laid out exactly like the symmetric window (NCCL refuses two ranks on
//     one GPU), phases run rank after rank on one stream.
//
// Routing: the caller's (topk ids GLOBAL, or -1), or — when RoutingArgs has no
// topk_ids — the CUDA backend's router on each token's own rank (token_ids [T]
// for hash-routed layers); ForwardOutputs.topk_ids/topk_weights, if given,
// receive the routing used. An id outside [-1, E) is skipped and
// recorded in the token rank's error word; a pair that does not fit in its
// owner's receive capacity is dropped, contributes nothing and is recorded
// (kErrCapacity) on the owner and on the token's rank. sync_errors() reads
// the words of the ranks it can see and throws naming rank and error.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "nvfp4moe/moe.hpp"

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace nvfp4moe {

struct EpCudaOptions {
  int64_t max_tokens_per_rank = 256;  // tokens a rank may hold per forward (host-checked)
  int64_t recv_capacity = 0;          // pairs a rank may receive; 0 = max_tokens_per_rank * R * k (never overflows)
  float l1_static_scale = 0.0f;       // static L1 input g when config.l1_input is Static; 0 = max over the given experts
  bool checked = false;               // synchronise after each forward and report the error word at once
  bool reference_compute = false;     // local experts by the scalar reference instead of the grouped GEMM (tests)
  bool combine_bf16 = false;          // carry w_j * o_e back as BF16: half the combine traffic, one more
                                      // rounding per slot (default FP32: the single-GPU backend's values)
};

// Where one eager forward's time went on a rank (NcclEpMoe::set_phase_timing):
// milliseconds between events recorded on the forward's stream at each phase
// boundary, and the shared expert's time on its side stream, which runs
// beside stage .. the second barrier (docs/ep.md, "One forward, phase by
// phase"). The main-stream phases add up to total.
struct EpPhaseTimes {
  float stage = 0.0f;          // the router when asked, activation staging, routing into the send area
  float barrier_in = 0.0f;     // LSA barrier: every rank staged
  float dispatch = 0.0f;       // count, placement and gather of the owned pairs (pull)
  float experts = 0.0f;        // the local experts' GEMMs on the received rows; the down GEMM
                               // writes each result into its token's rank's combine area (push)
  float barrier_out = 0.0f;    // LSA barrier: every result arrived
  float combine = 0.0f;        // the shared expert joined, own tokens summed
  float total = 0.0f;          // first event to last
  float shared_expert = 0.0f;  // on its side stream (0 without a shared expert)
};
// The main-stream phases of EpPhaseTimes in the order a forward runs them.
using EpPhaseField = float EpPhaseTimes::*;
inline constexpr EpPhaseField kEpPhases[] = {&EpPhaseTimes::stage,       &EpPhaseTimes::barrier_in,
                                             &EpPhaseTimes::dispatch,    &EpPhaseTimes::experts,
                                             &EpPhaseTimes::barrier_out, &EpPhaseTimes::combine};

// Tokens of rank r in a batch of `tokens` split over `ranks` in contiguous chunks.
int64_t ep_token_begin(int64_t tokens, int ranks, int rank);

// One GPU, R logical ranks. `weights` is the full layer; rank r keeps only its
// slice (ExpertWeights::slice) with LOCAL indexing.
class EpCudaEmulation final : public MoeLayer {
 public:
  EpCudaEmulation(const MoeWeights& weights, int ranks, const EpCudaOptions& options = {});
  ~EpCudaEmulation() override;
  EpCudaEmulation(EpCudaEmulation&&) noexcept;
  EpCudaEmulation& operator=(EpCudaEmulation&&) noexcept;

  int ranks() const;
  uint64_t segment_bytes() const;  // bytes of one rank's (would-be symmetric) segment
  const MoeConfig& config() const override;
  DeviceKind device() const override { return DeviceKind::Cuda; }
  int device_index() const override;

  // The whole batch on the device (MoeLayer's contract): token chunk r
  // (ep_token_begin) is rank r's; T <= R * max_tokens_per_rank. The
  // forward's token bound (NcclEpMoe::forward) is its largest chunk;
  // options.max_tokens_any_rank is not used.
  void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
               const ForwardOptions& options = {}) override;
  // Error words of all ranks (synchronises); throws naming rank and error; clears them.
  void sync_errors() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// True when this build has the NCCL path (NVFP4MOE_HAS_NCCL).
bool nccl_ep_available();

// One rank of an NCCL communicator (one process per GPU, the current CUDA
// device). `weights`: the full layer, or this rank's slice (first_expert =
// rank * E/R, count = E/R). Construction is collective (window registration,
// device communicator): every rank constructs with the same options.
class NcclEpMoe final : public MoeLayer {
 public:
  NcclEpMoe(ncclComm* comm, const MoeWeights& weights, const EpCudaOptions& options = {});
  ~NcclEpMoe() override;
  NcclEpMoe(NcclEpMoe&&) noexcept;
  NcclEpMoe& operator=(NcclEpMoe&&) noexcept;

  int rank() const;
  int ranks() const;
  uint64_t symm_bytes() const;  // bytes of the symmetric buffer of this rank
  const MoeConfig& config() const override;
  DeviceKind device() const override { return DeviceKind::Cuda; }
  int device_index() const override;

  // This rank's tokens (MoeLayer's contract): x [T, H], y [T, H] bf16;
  // T <= max_tokens_per_rank. Collective: every rank calls it (T may differ,
  // may be 0). Queued on options.stream, no host synchronisation unless
  // checked; the shared expert runs on a side stream of this object, forked
  // from the stream and joined back into it within the call (capturable).
  //
  // options.max_tokens_any_rank: the most tokens any rank passes in THIS
  // forward, the same value on every rank (0: max_tokens_per_rank). The
  // forward's launches are sized by it and its expert GEMMs chosen for at
  // most R * it * k received pairs, instead of for the largest batch the
  // object was built for — the decode kernel's configuration follows the
  // batch (docs/ep.md). Host-checked: T <= it <= max_tokens_per_rank. A rank
  // given a smaller value than a peer's tokens drops that peer's excess
  // tokens' pairs and reports them as kErrCapacity.
  void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
               const ForwardOptions& options = {}) override;
  void sync_errors() override;

  // While on, each forward queued on a stream that is not capturing records
  // events between its phases (a few microseconds a forward; off by
  // default). phase_times() waits for the last such forward and returns
  // where its time went; it throws when none ran since timing was turned on.
  void set_phase_timing(bool on);
  EpPhaseTimes phase_times() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nvfp4moe
