// One expert-parallel rank's part of a forward, phase by phase, templated on
// the transport (`Peers`, see ep_kernels.cuh). The NCCL path runs the phases
// of its one rank with LSA barriers between them; the emulation runs each
// phase for every logical rank before the next phase (stream order is its
// barrier).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "cuda/cuda_check.hpp"
#include "cuda/error_word.hpp"
#include "cuda/kernels/combine.hpp"
#include "cuda/kernels/router.hpp"
#include "cuda/kernels/staging.hpp"
#include "ep/ep_index.hpp"
#include "ep/ep_kernels.cuh"
#include "ep/ep_local_experts.hpp"
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

// Which expert compute runs the local pairs (tests compare the two).
enum class EpCompute : uint8_t { GroupedGemm, Reference };

// The static L1 input g of a layer: the option if set, else the max over the
// given experts of w13_input_scale (docs/checkpoints.md); 0 for dynamic.
inline float ep_l1_static_scale(const MoeWeights& w, const EpCudaOptions& o) {
  if (w.config.l1_input != InputScaleMode::Static) return 0.0f;
  if (o.l1_static_scale > 0.0f) return o.l1_static_scale;
  NVFP4_CHECK(!w.experts.w13_input_scale.empty(),
              "expert parallel: static L1 input scales requested but w13_input_scale is empty");
  return *std::max_element(w.experts.w13_input_scale.begin(), w.experts.w13_input_scale.end());
}

// Segment layout from the config and options (host-checked geometry).
inline SegmentLayout ep_layout(const MoeConfig& c, int ranks, const EpCudaOptions& o) {
  NVFP4_CHECK(ranks >= 1, "expert parallel: ranks must be >= 1, got ", ranks);
  NVFP4_CHECK(c.experts % ranks == 0, "expert parallel: experts E=", c.experts, " not divisible by ranks R=", ranks);
  NVFP4_CHECK(c.top_k <= 32, "expert parallel: top_k=", c.top_k, " above the supported 32");
  NVFP4_CHECK(o.max_tokens_per_rank >= 1 && o.max_tokens_per_rank <= (1 << 24),
              "expert parallel: max_tokens_per_rank must be in [1, 2^24], got ", o.max_tokens_per_rank);
  const int64_t cap = o.recv_capacity > 0 ? o.recv_capacity : o.max_tokens_per_rank * ranks * c.top_k;
  NVFP4_CHECK(cap < (int64_t(1) << 30), "expert parallel: receive capacity ", cap, " too large");
  return make_segment_layout(int32_t(c.hidden), int32_t(c.top_k), int32_t(c.experts), ranks,
                             int32_t(o.max_tokens_per_rank), int32_t(cap), o.combine_bf16);
}

class EpRank {
 public:
  // `slice`: this rank's experts (LOCAL indexing), shared expert included.
  EpRank(const MoeWeights& slice, const SegmentLayout& layout, int32_t rank, float l1_static_g)
      : L_(layout),
        F_(layout),
        rank_(rank),
        l1_static_g_(l1_static_g),
        experts_(slice.experts, slice.config, layout.recv_capacity),
        shared_(slice.shared, slice.config, layout.max_tokens),
        pair_out_(size_t(layout.recv_capacity) * layout.hidden),
        shared_out_(shared_.present() ? size_t(layout.max_tokens) * layout.hidden : 0),
        shared_branch_(shared_.present() ? std::make_unique<cuda::StreamBranch>() : nullptr),
        config_(slice.config) {
    NVFP4_CHECK(slice.experts.count == layout.local_experts &&
                    slice.experts.first_expert == int64_t(rank) * layout.local_experts,
                "expert parallel rank ", rank, ": holds experts [", slice.experts.first_expert, ", ",
                slice.experts.first_expert + slice.experts.count, "), expected [", int64_t(rank) * layout.local_experts,
                ", ", int64_t(rank + 1) * layout.local_experts, ")");
    upload_router(slice.router);
  }

