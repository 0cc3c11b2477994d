// One expert-parallel rank's part of a forward, phase by phase, templated on
// the transport (`Peers`, see ep_kernels.cuh). The NCCL path runs the phases
// of its one rank with LSA barriers between them; the emulation runs each
// phase for every logical rank before the next phase (stream order is its
// barrier). The router, the routed experts and the shared expert are the
// CUDA backend's owners (src/cuda/backend/); the rank adds the transport.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cuda/backend/device_router.hpp"
#include "cuda/backend/device_shared_expert.hpp"
#include "cuda/backend/routed_experts.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/error_word.hpp"
#include "cuda/kernels/combine.hpp"
#include "cuda/kernels/staging.hpp"
#include "ep/ep_index.hpp"
#include "ep/ep_kernels.cuh"
#include "moe/forward_checks.hpp"
#include "nvfp4moe/ep_cuda.hpp"

namespace nvfp4moe::ep {

// The device views of one forward on one rank.
struct EpRankIo {
  const void* x = nullptr;  // [tokens, H]
  bool x_is_bf16 = false;
  bool route = false;         // no caller routing: the router runs on this rank
  const void* ids = nullptr;  // [tokens, k] caller routing
  bool ids_i64 = false;
  const float* weights = nullptr;  // [tokens, k]
  const void* token_ids = nullptr;  // [tokens] for hash-routed layers (router only)
  bool token_ids_i64 = false;
  __nv_bfloat16* y = nullptr;      // [tokens, H]
  int32_t* ids_out = nullptr;      // [tokens, k] or null: the GLOBAL ids used
  float* weights_out = nullptr;    // [tokens, k] or null
  int32_t tokens = 0;
  int32_t tokens_bound = 0;        // the most tokens any rank stages in this forward (1 .. max_tokens)
};

// The static L1 input g of a layer: the option if set (a rank holding a
// slice cannot see every expert's input_scale), else the max over the given
// experts (static_l1_input_scale); 0 for dynamic.
inline float ep_l1_static_scale(const MoeWeights& w, const EpCudaOptions& o) {
  if (w.config.l1_input == InputScaleMode::Static && o.l1_static_scale > 0.0f) return o.l1_static_scale;
  return static_l1_input_scale(w.config, w.experts);
}

// Segment layout from the config and options (host-checked geometry).
inline SegmentLayout ep_layout(const MoeConfig& c, int ranks, const EpCudaOptions& o) {
  NVFP4_CHECK(ranks >= 1, "expert parallel: ranks must be >= 1, got ", ranks);
  // x travels between GPUs as NVFP4 rows (codes, scales, g): the bf16 and fp8
  // modes would need rows of their own on the wire.
  NVFP4_CHECK(c.activation == ActivationMode::Nvfp4, "expert parallel on GPUs: activation mode ",
              activation_mode_name(c.activation),
              " is not supported (the ranks exchange NVFP4 rows; nvfp4 only, with NVFP4 or MXFP4 experts; "
              "CpuEpMoe runs every mode)");
  NVFP4_CHECK(c.experts % ranks == 0, "expert parallel: experts E=", c.experts, " not divisible by ranks R=", ranks);
  NVFP4_CHECK(c.top_k <= 32, "expert parallel: top_k=", c.top_k, " above the supported 32");
  NVFP4_CHECK(o.max_tokens_per_rank >= 1 && o.max_tokens_per_rank <= (1 << 24),
              "expert parallel: max_tokens_per_rank must be in [1, 2^24], got ", o.max_tokens_per_rank);
  const int64_t cap = o.recv_capacity > 0 ? o.recv_capacity : o.max_tokens_per_rank * ranks * c.top_k;
  NVFP4_CHECK(cap < (int64_t(1) << 30), "expert parallel: receive capacity ", cap, " too large");
  return make_segment_layout(int32_t(c.hidden), int32_t(c.top_k), int32_t(c.experts), ranks,
                             int32_t(o.max_tokens_per_rank), int32_t(cap), o.combine_bf16);
}

// Timing events of one forward (NcclEpMoe::set_phase_timing): one on the
// main stream at each phase boundary, two on the shared expert's branch.
struct EpPhaseEvents {
  static constexpr int kMarks = 7;  // before stage, after each of the 6 phases
  cuda::CudaEvent mark[kMarks], shared_begin, shared_end;
  bool recorded = false;  // a forward recorded them since timing was turned on
  bool shared = false;    // ... and its shared expert's
};

class EpRank {
 public:
  // `slice`: this rank's experts (LOCAL indexing), shared expert and router included.
  EpRank(const MoeWeights& slice, const SegmentLayout& layout, int32_t rank, float l1_static_g,
         cuda::RoutedKernels kernels)
      : L_(layout),
        F_(layout),
        rank_(rank),
        l1_static_g_(l1_static_g),
        kernels_(kernels),
        router_(slice.router, slice.config, layout.max_tokens),
        experts_(cuda::upload_routed_weights(slice.experts, slice.config, kernels), slice.config,
                 cuda::RoutedExperts::Capacity{.input_rows = layout.recv_capacity, .pairs = layout.recv_capacity},
                 kernels, 0.0f),
        shared_(slice.shared, slice.config, layout.max_tokens),
        identity_(size_t(layout.recv_capacity)),
        tiles_(size_t(cuda::max_gemm_tiles(layout.recv_capacity, layout.local_experts, cuda::kGemmTileTokens))),
        num_tiles_(1),
        out_rows_(size_t(layout.recv_capacity)),
        shared_out_(shared_.present() ? size_t(layout.max_tokens) * layout.hidden : 0),
        shared_branch_(shared_.present() ? std::make_unique<cuda::StreamBranch>() : nullptr) {
    NVFP4_CHECK(slice.experts.count == layout.local_experts &&
                    slice.experts.first_expert == int64_t(rank) * layout.local_experts,
                "expert parallel rank ", rank, ": holds experts [", slice.experts.first_expert, ", ",
                slice.experts.first_expert + slice.experts.count, "), expected [", int64_t(rank) * layout.local_experts,
                ", ", int64_t(rank + 1) * layout.local_experts, ")");
    // Receive row = position = pair: the expert GEMMs' pair map is the identity.
    std::vector<int32_t> rows(size_t(layout.recv_capacity));
    std::iota(rows.begin(), rows.end(), 0);
    identity_.upload(rows.data(), rows.size());
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // own tokens -> own send area (routing them first when the caller did
  // not); shared expert on own tokens, on a branch that combine() joins,
  // between the shared events of `timing` when given.
  template <typename Peers>
  void stage(Peers peers, char* own, const EpRankIo& io, cudaStream_t s, EpPhaseEvents* timing = nullptr) {
    NVFP4_CHECK(io.tokens_bound >= 1 && io.tokens_bound <= L_.max_tokens && io.tokens <= io.tokens_bound,
                "expert parallel rank ", rank_, ": token bound ", io.tokens_bound, " must be in [max(1, T=",
                io.tokens, "), max_tokens_per_rank=", L_.max_tokens, "]");
    if (io.route) router_.check(io.token_ids != nullptr, io.tokens);
    F_ = forward_layout(L_, io.tokens_bound);  // every phase of this forward launches by it
    // The shared expert needs only x: it runs on a branch beside everything
    // up to the combine, which joins it.
    if (shared_.present()) {
      const cudaStream_t side = shared_branch_->fork(s);
      if (timing) NVFP4_CUDA_CHECK(cudaEventRecord(timing->shared_begin.get(), side));
      if (kernels_ == cuda::RoutedKernels::Fast)
        shared_.run(io.x, io.x_is_bf16, io.tokens, shared_out_.get(), side);
      else
        shared_.run_ref(io.x, io.x_is_bf16, io.tokens, shared_out_.get(), side);
      if (timing) NVFP4_CUDA_CHECK(cudaEventRecord(timing->shared_end.get(), side));
    }
    if (timing) timing->shared = shared_.present();
    const void* ids = io.ids;
    bool ids_i64 = io.ids_i64;
    const float* weights = io.weights;
    if (io.route) {
      // A token id outside [0, vocab) of a hash layer goes to this rank's error word.
      router_.route(io.x, io.x_is_bf16, io.tokens, io.token_ids, io.token_ids_i64, area<uint32_t>(own, L_.error_word),
                    s);
      ids = router_.ids();
      ids_i64 = false;
      weights = router_.weights();
    }
    if (io.tokens > 0)
      cuda::stage_activations(
          cuda::QuantizeActArgs{.x = io.x,
                                .x_is_bf16 = io.x_is_bf16,
                                .rows = io.tokens,
                                .cols = L_.hidden,
                                .scope = l1_static_g_ > 0.0f ? cuda::ActScope::Static : cuda::ActScope::PerRow,
                                .static_g = l1_static_g_ > 0.0f ? l1_static_g_ : 1.0f,
                                .g_out = area<float>(own, L_.send_g),
                                .codes = area<uint8_t>(own, L_.send_codes),
                                .scales_linear = area<uint8_t>(own, L_.send_scales)},
          s);
    const int64_t n = int64_t(io.tokens) * L_.top_k;
    const unsigned blocks = unsigned(std::clamp<int64_t>(cuda::ceil_div(n, 256), 1, 1024));
    if (ids_i64)
      ep_stage_routing_kernel<<<blocks, 256, 0, s>>>(peers, F_, rank_, static_cast<const int64_t*>(ids), weights,
                                                     io.tokens);
    else
      ep_stage_routing_kernel<<<blocks, 256, 0, s>>>(peers, F_, rank_, static_cast<const int32_t*>(ids), weights,
                                                     io.tokens);
    NVFP4_CUDA_CHECK_LAUNCH("ep_stage_routing_kernel");
    // The routing used, as the send area holds it (GLOBAL int32 ids).
    if (io.ids_out && n)
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(io.ids_out, area<int32_t>(own, L_.send_ids), size_t(n) * 4,
                                       cudaMemcpyDeviceToDevice, s));
    if (io.weights_out && n)
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(io.weights_out, area<float>(own, L_.send_weights), size_t(n) * 4,
                                       cudaMemcpyDeviceToDevice, s));
  }

