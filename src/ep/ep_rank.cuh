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
#include <optional>

#include "cuda/cuda_check.hpp"
#include "cuda/quantize_act.hpp"
#include "ep/ep_index.hpp"
#include "ep/ep_kernels.cuh"
#include "ep/ep_local_experts.hpp"
#include "nvfp4moe/ep_cuda.hpp"

namespace nvfp4moe::ep {

// The device views of one forward on one rank.
struct EpRankIo {
  const void* x = nullptr;  // [tokens, H]
  bool x_is_bf16 = false;
  const void* ids = nullptr;  // [tokens, k]
  bool ids_i64 = false;
  const float* weights = nullptr;  // [tokens, k]
  __nv_bfloat16* y = nullptr;      // [tokens, H]
  int32_t tokens = 0;
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
                             int32_t(o.max_tokens_per_rank), int32_t(cap));
}

class EpRank {
 public:
  // `slice`: this rank's experts (LOCAL indexing), shared expert included.
  EpRank(const MoeWeights& slice, const SegmentLayout& layout, int32_t rank, float l1_static_g)
      : L_(layout),
        rank_(rank),
        l1_static_g_(l1_static_g),
        experts_(slice.experts, slice.config, layout.recv_capacity),
        shared_(slice.shared, slice.config, layout.max_tokens),
        pair_out_(size_t(layout.recv_capacity) * layout.hidden),
        shared_out_(shared_.present() ? size_t(layout.max_tokens) * layout.hidden : 0) {
    NVFP4_CHECK(slice.experts.count == layout.local_experts &&
                    slice.experts.first_expert == int64_t(rank) * layout.local_experts,
                "expert parallel rank ", rank, ": holds experts [", slice.experts.first_expert, ", ",
                slice.experts.first_expert + slice.experts.count, "), expected [", int64_t(rank) * layout.local_experts,
                ", ", int64_t(rank + 1) * layout.local_experts, ")");
  }

  // own tokens -> own send area; shared expert on own tokens.
  template <typename Peers>
  void stage(Peers peers, char* own, const EpRankIo& io, EpCompute which, cudaStream_t s) {
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
      cuda::quantize_activations(q, s);
    }
    const int64_t n = int64_t(io.tokens) * L_.top_k;
    const unsigned blocks = unsigned(std::clamp<int64_t>(cuda::ceil_div(n, 256), 1, 1024));
    if (io.ids_i64)
      ep_stage_routing_kernel<<<blocks, 256, 0, s>>>(peers, L_, rank_, static_cast<const int64_t*>(io.ids), io.weights,
                                                     io.tokens);
    else
      ep_stage_routing_kernel<<<blocks, 256, 0, s>>>(peers, L_, rank_, static_cast<const int32_t*>(io.ids), io.weights,
                                                     io.tokens);
    NVFP4_CUDA_CHECK_LAUNCH("ep_stage_routing_kernel");
    if (shared_.present()) {
      if (which == EpCompute::GroupedGemm)
        shared_.run(io.x, io.x_is_bf16, io.tokens, shared_out_.get(), s);
      else
        shared_.run_ref(io.x, io.x_is_bf16, io.tokens, shared_out_.get(), s);
    }
  }

  // PULL the pairs this rank owns from every peer's send area.
  template <typename Peers>
  void dispatch(Peers peers, cudaStream_t s) {
    const unsigned chunks = unsigned(std::clamp<int64_t>(cuda::ceil_div(int64_t(L_.max_tokens) * L_.top_k, 256), 1, 256));
    ep_dispatch_count_kernel<<<dim3(chunks, L_.ranks), 256, 0, s>>>(peers, L_, rank_);
    NVFP4_CUDA_CHECK_LAUNCH("ep_dispatch_count_kernel");
    ep_dispatch_place_kernel<<<1, 32, 0, s>>>(peers, L_, rank_);
    NVFP4_CUDA_CHECK_LAUNCH("ep_dispatch_place_kernel");
    ep_dispatch_gather_kernel<<<dim3(L_.max_tokens, L_.ranks), 128, 0, s>>>(peers, L_, rank_);
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
    a.capacity = L_.recv_capacity;
    a.out = pair_out_.get();
    if (which == EpCompute::GroupedGemm)
      experts_.run(a, s);
    else
      experts_.run_ref(a, s);
  }

  // PUSH every computed pair to its token's rank.
  template <typename Peers>
  void push(Peers peers, cudaStream_t s) {
    ep_combine_push_kernel<<<L_.recv_capacity, 128, 0, s>>>(peers, L_, rank_, pair_out_.get());
    NVFP4_CUDA_CHECK_LAUNCH("ep_combine_push_kernel");
  }

  // Own tokens: slots in slot order + shared expert -> y.
  template <typename Peers>
  void combine(Peers peers, const EpRankIo& io, cudaStream_t s) {
    if (io.tokens == 0) return;
    ep_combine_kernel<<<io.tokens, 256, 0, s>>>(peers, L_, rank_, shared_.present() ? shared_out_.get() : nullptr,
                                                io.y);
    NVFP4_CUDA_CHECK_LAUNCH("ep_combine_kernel");
  }

  const SegmentLayout& layout() const { return L_; }

 private:
  SegmentLayout L_;
  int32_t rank_ = 0;
  float l1_static_g_ = 0.0f;
  EpLocalExperts experts_;
  EpSharedExpert shared_;
  cuda::DeviceBuffer<float> pair_out_;    // [capacity, H] w_j * o_e
  cuda::DeviceBuffer<float> shared_out_;  // [max_tokens, H]
};

