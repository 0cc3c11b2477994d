// The cuda backend behind nvfp4moe::Moe. It owns, per layer, the router
// (DeviceRouter), the routed experts (RoutedExperts), the shared expert
// (DeviceSharedExpert) and the grouping buffers of a forward of up to
// max_tokens tokens, and queues a forward on the caller's stream:
//
//   router (unless the caller routes) -> group_pairs -> routed experts
//   (stage x -> gate/up + SwiGLU -> requantize h -> down x w_j) ->
//   shared expert -> combine_slots
//
// No host synchronisation and no allocation in a forward: it can be captured
// into a CUDA graph. Bad expert ids are recorded in a device error word that
// sync_errors() (or every forward in checked mode) reads.
#include <optional>

#include "cuda/backend/device_router.hpp"
#include "cuda/backend/device_shared_expert.hpp"
#include "cuda/backend/routed_experts.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/error_word.hpp"
#include "cuda/kernels/combine.hpp"
#include "cuda/kernels/grouping.hpp"
#include "moe/backend.hpp"
#include "moe/forward_checks.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

using namespace nvfp4moe::cuda;

// The grouping of one forward's (token, slot) pairs by local expert.
struct GroupingBuffers {
  GroupingBuffers(int64_t pairs, int64_t local)
      : ids(size_t(pairs)),
        offsets(size_t(local + 1)),
        pair_of_pos(size_t(pairs)),
        pos_of_pair(size_t(pairs)),
        expert_of_pos(size_t(pairs)),
        tiles(size_t(max_gemm_tiles(pairs, local, kGemmTileTokens))),
        num_tiles(1) {}
  DeviceBuffer<int32_t> ids, offsets, pair_of_pos, pos_of_pair, expert_of_pos;
  DeviceBuffer<GemmTile> tiles;
  DeviceBuffer<int32_t> num_tiles;
};

class CudaMoeBackend final : public MoeBackendImpl {
 public:
  CudaMoeBackend(const MoeWeights& w, const MoeOptions& o)
      : cfg_(w.config), opt_(checked_options(w, o)), router_(w.router, cfg_, o.max_tokens),
        routed_(upload_routed_weights(w.experts, cfg_, RoutedKernels::Fast, o.fp8_mma), cfg_,
                RoutedExperts::Capacity{.input_rows = o.max_tokens, .pairs = o.max_tokens * cfg_.top_k},
                RoutedKernels::Fast, static_l1_input_scale(cfg_, w.experts)),
        shared_(w.shared, cfg_, o.max_tokens),
        groups_(o.max_tokens * cfg_.top_k, w.experts.count),
        y_pair_(size_t(o.max_tokens * cfg_.top_k * cfg_.hidden)),
        y_shared_(shared_.present() ? size_t(o.max_tokens * cfg_.hidden) : 0),
        err_(kErrorWords),
        first_(w.experts.first_expert) {
    NVFP4_CUDA_CHECK(cudaMemset(err_.get(), 0, err_.bytes()));
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  }

  const MoeConfig& config() const override { return cfg_; }
  Backend kind() const override { return Backend::Cuda; }
  int device_index() const override { return opt_.device; }
  std::string prefill_mma() const override { return routed_.prefill_mma(); }

