// DeviceSharedExpert (see device_shared_expert.hpp).
#include "cuda/backend/device_shared_expert.hpp"

#include "cuda/kernels/ref/shared_expert_ref.hpp"
#include "cuda/kernels/shared_expert.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

// Uploads the bit patterns of a and then b as one buffer (no conversion).
DeviceBuffer<__nv_bfloat16> upload_bf16(const std::vector<Bf16>& a, const std::vector<Bf16>& b = {}) {
  DeviceBuffer<__nv_bfloat16> d(a.size() + b.size());
  if (!a.empty()) NVFP4_CUDA_CHECK(cudaMemcpy(d.get(), a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  if (!b.empty()) NVFP4_CUDA_CHECK(cudaMemcpy(d.get() + a.size(), b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  return d;
}

}  // namespace

DeviceSharedExpert::DeviceSharedExpert(const SharedExpertWeights& w, const MoeConfig& cfg, int64_t max_tokens)
    : hidden_(cfg.hidden),
      inter_(cfg.shared_experts ? cfg.shared_inter() : 0),
      max_tokens_(max_tokens),
      limit_(cfg.swiglu_limit) {
  if (!inter_) return;
  NVFP4_CHECK(max_tokens >= 1, "shared expert: max_tokens must be >= 1, got ", max_tokens);
  const size_t n = size_t(inter_) * size_t(hidden_);
  NVFP4_CHECK(w.w1.size() == n && w.w3.size() == n && w.w2.size() == n, "shared expert: weights have ", w.w1.size(),
              "/", w.w3.size(), "/", w.w2.size(), " elements (w1/w3/w2), expected Is*H = ", inter_, "*", hidden_,
              " = ", n, " each");
  w13_ = upload_bf16(w.w1, w.w3);
  w2_ = upload_bf16(w.w2);
  cublas_ws_ = DeviceBuffer<uint8_t>(size_t(32) << 20);
  cublas_ = std::make_unique<CublasHandle>();
  NVFP4_CUBLAS_CHECK(cublasSetWorkspace(cublas_->get(), cublas_ws_.get(), cublas_ws_.bytes()));
  xb_ = DeviceBuffer<__nv_bfloat16>(size_t(max_tokens) * size_t(hidden_));
  h_ = DeviceBuffer<__nv_bfloat16>(size_t(max_tokens) * size_t(inter_));
  gate_up_ = DeviceBuffer<float>(size_t(max_tokens) * 2 * size_t(inter_));
  shared_expert_ref_prepare(hidden_, inter_);
}

void DeviceSharedExpert::check_tokens(int64_t tokens) const {
  NVFP4_CHECK(tokens >= 0 && tokens <= max_tokens_, "shared expert: ", tokens, " tokens, above the capacity of ",
              max_tokens_);
}

void DeviceSharedExpert::run(const void* x, bool x_is_bf16, int64_t tokens, float* out, cudaStream_t stream) {
  if (!inter_ || tokens == 0) return;
  check_tokens(tokens);
  const __nv_bfloat16* xb = static_cast<const __nv_bfloat16*>(x);
  if (!x_is_bf16) {
    f32_to_bf16(static_cast<const float*>(x), tokens * hidden_, xb_.get(), stream);
    xb = xb_.get();
  }
  const SharedExpertArgs a{.x = xb,
                           .tokens = tokens,
                           .hidden = hidden_,
                           .inter = inter_,
                           .w13 = w13_.get(),
                           .w2 = w2_.get(),
                           .has_limit = limit_.has_value(),
                           .limit = limit_.value_or(0.0f),
                           .gate_up = gate_up_.get(),
                           .h = h_.get(),
                           .out = out};
  shared_expert_forward(cublas_->get(), a, stream);
}

void DeviceSharedExpert::run_ref(const void* x, bool x_is_bf16, int64_t tokens, float* out, cudaStream_t stream) {
  if (!inter_ || tokens == 0) return;
  check_tokens(tokens);
  const SharedExpertRefArgs a{.x = x,
                              .x_is_bf16 = x_is_bf16,
                              .tokens = tokens,
                              .hidden = hidden_,
                              .inter = inter_,
                              .w13 = w13_.get(),
                              .w2 = w2_.get(),
                              .has_limit = limit_.has_value(),
                              .limit = limit_.value_or(0.0f),
                              .h = gate_up_.get(),
                              .out = out};
  shared_expert_ref(a, stream);
}

}  // namespace nvfp4moe::cuda
