// The cuda backend behind nvfp4moe::Moe: uploads the weights once (tile
// layout for the grouped GEMM, transposed router weight, fused shared-expert
// gate/up), owns every buffer a forward needs (sized from max_tokens), and
// queues a forward as a fixed sequence of kernels on the caller's stream:
//
//   route_tokens (unless the caller routes) -> group_pairs_ref -> quantize x ->
//   L1 grouped GEMM + SwiGLU -> requantize h -> L2 grouped GEMM x w_j ->
//   shared expert (cuBLAS) -> combine_slots
//
// No host synchronisation, no allocation: a forward can be captured into a
// CUDA graph. Bad expert ids are recorded in a device error word that
// sync_errors() (or every forward in checked mode) reads.
//
// Fast paths (sm90_nvfp4_*, same results as the simple kernels they stand in
// for): grouping, activation staging and requantization always where they
// apply; the grouped GEMMs chosen on the device by run_expert_gemm (decode
// kernel for few tokens per expert, wgmma kernel beyond).
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/parallel.hpp"
#include "cuda/backend/expert_gemm.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/error_word.hpp"
#include "cuda/kernels/combine.hpp"
#include "cuda/kernels/grouping.hpp"
#include "cuda/kernels/router.hpp"
#include "cuda/kernels/shared_expert.hpp"
#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"
#include "cuda/kernels/staging.hpp"
#include "cuda/layout/grouped_gemm_plan.hpp"
#include "moe/backend.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

using namespace nvfp4moe::cuda;
using bf16 = __nv_bfloat16;

// Packs every expert of one projection into the tile layout and uploads it,
// a batch of experts at a time (bounded host memory, parallel packing).
DeviceBuffer<uint8_t> upload_packed(Projection p, const std::vector<uint8_t>& codes,
                                    const std::vector<uint8_t>& scales, int64_t count, int64_t hidden,
                                    int64_t inter) {
  const PackedGeometry g = packed_geometry(p, hidden, inter);
  const int64_t per = g.bytes_per_expert();
  const int64_t codes_per = int64_t(codes.size()) / std::max<int64_t>(1, count);
  const int64_t scales_per = int64_t(scales.size()) / std::max<int64_t>(1, count);
  DeviceBuffer<uint8_t> dev(size_t(per * count));
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(count, (int64_t(1) << 30) / per));
  std::vector<uint8_t> host(size_t(per * batch));
  for (int64_t e0 = 0; e0 < count; e0 += batch) {
    const int64_t n = std::min(batch, count - e0);
    parallel_for(n, 1, [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i)
        pack_expert_weights(p, codes.data() + (e0 + i) * codes_per, scales.data() + (e0 + i) * scales_per, hidden,
                            inter, host.data() + i * per);
    });
    NVFP4_CUDA_CHECK(cudaMemcpy(dev.get() + e0 * per, host.data(), size_t(n * per), cudaMemcpyHostToDevice));
  }
  return dev;
}