  // PULL the pairs this rank owns from every peer's send area; place them,
  // write the local experts' work list and where each result goes.
  template <typename Peers>
  void dispatch(Peers peers, cudaStream_t s) {
    const unsigned chunks = unsigned(std::clamp<int64_t>(cuda::ceil_div(int64_t(F_.max_tokens) * F_.top_k, 256), 1, 256));
    // counts, then (its last block) placement and the expert GEMMs' work list
    ep_dispatch_count_kernel<<<dim3(chunks, F_.ranks), 256, 0, s>>>(peers, F_, rank_,
                                                                    EpTileSink{tiles_.get(), num_tiles_.get()});
    NVFP4_CUDA_CHECK_LAUNCH("ep_dispatch_count_kernel");
    ep_dispatch_gather_kernel<<<dim3(F_.max_tokens, F_.ranks), 128, 0, s>>>(peers, F_, rank_, out_rows_.get());
    NVFP4_CUDA_CHECK_LAUNCH("ep_dispatch_gather_kernel");
  }

  // The local experts on the receive area (LOCAL ids); the down GEMM writes
  // w_j * o_e of each row into its token's rank's combine area (PUSH, over
  // NVLink for a peer's token) as its tiles finish, while other tiles
  // still compute.
  void compute(char* own, cudaStream_t s) {
    const int32_t* total = area<int32_t>(own, L_.recv_total);
    experts_.run(cuda::RoutedInput{.codes = area<uint8_t>(own, L_.recv_codes),
                                   .scales = area<uint8_t>(own, L_.recv_scales),
                                   .g = area<float>(own, L_.recv_g),
                                   .rows = F_.recv_capacity,
                                   .live_rows = total},
                 cuda::RoutedPairs{.pair_of_pos = identity_.get(),
                                   .top_k = 1,
                                   .expert_of_pos = area<int32_t>(own, L_.recv_expert),
                                   .offsets = area<int32_t>(own, L_.expert_offset),
                                   .tiles = tiles_.get(),
                                   .num_tiles = num_tiles_.get(),
                                   .pair_weights = area<float>(own, L_.recv_weight),
                                   .pairs_bound = F_.recv_capacity,
                                   .pairs_planned = cuda::planned_pairs(int64_t(F_.ranks) * F_.max_tokens * F_.top_k,
                                                                        F_.local_experts, F_.experts)},
                 cuda::PairOutput{.row_of_pair = out_rows_.get(), .bf16 = F_.combine_bytes == 2}, s);
  }

