// Synthetic DeepSeek-V4-structured MoE layers (moe.hpp): deterministic
// weights from (seed, tensor, expert, row), quantized to NVFP4 per tensor.
//
// The generator is counter-based (synthetic_stream.hpp): any expert or row
// can be regenerated alone, rows are generated in parallel, the result does
// not depend on the thread count, and make_synthetic_moe_cuda draws the same
// values on a GPU.
#include <cmath>
#include <cstring>

#include "common/parallel.hpp"
#include "moe/synthetic_layer.hpp"
#include "moe/synthetic_stream.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

namespace {

// One row's stream, drawn in order (synthetic_stream.hpp).
struct RowStream {
  uint64_t key;
  int64_t drawn = 0;
  RowStream(uint64_t seed, uint64_t tag, int64_t expert, int64_t row) : key(synthetic_row_key(seed, tag, expert, row)) {}
  uint64_t next() { return synthetic_draw(key, drawn++); }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
};

// Rows [0, rows) of a tensor ~N(0, stddev^2) with their outliers.
void fill_rows(float* out, int64_t rows, int64_t cols, float stddev, uint64_t seed, uint64_t tag,
               int64_t expert) {
  parallel_for(rows, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, cols)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r) {
                   const uint64_t key = synthetic_row_key(seed, tag, expert, r);
                   float* o = out + r * cols;
                   for (int64_t c = 0; c < cols; ++c) o[c] = synthetic_value(key, c, cols, stddev);
                 }
               });
}

std::vector<Bf16> to_bf16(const std::vector<float>& v) {
  std::vector<Bf16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_from_float(v[i]);
  return b;
}

// Appends a quantized matrix's bytes to an expert tensor at expert e.
void put(const Nvfp4Matrix& m, std::vector<uint8_t>& codes, std::vector<uint8_t>& scales, int64_t code_at,
         int64_t scale_at) {
  std::memcpy(codes.data() + code_at, m.codes.data(), m.codes.size());
  std::memcpy(scales.data() + scale_at, m.scales.data(), m.scales.size());
}

}  // namespace

SyntheticExpertDense synthetic_expert_dense(const MoeConfig& cfg, uint64_t seed, int64_t e) {
  const int64_t H = cfg.hidden, I = cfg.intermediate;
  NVFP4_CHECK(e >= 0 && e < cfg.experts, "synthetic_expert_dense: expert ", e, " outside [0, ", cfg.experts, ")");
  SyntheticExpertDense d;
  d.w1.resize(size_t(I * H));
  d.w3.resize(size_t(I * H));
  d.w2.resize(size_t(H * I));
  fill_rows(d.w1.data(), I, H, 1.0f / std::sqrt(float(H)), seed, kSynW1, e);
  fill_rows(d.w3.data(), I, H, 1.0f / std::sqrt(float(H)), seed, kSynW3, e);
  fill_rows(d.w2.data(), H, I, 1.0f / std::sqrt(float(I)), seed, kSynW2, e);
  return d;
}

std::vector<float> synthetic_hidden_states(const MoeConfig& cfg, uint64_t seed, int64_t tokens) {
  std::vector<float> x(static_cast<size_t>(tokens * cfg.hidden));
  fill_rows(x.data(), tokens, cfg.hidden, 1.0f, seed, kSynInput, 0);
  return x;
}

// Router: gate ~N(0, 1/H), bias uniform in [-0.05, 0.05); on a hash-routed
// layer k distinct experts per token id (rejection of repeats; k <= E).
static RouterWeights synthetic_router(const MoeConfig& cfg, uint64_t seed) {
  const int64_t H = cfg.hidden, E = cfg.experts, k = cfg.top_k;
  RouterWeights r;
  r.gate.resize(size_t(E * H));
  fill_rows(r.gate.data(), E, H, 1.0f / std::sqrt(float(H)), seed, kSynGate, 0);
  r.bias.resize(size_t(E));
  RowStream bias(seed, kSynBias, 0, 0);
  for (auto& b : r.bias) b = 0.1f * bias.uniform() - 0.05f;
  if (!cfg.hash_routed) return r;
  r.vocab = kSyntheticVocab;
  r.tid2eid.resize(size_t(kSyntheticVocab * k));
  for (int64_t v = 0; v < kSyntheticVocab; ++v) {
    RowStream rs(seed, kSynTid2eid, 0, v);
    int32_t* row = r.tid2eid.data() + v * k;
    for (int64_t j = 0; j < k;) {
      const int32_t id = int32_t(rs.next() % uint64_t(E));
      bool seen = false;
      for (int64_t i = 0; i < j; ++i) seen |= row[i] == id;
      if (!seen) row[j++] = id;
    }
  }
  return r;
}

