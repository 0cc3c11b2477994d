// DeviceSharedExpert (see device_shared_expert.hpp).
#include "cuda/backend/device_shared_expert.hpp"

#include <algorithm>

#include "cuda/kernels/ref/shared_expert_ref.hpp"
#include "cuda/kernels/shared_expert.hpp"
#include "cuda/kernels/shared_expert_fp8.hpp"
#include "cuda/layout/fp8_fragment_layout.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

// Uploads the bit patterns of a and then b as one buffer (no conversion).
template <typename D, typename H>
DeviceBuffer<D> upload(const std::vector<H>& a, const std::vector<H>& b = {}) {
  static_assert(sizeof(D) == sizeof(H));
  DeviceBuffer<D> d(a.size() + b.size());
  if (!a.empty()) NVFP4_CUDA_CHECK(cudaMemcpy(d.get(), a.data(), a.size() * sizeof(H), cudaMemcpyHostToDevice));
  if (!b.empty())
    NVFP4_CUDA_CHECK(cudaMemcpy(d.get() + a.size(), b.data(), b.size() * sizeof(H), cudaMemcpyHostToDevice));
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
  w.validate(hidden_, inter_);
  format_ = w.format;
  if (format_ == SharedExpertFormat::Fp8Block) {
    // The FP8 bytes in the kernels' fragment order (half the bytes of BF16
    // to stream per forward); the kernels turn them into BF16 in registers.
    std::vector<uint8_t> w13 = w.w1_fp8;
    w13.insert(w13.end(), w.w3_fp8.begin(), w.w3_fp8.end());
    w13_fp8_ = upload<uint8_t>(fp8_fragments(w13, gate_up_fragments()));
    w2_fp8_ = upload<uint8_t>(fp8_fragments(w.w2_fp8, down_fragments()));
    w13_scale_ = upload<float>(fp8_group_scales(w.w1_scale, inter_, hidden_), fp8_group_scales(w.w3_scale, inter_, hidden_));
    w2_scale_ = upload<float>(fp8_group_scales(w.w2_scale, hidden_, inter_));
    partial_ = DeviceBuffer<float>(size_t(kFp8MaxSplitRows) * 64 * size_t(std::max(2 * inter_, hidden_)));
    counters_ = DeviceBuffer<int32_t>(size_t(shared_fp8_counters(hidden_, inter_)));
    NVFP4_CUDA_CHECK(cudaMemset(counters_.get(), 0, counters_.bytes()));
    sms_ = sm_count();
    gemv_shapes_ = shared_fp8_gemv_shapes(hidden_, inter_);
    const bool pow2 = fp8_scales_are_powers_of_two(w.w1_scale) && fp8_scales_are_powers_of_two(w.w3_scale) &&
                      fp8_scales_are_powers_of_two(w.w2_scale);
    fp8_fold_ = fp8_scales_are_powers_of_two(w.w1_scale, 7) && fp8_scales_are_powers_of_two(w.w3_scale, 7) &&
                fp8_scales_are_powers_of_two(w.w2_scale, 7);
    if (pow2 && max_tokens >= kFp8GemmMinTokens)
      fp8_chunk_ = DeviceBuffer<__nv_bfloat16>(size_t(std::min(kFp8GemmChunkRows, std::max(2 * inter_, hidden_))) *
                                               size_t(std::max(hidden_, inter_)));
  } else {
    w13_ = upload<__nv_bfloat16>(w.w1, w.w3);
    w2_ = upload<__nv_bfloat16>(w.w2);
  }
  cublas_ws_ = DeviceBuffer<uint8_t>(size_t(32) << 20);
  cublas_ = std::make_unique<CublasHandle>();
  NVFP4_CUBLAS_CHECK(cublasSetWorkspace(cublas_->get(), cublas_ws_.get(), cublas_ws_.bytes()));
  xb_ = DeviceBuffer<__nv_bfloat16>(size_t(max_tokens) * size_t(hidden_));
  h_ = DeviceBuffer<__nv_bfloat16>(size_t(max_tokens) * size_t(inter_));
  gate_up_ = DeviceBuffer<float>(size_t(max_tokens) * 2 * size_t(inter_));
  if (format_ == SharedExpertFormat::Fp8Block && fp8_fold_ && hidden_ % 64 == 0 && inter_ % 64 == 0) {
    x_perm_ = DeviceBuffer<__nv_bfloat16>(size_t(max_tokens) * size_t(hidden_));
    wgmma_maps_ = std::make_unique<Fp8WgmmaMaps>(make_fp8_wgmma_maps(x_perm_.get(), h_.get(), max_tokens, hidden_, inter_));
  }
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
  if (format_ == SharedExpertFormat::Fp8Block) {
    if (!aligned_to(xb, 16)) {  // the kernels read x 16 bytes at a time: an aligned copy
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(xb_.get(), xb, size_t(tokens * hidden_) * 2, cudaMemcpyDeviceToDevice, stream));
      xb = xb_.get();
    }
    const SharedFp8Args a{.x = xb,
                          .tokens = tokens,
                          .hidden = hidden_,
                          .inter = inter_,
                          .w13 = w13_fp8_.get(),
                          .w13_scale = w13_scale_.get(),
                          .w2 = w2_fp8_.get(),
                          .w2_scale = w2_scale_.get(),
                          .has_limit = limit_.has_value(),
                          .limit = limit_.value_or(0.0f),
                          .h = h_.get(),
                          .out = out,
                          .partial = partial_.get(),
                          .counters = counters_.get(),
                          .sms = sms_,
                          .force_splits = fp8_choice_.splits,
                          .force_gemv_stages = fp8_choice_.gemv_stages,
                          .force_gemv_warps = fp8_choice_.gemv_warps,
                          .path = fp8_choice_.kernels,
                          .scales_fold = fp8_fold_,
                          .x_perm = x_perm_.get(),
                          .wgmma_maps = wgmma_maps_.get(),
                          .gemv_shapes = &gemv_shapes_};
    const bool gemm = fp8_choice_.dequant_gemm < 0 ? tokens >= kFp8GemmMinTokens : fp8_choice_.dequant_gemm > 0;
    if (gemm && fp8_dequant_gemm_available()) {
      run_fp8_dequant_gemm(xb, tokens, out, stream);
      return;
    }
    shared_expert_fp8(a, stream);
    return;
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

void DeviceSharedExpert::run_fp8_dequant_gemm(const __nv_bfloat16* x, int64_t tokens, float* out,
                                              cudaStream_t stream) {
  NVFP4_CUBLAS_CHECK(cublasSetStream(cublas_->get(), stream));
  // m-tiles [u0, u0 + n) dequantized, then their output columns: gate/up,
  // the chunk's gate rows and its up rows (two GEMMs); down, one.
  auto chunked = [&](const uint8_t* w, const Fp8FragmentGeometry& g, const float* scale, const __nv_bfloat16* a,
                     float* c) {
    const int64_t chunk = int64_t(fp8_chunk_.size()) / g.cols / 16, m_tiles = g.m_tiles(), ldc = g.rows;
    for (int64_t u0 = 0; u0 < m_tiles; u0 += chunk) {
      const int64_t n = std::min(chunk, m_tiles - u0), rows = fp8_chunk_rows(g, n);
      fp8_fragments_to_bf16(w, g, scale, u0, n, fp8_chunk_.get(), stream);
      if (g.pairs) {
        const int64_t half = rows / 2, inter = g.rows / 2;
        gemm_bf16_rowmajor_bt(cublas_->get(), a, fp8_chunk_.get(), c + 8 * u0, tokens, half, g.cols, ldc);
        gemm_bf16_rowmajor_bt(cublas_->get(), a, fp8_chunk_.get() + half * g.cols, c + inter + 8 * u0, tokens, half,
                              g.cols, ldc);
      } else {
        gemm_bf16_rowmajor_bt(cublas_->get(), a, fp8_chunk_.get(), c + 16 * u0, tokens, rows, g.cols, ldc);
      }
    }
  };
  chunked(w13_fp8_.get(), gate_up_fragments(), w13_scale_.get(), x, gate_up_.get());
  swiglu_to_bf16(gate_up_.get(), tokens, inter_, limit_.has_value(), limit_.value_or(0.0f), h_.get(), stream);
  chunked(w2_fp8_.get(), down_fragments(), w2_scale_.get(), h_.get(), out);
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
                              .w13_fp8 = w13_fp8_.get(),
                              .w13_scale = w13_scale_.get(),
                              .w2_fp8 = w2_fp8_.get(),
                              .w2_scale = w2_scale_.get(),
                              .w13_geometry = gate_up_fragments(),
                              .w2_geometry = down_fragments(),
                              .has_limit = limit_.has_value(),
                              .limit = limit_.value_or(0.0f),
                              .h = gate_up_.get(),
                              .out = out};
  shared_expert_ref(a, stream);
}

}  // namespace nvfp4moe::cuda