  // Own tokens: slots in slot order + shared expert -> y.
  template <typename Peers>
  void combine(Peers peers, const EpRankIo& io, cudaStream_t s) {
    if (shared_.present()) shared_branch_->join(s);  // joined even with no tokens: a capture needs every branch joined
    if (io.tokens == 0) return;
    const int64_t splits = cuda::combine_column_splits(io.tokens, F_.hidden, 256);
    ep_combine_kernel<<<dim3(unsigned(io.tokens), unsigned(splits)), 256, 0, s>>>(
        peers, F_, rank_, shared_.present() ? shared_out_.get() : nullptr, io.y);
    NVFP4_CUDA_CHECK_LAUNCH("ep_combine_kernel");
  }

  const SegmentLayout& layout() const { return L_; }

 private:
  SegmentLayout L_;
  SegmentLayout F_;  // this forward's view of L_ (forward_layout), set by stage()
  int32_t rank_ = 0;
  float l1_static_g_ = 0.0f;
  cuda::RoutedKernels kernels_;  // fast, or the scalar references (tests compare the two)
  cuda::DeviceRouter router_;
  cuda::RoutedExperts experts_;
  cuda::DeviceSharedExpert shared_;
  cuda::DeviceBuffer<int32_t> identity_;       // [capacity] row -> row
  cuda::DeviceBuffer<cuda::GemmTile> tiles_;   // the expert GEMMs' work list, written by the dispatch
  cuda::DeviceBuffer<int32_t> num_tiles_;      // [1]
  cuda::DeviceBuffer<void*> out_rows_;         // [capacity] receive row -> its combine row (a peer's segment)
  cuda::DeviceBuffer<float> shared_out_;       // [max_tokens, H]
  std::unique_ptr<cuda::StreamBranch> shared_branch_;  // the shared expert's side stream
};