  // own tokens -> own send area (routing them first when the caller did
  // not); shared expert on own tokens, on a branch that combine() joins.
  template <typename Peers>
  void stage(Peers peers, char* own, const EpRankIo& io, EpCompute which, cudaStream_t s) {
    NVFP4_CHECK(io.tokens_bound >= 1 && io.tokens_bound <= L_.max_tokens && io.tokens <= io.tokens_bound,
                "expert parallel rank ", rank_, ": token bound ", io.tokens_bound, " must be in [max(1, T=",
                io.tokens, "), max_tokens_per_rank=", L_.max_tokens, "]");
    if (io.route) check_router(io);
    F_ = forward_layout(L_, io.tokens_bound);  // every phase of this forward launches by it
    // The shared expert needs only x: it runs on a branch beside everything
    // up to the combine, which joins it.
    if (shared_.present()) {
      const cudaStream_t side = shared_branch_->fork(s);
      if (which == EpCompute::GroupedGemm)
        shared_.run(io.x, io.x_is_bf16, io.tokens, shared_out_.get(), side);
      else
        shared_.run_ref(io.x, io.x_is_bf16, io.tokens, shared_out_.get(), side);
    }
    const void* ids = io.ids;
    bool ids_i64 = io.ids_i64;
    const float* weights = io.weights;
    if (io.route) {
      route(own, io, s);
      ids = router_ids_.get();
      ids_i64 = false;
      weights = router_weights_.get();
    }
    if (io.tokens > 0) {
      cuda::QuantizeActArgs q;
      q.x = io.x;
      q.x_is_bf16 = io.x_is_bf16;
      q.rows = io.tokens;
      q.cols = L_.hidden;
      q.scope = l1_static_g_ > 0.0f ? cuda::ActScope::Static : cuda::ActScope::PerRow;
      q.static_g = l1_static_g_ > 0.0f ? l1_static_g_ : 1.0f;
      q.g_out = area<float>(own, L_.send_g);
      q.codes = area<uint8_t>(own, L_.send_codes);
      q.scales_linear = area<uint8_t>(own, L_.send_scales);
      cuda::stage_activations(q, s);  // the fast kernel where it applies (same bytes)
    }
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

  // PULL the pairs this rank owns from every peer's send area; place them
  // and write the local experts' work list.
  template <typename Peers>
  void dispatch(Peers peers, cudaStream_t s) {
    const unsigned chunks = unsigned(std::clamp<int64_t>(cuda::ceil_div(int64_t(F_.max_tokens) * F_.top_k, 256), 1, 256));
    // counts, then (its last block) placement and the expert GEMMs' work list
    ep_dispatch_count_kernel<<<dim3(chunks, F_.ranks), 256, 0, s>>>(peers, F_, rank_, experts_.tile_sink());
    NVFP4_CUDA_CHECK_LAUNCH("ep_dispatch_count_kernel");
    ep_dispatch_gather_kernel<<<dim3(F_.max_tokens, F_.ranks), 128, 0, s>>>(peers, F_, rank_);
    NVFP4_CUDA_CHECK_LAUNCH("ep_dispatch_gather_kernel");
  }

  // The local experts on the receive area (LOCAL ids).
  void compute(char* own, EpCompute which, cudaStream_t s) {
    EpComputeArgs a;
    a.codes = area<uint8_t>(own, L_.recv_codes);
    a.scales = area<uint8_t>(own, L_.recv_scales);
    a.g = area<float>(own, L_.recv_g);
    a.expert = area<int32_t>(own, L_.recv_expert);
    a.weight = area<float>(own, L_.recv_weight);
    a.offsets = area<int32_t>(own, L_.expert_offset);
    a.total = area<int32_t>(own, L_.recv_total);
    a.capacity = F_.recv_capacity;
    a.out = pair_out_.get();
    if (which == EpCompute::GroupedGemm)
      experts_.run(a, s);
    else
      experts_.run_ref(a, s);
  }

  // PUSH every computed pair to its token's rank.
  template <typename Peers>
  void push(Peers peers, cudaStream_t s) {
    ep_combine_push_kernel<<<F_.recv_capacity, 128, 0, s>>>(peers, F_, rank_, pair_out_.get());
    NVFP4_CUDA_CHECK_LAUNCH("ep_combine_push_kernel");
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
  // Router weights as the CUDA backend keeps them: the gate transposed to
  // [H, E] (a warp's experts read contiguous bytes), bias, tid2eid.
  void upload_router(const RouterWeights& r) {
    const int64_t E = L_.experts, H = L_.hidden;
    if (!r.gate.empty()) {
      NVFP4_CHECK(int64_t(r.gate.size()) == E * H, "expert parallel rank ", rank_, ": router gate has ",
                  r.gate.size(), " elements, expected E*H = ", E * H);
      std::vector<float> t(r.gate.size());
      for (int64_t e = 0; e < E; ++e)
        for (int64_t h = 0; h < H; ++h) t[size_t(h * E + e)] = r.gate[size_t(e * H + h)];
      gate_t_ = cuda::DeviceBuffer<float>(t.size());
      gate_t_.upload(t.data(), t.size());
    }
    if (!r.bias.empty()) {
      NVFP4_CHECK(int64_t(r.bias.size()) == E, "expert parallel rank ", rank_, ": router bias has ", r.bias.size(),
                  " elements, expected E = ", E);
      bias_ = cuda::DeviceBuffer<float>(r.bias.size());
      bias_.upload(r.bias.data(), r.bias.size());
    }
    if (config_.hash_routed && !r.tid2eid.empty()) {
      NVFP4_CHECK(r.vocab > 0 && int64_t(r.tid2eid.size()) == r.vocab * L_.top_k, "expert parallel rank ", rank_,
                  ": tid2eid has ", r.tid2eid.size(), " entries, expected vocab*k = ", r.vocab, "*", L_.top_k);
      tid2eid_ = cuda::DeviceBuffer<int32_t>(r.tid2eid.size());
      tid2eid_.upload(r.tid2eid.data(), r.tid2eid.size());
      vocab_ = r.vocab;
    }
    router_ids_ = cuda::DeviceBuffer<int32_t>(size_t(L_.max_tokens) * L_.top_k);
    router_weights_ = cuda::DeviceBuffer<float>(size_t(L_.max_tokens) * L_.top_k);
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  }

  // Host checks of route(), made before a forward queues any work.
  void check_router(const EpRankIo& io) const {
    NVFP4_CHECK(gate_t_.size() > 0, "expert parallel rank ", rank_,
                ": no routing given (topk_ids) and the layer has no router weight");
    NVFP4_CHECK(!config_.hash_routed || (tid2eid_.size() > 0 && (io.token_ids || io.tokens == 0)),
                "expert parallel rank ", rank_, ": hash-routed layer needs tid2eid and token_ids [T]");
  }

  // The CUDA backend's router on this rank's tokens (GLOBAL ids; a token id
  // outside [0, vocab) of a hash layer is recorded in this rank's error word).
  void route(char* own, const EpRankIo& io, cudaStream_t s) {
    if (io.tokens == 0) return;
    cuda::RouterArgs r;
    r.x = io.x;
    r.x_is_bf16 = io.x_is_bf16;
    r.tokens = io.tokens;
    r.hidden = L_.hidden;
    r.gate_t = gate_t_.get();
    r.bias = bias_.size() ? bias_.get() : nullptr;
    r.experts = L_.experts;
    r.top_k = L_.top_k;
    r.scoring = int(config_.scoring);
    r.rho = config_.routed_scaling_factor;
    r.norm_topk_prob = config_.norm_topk_prob;
    if (config_.hash_routed) {
      r.tid2eid = tid2eid_.get();
      r.vocab = vocab_;
      r.token_ids = io.token_ids;
      r.token_ids_i64 = io.token_ids_i64;
    }
    r.topk_ids = router_ids_.get();
    r.topk_weights = router_weights_.get();
    r.error_word = area<uint32_t>(own, L_.error_word);
    cuda::route_tokens(r, s);
  }

  SegmentLayout L_;
  SegmentLayout F_;  // this forward's view of L_ (forward_layout), set by stage()
  int32_t rank_ = 0;
  float l1_static_g_ = 0.0f;
  EpLocalExperts experts_;
  EpSharedExpert shared_;
  cuda::DeviceBuffer<float> pair_out_;    // [capacity, H] w_j * o_e
  cuda::DeviceBuffer<float> shared_out_;  // [max_tokens, H]
  std::unique_ptr<cuda::StreamBranch> shared_branch_;  // the shared expert's side stream
  MoeConfig config_;
  cuda::DeviceBuffer<float> gate_t_, bias_;         // [H, E], [E]
  cuda::DeviceBuffer<int32_t> tid2eid_;             // [vocab, k]
  int64_t vocab_ = 0;
  cuda::DeviceBuffer<int32_t> router_ids_;          // [max_tokens, k]
  cuda::DeviceBuffer<float> router_weights_;        // [max_tokens, k]
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

// Host checks of one rank's forward arguments (spec 6), naming the argument.
// Routing: the caller's (topk_ids [T, k] int32/int64 GLOBAL + topk_weights
// [T, k] f32), or none -> the router (token_ids [T] for hash-routed layers).
inline EpRankIo ep_check_io(const TensorView& x, const RoutingArgs& r, const ForwardOutputs& out,
                            const SegmentLayout& L, int64_t max_tokens, bool hash_routed, const char* who) {
  NVFP4_CHECK(x.ndim == 2 && x.shape[1] == L.hidden, who, ": x must be [T, H=", L.hidden, "], got ", shape_string(x));
  const int64_t T = x.shape[0];
  NVFP4_CHECK(T <= max_tokens, who, ": T=", T, " tokens exceed the capacity of ", max_tokens, " tokens");
  NVFP4_CHECK(x.dtype == DType::BF16 || x.dtype == DType::F32, who, ": x must be bf16 or f32, got ",
              dtype_name(x.dtype));
  NVFP4_CHECK(x.device == DeviceKind::Cuda, who, ": x must be on the cuda device");
  NVFP4_CHECK(x.is_contiguous(), who, ": x must be contiguous, got strides [", x.strides[0], ", ", x.strides[1], "]");
  EpRankIo io;
  io.route = r.topk_ids.ndim == 0;
  if (!io.route) {
    NVFP4_CHECK(r.topk_ids.dtype == DType::I32 || r.topk_ids.dtype == DType::I64, who,
                ": topk_ids must be int32 or int64, got ", dtype_name(r.topk_ids.dtype));
    check_tensor(r.topk_ids, "topk_ids", r.topk_ids.dtype, DeviceKind::Cuda, {T, L.top_k});
    check_tensor(r.topk_weights, "topk_weights", DType::F32, DeviceKind::Cuda, {T, L.top_k});
    io.ids = r.topk_ids.data;
    io.ids_i64 = r.topk_ids.dtype == DType::I64;
    io.weights = r.topk_weights.ptr<float>();
  } else if (hash_routed) {
    NVFP4_CHECK(r.token_ids.ndim == 1, who, ": the layer is hash-routed: token_ids [T] is required");
    NVFP4_CHECK(r.token_ids.dtype == DType::I32 || r.token_ids.dtype == DType::I64, who,
                ": token_ids must be int32 or int64, got ", dtype_name(r.token_ids.dtype));
    check_tensor(r.token_ids, "token_ids", r.token_ids.dtype, DeviceKind::Cuda, {T});
    io.token_ids = r.token_ids.data;
    io.token_ids_i64 = r.token_ids.dtype == DType::I64;
  }
  check_tensor(out.y, "y", DType::BF16, DeviceKind::Cuda, {T, L.hidden});
  if (out.topk_ids.ndim) {
    check_tensor(out.topk_ids, "topk_ids (output)", DType::I32, DeviceKind::Cuda, {T, L.top_k});
    io.ids_out = out.topk_ids.ptr<int32_t>();
  }
  if (out.topk_weights.ndim) {
    check_tensor(out.topk_weights, "topk_weights (output)", DType::F32, DeviceKind::Cuda, {T, L.top_k});
    io.weights_out = out.topk_weights.ptr<float>();
  }
  io.x = x.data;
  io.x_is_bf16 = x.dtype == DType::BF16;
  io.y = out.y.ptr<__nv_bfloat16>();
  io.tokens = int32_t(T);
  return io;
}

// forward_host of both transports: host vectors -> device views -> forward
// (a callable taking x, routing, outputs) -> y as f32 values of the BF16
// output. Empty batches still get one-element buffers: a rank with no tokens
// still takes part in the collective.
template <typename Forward>
std::vector<float> ep_forward_host(const char* who, int64_t H, int64_t k, const std::vector<float>& x, int64_t tokens,
                                   const std::vector<int32_t>& ids, const std::vector<float>& weights,
                                   Forward&& forward) {
  NVFP4_CHECK(int64_t(x.size()) == tokens * H, who, ": x has ", x.size(), " values, expected T*H = ", tokens * H);
  NVFP4_CHECK(int64_t(ids.size()) == tokens * k && int64_t(weights.size()) == tokens * k, who,
              ": topk_ids/topk_weights have ", ids.size(), "/", weights.size(), " values, expected T*k = ", tokens * k);
  cuda::DeviceBuffer<float> dx(std::max<size_t>(1, x.size())), dw(std::max<size_t>(1, weights.size()));
  cuda::DeviceBuffer<int32_t> di(std::max<size_t>(1, ids.size()));
  cuda::DeviceBuffer<__nv_bfloat16> dy(std::max<size_t>(1, size_t(tokens * H)));
  dx.upload(x.data(), x.size());
  di.upload(ids.data(), ids.size());
  dw.upload(weights.data(), weights.size());
  RoutingArgs r;
  r.topk_ids = make_view(di.get(), DType::I32, {tokens, k}, DeviceKind::Cuda);
  r.topk_weights = make_view(dw.get(), DType::F32, {tokens, k}, DeviceKind::Cuda);
  ForwardOutputs out;
  out.y = make_view(dy.get(), DType::BF16, {tokens, H}, DeviceKind::Cuda);
  forward(make_view(dx.get(), DType::F32, {tokens, H}, DeviceKind::Cuda), r, out);
  std::vector<uint16_t> bits(size_t(tokens * H));
  NVFP4_CUDA_CHECK(cudaMemcpy(bits.data(), dy.get(), bits.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> y(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) y[i] = bf16_to_float(Bf16{bits[i]});
  return y;
}

}  // namespace nvfp4moe::ep