// Shared expert: unquantized BF16, ~N(0, 1/fan_in).
static SharedExpertWeights synthetic_shared_expert(const MoeConfig& cfg, uint64_t seed) {
  const int64_t H = cfg.hidden, Is = cfg.shared_inter();
  SharedExpertWeights sh;
  std::vector<float> t(static_cast<size_t>(Is * H));
  fill_rows(t.data(), Is, H, 1.0f / std::sqrt(float(H)), seed, kSynSharedW1, 0);
  sh.w1 = to_bf16(t);
  fill_rows(t.data(), Is, H, 1.0f / std::sqrt(float(H)), seed, kSynSharedW3, 0);
  sh.w3 = to_bf16(t);
  fill_rows(t.data(), H, Is, 1.0f / std::sqrt(float(Is)), seed, kSynSharedW2, 0);
  sh.w2 = to_bf16(t);
  return sh;
}

MoeWeights synthetic_layer_shell(const MoeConfig& cfg, uint64_t seed) {
  cfg.validate();
  const int64_t H = cfg.hidden, I = cfg.intermediate, E = cfg.experts;
  MoeWeights w;
  w.config = cfg;
  ExpertWeights& x = w.experts;
  x.count = E;
  x.first_expert = 0;
  x.hidden = H;
  x.intermediate = I;
  x.w13_codes.resize(size_t(E * 2 * I * H / 2));
  x.w13_scales.resize(size_t(E * 2 * I * H / 16));
  x.w13_global.resize(size_t(E * 2));
  x.w2_codes.resize(size_t(E * H * I / 2));
  x.w2_scales.resize(size_t(E * H * I / 16));
  x.w2_global.resize(size_t(E));
  x.w13_input_scale.resize(size_t(E));
  x.w2_input_scale.resize(size_t(E));
  for (int64_t e = 0; e < E; ++e) {
    // Static input scales as a calibration would set them (amax ~6 for x,
    // ~10 for h), varying a little per expert so that "max over experts"
    // is a real choice.
    RowStream rs(seed, kSynScales, e, 0);
    x.w13_input_scale[size_t(e)] = global_scale_for_amax(6.0f * (1.0f + 0.1f * rs.uniform()));
    x.w2_input_scale[size_t(e)] = global_scale_for_amax(10.0f * (1.0f + 0.1f * rs.uniform()));
  }
  w.router = synthetic_router(cfg, seed);
  if (cfg.shared_experts > 0) w.shared = synthetic_shared_expert(cfg, seed);
  return w;
}

MoeWeights make_synthetic_moe(const MoeConfig& cfg, uint64_t seed, SyntheticDense* dense) {
  MoeWeights w = synthetic_layer_shell(cfg, seed);
  const int64_t H = cfg.hidden, I = cfg.intermediate, E = cfg.experts;
  ExpertWeights& x = w.experts;
  if (dense) {
    dense->w1.resize(size_t(E * I * H));
    dense->w3.resize(size_t(E * I * H));
    dense->w2.resize(size_t(E * H * I));
  }
  // One expert at a time (rows and quantization run in parallel inside), so at
  // most one expert's FP32 weights exist at once.
  for (int64_t e = 0; e < E; ++e) {
    const SyntheticExpertDense d = synthetic_expert_dense(cfg, seed, e);
    const Nvfp4Matrix q1 = quantize_matrix(d.w1.data(), I, H, ScaleScope::PerTensor, 1.0f, true, "gate_proj");
    const Nvfp4Matrix q3 = quantize_matrix(d.w3.data(), I, H, ScaleScope::PerTensor, 1.0f, true, "up_proj");
    const Nvfp4Matrix q2 = quantize_matrix(d.w2.data(), H, I, ScaleScope::PerTensor, 1.0f, true, "down_proj");
    put(q1, x.w13_codes, x.w13_scales, e * 2 * I * H / 2, e * 2 * I * H / 16);
    put(q3, x.w13_codes, x.w13_scales, (e * 2 * I + I) * H / 2, (e * 2 * I + I) * H / 16);
    put(q2, x.w2_codes, x.w2_scales, e * H * I / 2, e * H * I / 16);
    x.w13_global[size_t(2 * e)] = q1.global_scale[0];
    x.w13_global[size_t(2 * e + 1)] = q3.global_scale[0];
    x.w2_global[size_t(e)] = q2.global_scale[0];
    if (dense) {
      std::copy(d.w1.begin(), d.w1.end(), dense->w1.begin() + e * I * H);
      std::copy(d.w3.begin(), d.w3.end(), dense->w3.begin() + e * I * H);
      std::copy(d.w2.begin(), d.w2.end(), dense->w2.begin() + e * H * I);
    }
  }
  return w;
}

#ifndef NVFP4MOE_HAS_CUDA
MoeWeights make_synthetic_moe_cuda(const MoeConfig&, uint64_t) {
  NVFP4_FAIL("make_synthetic_moe_cuda: this build of nvfp4moe has no CUDA backend (nvcc was not found at "
             "configure time)");
}
#endif

}  // namespace nvfp4moe