// Names the bits of an error word for a host error message.
inline std::string ep_error_text(uint32_t word, const SegmentLayout& L) {
  std::string s;
  if (word & kErrExpertIdOutOfRange) s += "an expert id outside [-1, E=" + std::to_string(L.experts) + ") (skipped); ";
  if (word & kErrCapacity)
    s += "pairs dropped: receive capacity " + std::to_string(L.recv_capacity) + " exceeded (those slots contribute 0); ";
  if (word & ~uint32_t(kErrExpertIdOutOfRange | kErrCapacity)) s += "unknown error bits; ";
  return s;
}

// Host checks of one rank's forward arguments (spec 6), naming the argument.
inline EpRankIo ep_check_io(const TensorView& x, const RoutingArgs& r, const ForwardOutputs& out,
                            const SegmentLayout& L, int64_t max_tokens, const char* who) {
  NVFP4_CHECK(x.ndim == 2 && x.shape[1] == L.hidden, who, ": x must be [T, H=", L.hidden, "], got ", shape_string(x));
  const int64_t T = x.shape[0];
  NVFP4_CHECK(T <= max_tokens, who, ": T=", T, " tokens exceed the capacity of ", max_tokens, " tokens");
  NVFP4_CHECK(x.dtype == DType::BF16 || x.dtype == DType::F32, who, ": x must be bf16 or f32, got ",
              dtype_name(x.dtype));
  NVFP4_CHECK(x.device == DeviceKind::Cuda, who, ": x must be on the cuda device");
  NVFP4_CHECK(x.is_contiguous(), who, ": x must be contiguous, got strides [", x.strides[0], ", ", x.strides[1], "]");
  NVFP4_CHECK(r.topk_ids.ndim == 2, who,
              ": caller routing is required (topk_ids [T, k] GLOBAL ids); the expert-parallel path does not run the "
              "router");
  NVFP4_CHECK(r.topk_ids.dtype == DType::I32 || r.topk_ids.dtype == DType::I64, who,
              ": topk_ids must be int32 or int64, got ", dtype_name(r.topk_ids.dtype));
  check_tensor(r.topk_ids, "topk_ids", r.topk_ids.dtype, DeviceKind::Cuda, {T, L.top_k});
  check_tensor(r.topk_weights, "topk_weights", DType::F32, DeviceKind::Cuda, {T, L.top_k});
  check_tensor(out.y, "y", DType::BF16, DeviceKind::Cuda, {T, L.hidden});
  EpRankIo io;
  io.x = x.data;
  io.x_is_bf16 = x.dtype == DType::BF16;
  io.ids = r.topk_ids.data;
  io.ids_i64 = r.topk_ids.dtype == DType::I64;
  io.weights = r.topk_weights.ptr<float>();
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