template <typename T>
DeviceBuffer<T> upload(const std::vector<T>& v) {
  DeviceBuffer<T> d(v.size());
  if (!v.empty()) NVFP4_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

DeviceBuffer<bf16> upload_bf16(const std::vector<Bf16>& a, const std::vector<Bf16>& b = {}) {
  std::vector<Bf16> all(a);
  all.insert(all.end(), b.begin(), b.end());
  DeviceBuffer<bf16> d(all.size());
  if (!all.empty()) NVFP4_CUDA_CHECK(cudaMemcpy(d.get(), all.data(), all.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

class CudaMoeBackend final : public MoeBackendImpl {
 public:
  CudaMoeBackend(MoeWeights w, const MoeOptions& o) : cfg_(w.config), opt_(o) {
    DeviceGuard guard(o.device);
    const ExpertWeights& ex = w.experts;
    NVFP4_CHECK(ex.hidden == cfg_.hidden && ex.intermediate == cfg_.intermediate,
                "cuda backend: expert weights are H=", ex.hidden, " I=", ex.intermediate, " but the config says H=",
                cfg_.hidden, " I=", cfg_.intermediate);
    NVFP4_CHECK(ex.count > 0 && ex.first_expert >= 0 && ex.first_expert + ex.count <= cfg_.experts,
                "cuda backend: local experts [", ex.first_expert, ", ", ex.first_expert + ex.count,
                ") outside [0, E=", cfg_.experts, ")");
    NVFP4_CHECK(opt_.max_tokens >= 1 && opt_.max_tokens <= 65535, "cuda backend: max_tokens must be in [1, 65535], got ",
                opt_.max_tokens);
    NVFP4_CHECK(cfg_.top_k <= 32, "cuda backend: top_k above 32 is not supported, got ", cfg_.top_k);
    H_ = cfg_.hidden;
    I_ = cfg_.intermediate;
    k_ = int(cfg_.top_k);
    local_ = ex.count;
    first_ = ex.first_expert;
    geo1_ = packed_geometry(Projection::GateUp, H_, I_);
    geo2_ = packed_geometry(Projection::Down, H_, I_);

    // Routed experts: ONE copy, in the fragment layout (decode and wgmma
    // kernels) wherever the shape has it, else in the tile layout (the
    // correctness-first kernel); run_expert_gemm picks the kernel.
    if (fragment_layout_fits(H_, I_)) {
      mma1_ = upload_fragment_weights(Projection::GateUp, ex.w13_codes, ex.w13_scales, local_, H_, I_);
      mma2_ = upload_fragment_weights(Projection::Down, ex.w2_codes, ex.w2_scales, local_, H_, I_);
    } else {
      w13_ = upload_packed(Projection::GateUp, ex.w13_codes, ex.w13_scales, local_, H_, I_);
      w2_ = upload_packed(Projection::Down, ex.w2_codes, ex.w2_scales, local_, H_, I_);
    }
    prepare_expert_gemm(local_);
    w13_g_ = upload(ex.w13_global);
    w2_g_ = upload(ex.w2_global);
    if (cfg_.l1_input == InputScaleMode::Static) {
      NVFP4_CHECK(!ex.w13_input_scale.empty(), "cuda backend: static L1 input scales requested but w13_input_scale is empty");
      static_l1_g_ = *std::max_element(ex.w13_input_scale.begin(), ex.w13_input_scale.end());
    }
    if (cfg_.l2_input == InputScaleMode::Static) {
      NVFP4_CHECK(!ex.w2_input_scale.empty(), "cuda backend: static L2 input scales requested but w2_input_scale is empty");
      w2_in_ = upload(ex.w2_input_scale);
    }

    // Router: transposed to [H, E] so that a warp's 32 experts read 128 contiguous bytes.
    const RouterWeights& r = w.router;
    if (!r.gate.empty()) {
      NVFP4_CHECK(int64_t(r.gate.size()) == cfg_.experts * H_, "cuda backend: router gate has ", r.gate.size(),
                  " elements, expected E*H = ", cfg_.experts * H_);
      std::vector<float> t(r.gate.size());
      for (int64_t e = 0; e < cfg_.experts; ++e)
        for (int64_t h = 0; h < H_; ++h) t[size_t(h * cfg_.experts + e)] = r.gate[size_t(e * H_ + h)];
      gate_t_ = upload(t);
    }
    if (!r.bias.empty()) {
      NVFP4_CHECK(int64_t(r.bias.size()) == cfg_.experts, "cuda backend: router bias has ", r.bias.size(),
                  " elements, expected E = ", cfg_.experts);
      bias_ = upload(r.bias);
    }
    if (cfg_.hash_routed) {
      NVFP4_CHECK(r.vocab > 0 && int64_t(r.tid2eid.size()) == r.vocab * k_, "cuda backend: tid2eid has ",
                  r.tid2eid.size(), " entries, expected vocab*k = ", r.vocab, "*", k_);
      tid2eid_ = upload(r.tid2eid);
      vocab_ = r.vocab;
    }

    // Shared expert.
    Is_ = cfg_.shared_inter();
    if (cfg_.shared_experts) {
      const SharedExpertWeights& s = w.shared;
      NVFP4_CHECK(int64_t(s.w1.size()) == Is_ * H_ && int64_t(s.w3.size()) == Is_ * H_ &&
                      int64_t(s.w2.size()) == H_ * Is_,
                  "cuda backend: shared expert weights have ", s.w1.size(), "/", s.w3.size(), "/", s.w2.size(),
                  " elements, expected Is*H = ", Is_ * H_);
      ws13_ = upload_bf16(s.w1, s.w3);
      ws2_ = upload_bf16(s.w2);
    }

    // Buffers of a forward, sized for max_tokens.
    const int64_t T = opt_.max_tokens, P = T * k_;
    max_tiles_ = max_gemm_tiles(P, local_, kGemmTileTokens);
    kp1_ = geo1_.k_steps * kTileK;
    kp2_ = geo2_.k_steps * kTileK;
    ids_ = DeviceBuffer<int32_t>(size_t(P));
    ids32_ = DeviceBuffer<int32_t>(size_t(P));
    wts_ = DeviceBuffer<float>(size_t(P));
    offsets_ = DeviceBuffer<int32_t>(size_t(local_ + 1));
    pair_of_pos_ = DeviceBuffer<int32_t>(size_t(P));
    pos_of_pair_ = DeviceBuffer<int32_t>(size_t(P));
    expert_of_pos_ = DeviceBuffer<int32_t>(size_t(P));
    tiles_ = DeviceBuffer<GemmTile>(size_t(max_tiles_));
    num_tiles_ = DeviceBuffer<int32_t>(1);
    gx_ = DeviceBuffer<float>(size_t(T));
    xq_ = DeviceBuffer<bf16>(size_t(T * kp1_));
    h_ = DeviceBuffer<float>(size_t(P * I_));
    hq_ = DeviceBuffer<bf16>(size_t(P * kp2_));
    gh_ = DeviceBuffer<float>(size_t(P));
    y_pair_ = DeviceBuffer<float>(size_t(P * H_));
    if (cfg_.shared_experts) {
      xb_ = DeviceBuffer<bf16>(size_t(T * H_));
      gu_ = DeviceBuffer<float>(size_t(T * 2 * Is_));
      hs_ = DeviceBuffer<bf16>(size_t(T * Is_));
      ys_ = DeviceBuffer<float>(size_t(T * H_));
    }
    err_ = DeviceBuffer<uint32_t>(kErrorWords);
    NVFP4_CUDA_CHECK(cudaMemset(err_.get(), 0, err_.bytes()));
    cublas_ = std::make_unique<CublasHandle>();  // on opt_.device
    cublas_ws_ = DeviceBuffer<uint8_t>(size_t(32) << 20);
    NVFP4_CUBLAS_CHECK(cublasSetWorkspace(cublas_->get(), cublas_ws_.get(), cublas_ws_.bytes()));
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  }

  const MoeConfig& config() const override { return cfg_; }
  Backend kind() const override { return Backend::Cuda; }

  void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out, void* stream_ptr) override {
    const int64_t T = check_inputs(x, routing, out);
    DeviceGuard guard(opt_.device);
    cudaStream_t s = static_cast<cudaStream_t>(stream_ptr);
    if (T == 0) return;
    const int64_t P = T * k_;

    // 1. Routing: the caller's, or the router's.
    const void* ids = routing.topk_ids.data;
    bool ids_i64 = routing.topk_ids.dtype == DType::I64;
    const float* wts = routing.topk_weights.ptr<float>();
    if (routing.topk_ids.ndim == 0) {
      NVFP4_CHECK(gate_t_.get() || cfg_.hash_routed, "cuda backend: no routing given and the layer has no router weight");
      RouterArgs r;
      r.x = x.data;
      r.x_is_bf16 = x.dtype == DType::BF16;
      r.tokens = T;
      r.hidden = H_;
      r.gate_t = gate_t_.get();
      r.bias = bias_.get();
      r.experts = int(cfg_.experts);
      r.top_k = k_;
      r.scoring = int(cfg_.scoring);
      r.rho = cfg_.routed_scaling_factor;
      r.norm_topk_prob = cfg_.norm_topk_prob;
      if (cfg_.hash_routed) {
        r.tid2eid = tid2eid_.get();
        r.vocab = vocab_;
        r.token_ids = routing.token_ids.data;
        r.token_ids_i64 = routing.token_ids.dtype == DType::I64;
      }
      NVFP4_CHECK(r.gate_t, "cuda backend: the router needs the gate weight (also for hash-routed weights)");
      r.topk_ids = ids_.get();
      r.topk_weights = wts_.get();
      r.error_word = err_.get();
      route_tokens(r, s);
      ids = ids_.get();
      ids_i64 = false;
      wts = wts_.get();
    }

    // 2. Grouping by local expert.
    GroupingArgs g;
    g.topk_ids = ids;
    g.ids_i64 = ids_i64;
    g.tokens = T;
    g.top_k = k_;
    g.experts = cfg_.experts;
    g.first_expert = first_;
    g.local_experts = local_;
    g.tile_rows = kGemmTileTokens;
    g.ids_out = ids32_.get();
    g.offsets = offsets_.get();
    g.pair_of_pos = pair_of_pos_.get();
    g.pos_of_pair = pos_of_pair_.get();
    g.expert_of_pos = expert_of_pos_.get();
    g.tiles = tiles_.get();
    g.num_tiles = num_tiles_.get();
    g.error_word = err_.get();
    group_pairs(g, s);  // group_pairs_ref with a block-parallel scan: same results
    if (out.topk_ids.ndim)
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(out.topk_ids.data, ids32_.get(), size_t(P) * 4, cudaMemcpyDeviceToDevice, s));
    if (out.topk_weights.ndim)
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(out.topk_weights.data, wts, size_t(P) * 4, cudaMemcpyDeviceToDevice, s));

    // 3. L1 input: x -> NVFP4 (per token, or the static g) -> BF16 operand rows.
    QuantizeActArgs q;
    q.x = x.data;
    q.x_is_bf16 = x.dtype == DType::BF16;
    q.rows = T;
    q.cols = H_;
    q.scope = cfg_.l1_input == InputScaleMode::Static ? ActScope::Static : ActScope::PerRow;
    q.static_g = static_l1_g_;
    q.g_out = gx_.get();
    q.deq = xq_.get();
    q.deq_ld = kp1_;
    // The grouped GEMMs of this forward (chosen on the device from the live pair count) and the
    // column order they want their operand rows in.
    const FragmentWeights mma1_w = mma1_.view(), mma2_w = mma2_.view();
    const FragmentWeights* frag1 = mma1_.codes.get() ? &mma1_w : nullptr;
    const FragmentWeights* frag2 = mma2_.codes.get() ? &mma2_w : nullptr;
    const ExpertGemmChoice gemm = expert_gemm_choice(local_, P, frag1, frag2);
    q.deq_order = gemm.operand_order(offsets_.get() + local_);
    stage_activations(q, s);

    // 4. L1: gate/up + SwiGLU -> h [pos, I].
    const int64_t tiles_bound = std::min(max_tiles_, max_gemm_tiles(P, local_, kGemmTileTokens));
    GroupedGemmPlan l1;
    l1.projection = Projection::GateUp;
    l1.weights = w13_.get();
    l1.geometry = geo1_;
    l1.n_valid = I_;
    l1.w_global = w13_g_.get();
    l1.act = xq_.get();
    l1.ld_act = kp1_;
    l1.act_rows = int64_t(xq_.size()) / kp1_;
    l1.pair_of_pos = pair_of_pos_.get();
    l1.top_k = k_;
    l1.act_g = gx_.get();
    l1.tiles = tiles_.get();
    l1.num_tiles = num_tiles_.get();
    l1.max_tiles = tiles_bound;
    l1.h_out = h_.get();
    l1.ld_h = I_;
    l1.has_limit = cfg_.swiglu_limit.has_value();
    l1.limit = cfg_.swiglu_limit.value_or(0.0f);
    l1.offsets = offsets_.get();
    l1.local_experts = local_;
    run_expert_gemm(l1, frag1, gemm, s);

    // 5. L2 input: h -> NVFP4 per (token, expert) row (or static per expert) -> BF16 operand rows.
    RequantRowsArgs rq;
    rq.h = h_.get();
    rq.ld_h = I_;
    rq.cols = I_;
    rq.rows_max = P;
    rq.num_rows = offsets_.get() + local_;
    rq.static_g_per_expert = w2_in_.get();
    rq.row_expert = expert_of_pos_.get();
    rq.g_out = gh_.get();
    rq.deq = hq_.get();
    rq.deq_ld = kp2_;
    rq.deq_order = q.deq_order;
    stage_requantized_rows(rq, s);

    // 6. L2: down, times the routing weight -> y_pair [pair, H].
    GroupedGemmPlan l2 = l1;
    l2.projection = Projection::Down;
    l2.weights = w2_.get();
    l2.geometry = geo2_;
    l2.n_valid = H_;
    l2.w_global = w2_g_.get();
    l2.act = hq_.get();
    l2.ld_act = kp2_;
    l2.act_rows = int64_t(hq_.size()) / kp2_;
    l2.act_g = gh_.get();
    l2.h_out = nullptr;
    l2.y_pair = y_pair_.get();
    l2.topk_weights = wts;
    run_expert_gemm(l2, frag2, gemm, s);

    // 7. Shared expert.
    if (cfg_.shared_experts) {
      const bf16* xb = static_cast<const bf16*>(x.data);
      if (x.dtype != DType::BF16) {
        f32_to_bf16(x.ptr<float>(), T * H_, xb_.get(), s);
        xb = xb_.get();
      }
      SharedExpertArgs se;
      se.x = xb;
      se.tokens = T;
      se.hidden = H_;
      se.inter = Is_;
      se.w13 = ws13_.get();
      se.w2 = ws2_.get();
      se.has_limit = l1.has_limit;
      se.limit = l1.limit;
      se.gate_up = gu_.get();
      se.h = hs_.get();
      se.out = ys_.get();
      shared_expert_forward(cublas_->get(), se, s);
    }

    // 8. Combine in slot order.
    CombineArgs c;
    c.y_pair = y_pair_.get();
    c.pos_of_pair = pos_of_pair_.get();
    c.shared = cfg_.shared_experts ? ys_.get() : nullptr;
    c.tokens = T;
    c.hidden = H_;
    c.top_k = k_;
    c.y = static_cast<bf16*>(out.y.data);
    combine_slots(c, s);

    if (opt_.checked) {
      NVFP4_CUDA_CHECK(cudaStreamSynchronize(s));
      report_errors();
    }
  }

  std::vector<float> forward_host(const std::vector<float>& x, int64_t tokens, const std::vector<int32_t>* topk_ids,
                                  const std::vector<float>* topk_weights, const std::vector<int32_t>* token_ids,
                                  std::vector<int32_t>* topk_ids_out, std::vector<float>* topk_weights_out) override {
    NVFP4_CHECK(tokens >= 0 && int64_t(x.size()) == tokens * H_, "forward_host: x has ", x.size(),
                " values, expected T*H = ", tokens, "*", H_);
    NVFP4_CHECK(!topk_ids == !topk_weights, "forward_host: topk_ids and topk_weights must be given together");
    const int64_t P = tokens * k_;
    if (topk_ids)
      NVFP4_CHECK(int64_t(topk_ids->size()) == P && int64_t(topk_weights->size()) == P, "forward_host: topk_ids has ",
                  topk_ids->size(), " and topk_weights ", topk_weights->size(), " entries, expected T*k = ", P);
    if (token_ids)
      NVFP4_CHECK(int64_t(token_ids->size()) == tokens, "forward_host: token_ids has ", token_ids->size(),
                  " entries, expected T = ", tokens);
    DeviceGuard guard(opt_.device);
    const int dev = opt_.device;
    DeviceBuffer<float> dx{x.size()}, dw{size_t(P)}, dwo{size_t(P)};
    DeviceBuffer<int32_t> di{size_t(P)}, dt{size_t(tokens)}, dio{size_t(P)};
    DeviceBuffer<bf16> dy{size_t(tokens * H_)};
    CudaStream stream;
    dx.upload(x.data(), x.size(), stream.get());
    TensorView vx = make_view(dx.get(), DType::F32, {tokens, H_}, DeviceKind::Cuda, dev);
    RoutingArgs r;
    if (topk_ids) {
      di.upload(topk_ids->data(), size_t(P), stream.get());
      dw.upload(topk_weights->data(), size_t(P), stream.get());
      r.topk_ids = make_view(di.get(), DType::I32, {tokens, k_}, DeviceKind::Cuda, dev);
      r.topk_weights = make_view(dw.get(), DType::F32, {tokens, k_}, DeviceKind::Cuda, dev);
    }
    if (token_ids) {
      dt.upload(token_ids->data(), size_t(tokens), stream.get());
      r.token_ids = make_view(dt.get(), DType::I32, {tokens}, DeviceKind::Cuda, dev);
    }
    ForwardOutputs o;
    o.y = make_view(dy.get(), DType::BF16, {tokens, H_}, DeviceKind::Cuda, dev);
    if (topk_ids_out) o.topk_ids = make_view(dio.get(), DType::I32, {tokens, k_}, DeviceKind::Cuda, dev);
    if (topk_weights_out) o.topk_weights = make_view(dwo.get(), DType::F32, {tokens, k_}, DeviceKind::Cuda, dev);
    forward(vx, r, o, stream.get());
    std::vector<uint16_t> yb(size_t(tokens * H_));
    if (!yb.empty())
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(yb.data(), dy.get(), yb.size() * 2, cudaMemcpyDeviceToHost, stream.get()));
    if (topk_ids_out) {
      topk_ids_out->resize(size_t(P));
      dio.download(topk_ids_out->data(), size_t(P), stream.get());
    }
    if (topk_weights_out) {
      topk_weights_out->resize(size_t(P));
      dwo.download(topk_weights_out->data(), size_t(P), stream.get());
    }
    NVFP4_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
    report_errors();  // a synchronising call reports what the device recorded
    std::vector<float> y(yb.size());
    for (size_t i = 0; i < yb.size(); ++i) y[i] = bf16_to_float(Bf16{yb[i]});
    return y;
  }

  void sync_errors() override {
    DeviceGuard guard(opt_.device);
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
    report_errors();
  }

 private:
  // Host-side checks of a forward's tensors (spec 6); returns T.
  int64_t check_inputs(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out) const {
    NVFP4_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "x: dtype ", dtype_name(x.dtype),
                ", expected F32 or BF16");
    check_tensor(x, "x", x.dtype, DeviceKind::Cuda, {-1, H_});
    NVFP4_CHECK(x.device_index == opt_.device, "x: on cuda:", x.device_index, ", the Moe lives on cuda:", opt_.device);
    const int64_t T = x.shape[0];
    NVFP4_CHECK(T <= opt_.max_tokens, "x: T=", T, " tokens exceed the capacity max_tokens=", opt_.max_tokens,
                " of this cuda Moe");
    check_tensor(out.y, "y", DType::BF16, DeviceKind::Cuda, {T, H_});
    if (routing.topk_ids.ndim) {
      NVFP4_CHECK(routing.topk_ids.dtype == DType::I32 || routing.topk_ids.dtype == DType::I64, "topk_ids: dtype ",
                  dtype_name(routing.topk_ids.dtype), ", expected I32 or I64");
      check_tensor(routing.topk_ids, "topk_ids", routing.topk_ids.dtype, DeviceKind::Cuda, {T, k_});
      NVFP4_CHECK(routing.topk_weights.ndim, "topk_weights: required with topk_ids");
      check_tensor(routing.topk_weights, "topk_weights", DType::F32, DeviceKind::Cuda, {T, k_});
    } else {
      NVFP4_CHECK(routing.topk_weights.ndim == 0, "topk_weights given without topk_ids");
      if (cfg_.hash_routed) {
        NVFP4_CHECK(routing.token_ids.ndim, "token_ids: required by a hash-routed layer when no topk_ids are given");
        NVFP4_CHECK(routing.token_ids.dtype == DType::I32 || routing.token_ids.dtype == DType::I64,
                    "token_ids: dtype ", dtype_name(routing.token_ids.dtype), ", expected I32 or I64");
        check_tensor(routing.token_ids, "token_ids", routing.token_ids.dtype, DeviceKind::Cuda, {T});
      }
    }
    if (out.topk_ids.ndim) check_tensor(out.topk_ids, "out topk_ids", DType::I32, DeviceKind::Cuda, {T, k_});
    if (out.topk_weights.ndim) check_tensor(out.topk_weights, "out topk_weights", DType::F32, DeviceKind::Cuda, {T, k_});
    return T;
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
      NVFP4_FAIL("cuda forward: token id ", int64_t(int32_t(w[3])), " of token ", w[1], " outside [0, vocab=", vocab_,
                 ") of tid2eid; its slots were skipped");
    NVFP4_FAIL("cuda forward: device error word 0x", std::hex, w[0]);
  }

  MoeConfig cfg_;
  MoeOptions opt_;
  int64_t H_ = 0, I_ = 0, Is_ = 0, local_ = 0, first_ = 0, vocab_ = 0;
  int k_ = 0;
  PackedGeometry geo1_, geo2_;
  int64_t kp1_ = 0, kp2_ = 0, max_tiles_ = 0;
  float static_l1_g_ = 1.0f;

  DeviceBuffer<uint8_t> w13_, w2_;  // tile layout, only where the fragment layout does not fit
  FragmentWeightsDevice mma1_, mma2_;    // fragment layout, empty when it does not fit
  DeviceBuffer<float> w13_g_, w2_g_, w2_in_;
  DeviceBuffer<float> gate_t_, bias_;
  DeviceBuffer<int32_t> tid2eid_;
  DeviceBuffer<bf16> ws13_, ws2_;

  DeviceBuffer<int32_t> ids_, ids32_, offsets_, pair_of_pos_, pos_of_pair_, expert_of_pos_, num_tiles_;
  DeviceBuffer<float> wts_, gx_, h_, gh_, y_pair_, gu_, ys_;
  DeviceBuffer<GemmTile> tiles_;
  DeviceBuffer<bf16> xq_, hq_, xb_, hs_;
  DeviceBuffer<uint32_t> err_;
  DeviceBuffer<uint8_t> cublas_ws_;         // declared first: outlives the handle using it
  std::unique_ptr<CublasHandle> cublas_;
};

}  // namespace

std::unique_ptr<MoeBackendImpl> make_cuda_backend(MoeWeights weights, const MoeOptions& options) {
  return std::make_unique<CudaMoeBackend>(std::move(weights), options);
}

}  // namespace nvfp4moe