// Names the bits of an error word for a host error message.
inline std::string ep_error_text(uint32_t word, const SegmentLayout& L) {
  std::string s;
  if (word & kErrExpertIdOutOfRange) s += "an expert id outside [-1, E=" + std::to_string(L.experts) + ") (skipped); ";
  if (word & kErrCapacity)
    s += "pairs dropped: receive capacity " + std::to_string(L.recv_capacity) +
         " exceeded, or that of a forward's token bound (R * bound * k), or a peer staged more tokens than this "
         "rank's bound (those slots contribute 0); ";
  if (word & cuda::kErrTokenIdOutOfRange) s += "a token id outside [0, vocab) of the hash router (its slots skipped); ";
  if (word & ~uint32_t(kErrExpertIdOutOfRange | kErrCapacity | cuda::kErrTokenIdOutOfRange))
    s += "unknown error bits; ";
  return s;
}

// One rank's forward arguments, checked as every front end checks them
// (moe/forward_checks.hpp), as device views: T <= max_tokens.
inline EpRankIo ep_check_io(const MoeConfig& cfg, const TensorView& x, const RoutingArgs& r, const ForwardOutputs& out,
                            int device, int64_t max_tokens, const char* who) {
  const CheckedForward a = check_forward_args(
      cfg, x, r, out, ForwardSite{.device = DeviceKind::Cuda, .device_index = device, .max_tokens = max_tokens, .who = who});
  EpRankIo io;
  io.route = !a.caller_routing;
  if (a.caller_routing) {
    io.ids = r.topk_ids.data;
    io.ids_i64 = r.topk_ids.dtype == DType::I64;
    io.weights = r.topk_weights.ptr<float>();
  } else if (r.token_ids.ndim) {
    io.token_ids = r.token_ids.data;
    io.token_ids_i64 = r.token_ids.dtype == DType::I64;
  }
  if (a.want_ids) io.ids_out = out.topk_ids.ptr<int32_t>();
  if (a.want_weights) io.weights_out = out.topk_weights.ptr<float>();
  io.x = x.data;
  io.x_is_bf16 = x.dtype == DType::BF16;
  io.y = out.y.ptr<__nv_bfloat16>();
  io.tokens = int32_t(a.tokens);
  return io;
}

}  // namespace nvfp4moe::ep