  void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
               const ForwardOptions& options) override {
    const ForwardSite site{.device = DeviceKind::Cuda, .device_index = opt_.device, .max_tokens = opt_.max_tokens,
                           .who = "Moe"};
    const CheckedForward a = check_forward_args(cfg_, x, routing, out, site);
    const bool x_bf16 = x.dtype == DType::BF16;
    DeviceGuard guard(opt_.device);
    const cudaStream_t s = static_cast<cudaStream_t>(options.stream);
    const int64_t T = a.tokens, k = cfg_.top_k;
    if (T == 0) return;

    // 1. Routing: the caller's, or the router's.
    const void* ids = routing.topk_ids.data;
    bool ids_i64 = routing.topk_ids.dtype == DType::I64;
    const float* weights = routing.topk_weights.ptr<float>();
    if (!a.caller_routing) {
      router_.route(x.data, x_bf16, T, routing.token_ids.data, routing.token_ids.dtype == DType::I64, err_.get(), s);
      ids = router_.ids();
      ids_i64 = false;
      weights = router_.weights();
    }
    // 2. Grouping by local expert.
    group(ids, ids_i64, T, s);
    if (a.want_ids) copy_async(out.topk_ids.data, groups_.ids.get(), T * k, s);
    if (a.want_weights) copy_async(out.topk_weights.data, weights, T * k, s);
    // 3. Routed experts: y_pair [pair, H] = w_j * o_e.
    routed_.run(RoutedInput{.x = x.data, .x_is_bf16 = x_bf16, .rows = T},
                RoutedPairs{.pair_of_pos = groups_.pair_of_pos.get(),
                            .top_k = int(k),
                            .expert_of_pos = groups_.expert_of_pos.get(),
                            .offsets = groups_.offsets.get(),
                            .tiles = groups_.tiles.get(),
                            .num_tiles = groups_.num_tiles.get(),
                            .pair_weights = weights,
                            .pairs_bound = T * k,
                            .pairs_planned = cuda::planned_pairs(T * k, routed_.local_experts(), cfg_.experts)},
                PairOutput{.rows = y_pair_.get()}, s);
    // 4. Shared expert, on the unquantized x.
    shared_.run(x.data, x_bf16, T, y_shared_.get(), s);
    // 5. Combine in slot order.
    combine_slots(CombineArgs{.y_pair = y_pair_.get(),
                              .pos_of_pair = groups_.pos_of_pair.get(),
                              .shared = shared_.present() ? y_shared_.get() : nullptr,
                              .tokens = T,
                              .hidden = cfg_.hidden,
                              .top_k = int(k),
                              .y = static_cast<__nv_bfloat16*>(out.y.data)},
                  s);
    if (opt_.checked) {
      NVFP4_CUDA_CHECK(cudaStreamSynchronize(s));
      report_errors();
    }
  }

  void sync_errors() override {
    DeviceGuard guard(opt_.device);
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
    report_errors();
  }

 private:
  static MoeOptions checked_options(const MoeWeights& w, const MoeOptions& o) {
    const ExpertWeights& ex = w.experts;
    NVFP4_CHECK(ex.count > 0 && ex.first_expert >= 0 && ex.first_expert + ex.count <= w.config.experts,
                "cuda backend: local experts [", ex.first_expert, ", ", ex.first_expert + ex.count,
                ") outside [0, E=", w.config.experts, ")");
    NVFP4_CHECK(o.max_tokens >= 1 && o.max_tokens <= 65535, "cuda backend: max_tokens must be in [1, 65535], got ",
                o.max_tokens);
    NVFP4_CHECK(w.config.top_k <= 32, "cuda backend: top_k above 32 is not supported, got ", w.config.top_k);
    validate_router(w.config, w.router);
    return o;
  }

  void group(const void* ids, bool ids_i64, int64_t T, cudaStream_t s) {
    group_pairs(GroupingArgs{.topk_ids = ids,
                             .ids_i64 = ids_i64,
                             .tokens = T,
                             .top_k = int(cfg_.top_k),
                             .experts = cfg_.experts,
                             .first_expert = first_,
                             .local_experts = routed_.local_experts(),
                             .tile_rows = kGemmTileTokens,
                             .ids_out = groups_.ids.get(),
                             .offsets = groups_.offsets.get(),
                             .pair_of_pos = groups_.pair_of_pos.get(),
                             .pos_of_pair = groups_.pos_of_pair.get(),
                             .expert_of_pos = groups_.expert_of_pos.get(),
                             .tiles = groups_.tiles.get(),
                             .num_tiles = groups_.num_tiles.get(),
                             .error_word = err_.get()},
                s);
  }

  template <typename T>
  static void copy_async(void* dst, const T* src, int64_t n, cudaStream_t s) {
    NVFP4_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(T), cudaMemcpyDeviceToDevice, s));
  }

  // Reads and clears the device error word; throws naming the first error.
  void report_errors() {
    uint32_t w[kErrorWords] = {};
    NVFP4_CUDA_CHECK(cudaMemcpy(w, err_.get(), sizeof(w), cudaMemcpyDeviceToHost));
    if (w[0] == 0) return;
    NVFP4_CUDA_CHECK(cudaMemset(err_.get(), 0, err_.bytes()));
    if (w[0] & kErrExpertIdOutOfRange)
      NVFP4_FAIL("cuda forward: expert id ", int64_t(int32_t(w[3])), " at token ", w[1], " slot ", w[2],
                 " outside [-1, E=", cfg_.experts, "); the slot was skipped (device error word 0x", std::hex, w[0], ")");
    if (w[0] & kErrTokenIdOutOfRange)
      NVFP4_FAIL("cuda forward: token id ", int64_t(int32_t(w[3])), " of token ", w[1], " outside [0, vocab=",
                 router_.vocab(), ") of tid2eid; its slots were skipped");
    NVFP4_FAIL("cuda forward: device error word 0x", std::hex, w[0]);
  }

  MoeConfig cfg_;
  MoeOptions opt_;
  DeviceRouter router_;
  RoutedExperts routed_;
  DeviceSharedExpert shared_;
  GroupingBuffers groups_;
  DeviceBuffer<float> y_pair_, y_shared_;  // [T*k, H] w_j * o_e, [T, H] shared(x)
  DeviceBuffer<uint32_t> err_;
  int64_t first_ = 0;
};

}  // namespace

std::unique_ptr<MoeBackendImpl> make_cuda_backend(MoeWeights weights, const MoeOptions& options) {
  DeviceGuard guard(options.device);  // every buffer of the backend lives on its device
  return std::make_unique<CudaMoeBackend>(weights, options);
}

}  // namespace nvfp4moe
