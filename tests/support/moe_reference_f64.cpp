#include "support/moe_reference_f64.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "nvfp4moe/format.hpp"

namespace nvfp4moe::test {

namespace {

double softplus(double z) { return z > 20.0 ? z : std::log1p(std::exp(z)); }

double score(Scoring s, double l) {
  return s == Scoring::Sigmoid ? 1.0 / (1.0 + std::exp(-l)) : std::sqrt(softplus(l));
}

double silu(double z) { return z / (1.0 + std::exp(-z)); }

double swiglu(const MoeConfig& c, double gate, double up) {
  if (c.swiglu_limit) {
    const double L = *c.swiglu_limit;
    gate = std::min(gate, L);
    up = std::min(std::max(up, -L), L);
  }
  return silu(gate) * up;
}

// QDQ of one float row per docs/numerics.md §2: g (given, or amax/(6*448) of the
// row), the exact quantizer for the bytes, then x_hat = value(q) * s * g in double.
std::vector<double> qdq_f64(const std::vector<float>& row, const float* static_g, bool* near_boundary = nullptr) {
  const int64_t K = int64_t(row.size());
  float amax = 0.0f;
  for (float v : row) amax = std::max(amax, std::fabs(v));
  const float g = static_g ? *static_g : (amax == 0.0f ? 1.0f : amax / (6.0f * 448.0f));
  std::vector<uint8_t> codes(static_cast<size_t>(K / 2)), scales(static_cast<size_t>(K / 16));
  quantize_rows_ref(row.data(), 1, K, K, &g, 0, codes.data(), scales.data());
  std::vector<double> out(static_cast<size_t>(K));
  for (int64_t i = 0; i < K; ++i) {
    const uint8_t q = uint8_t((codes[size_t(i / 2)] >> ((i & 1) * 4)) & 15);
    out[size_t(i)] = double(e2m1_decode(q)) * double(e4m3_decode(scales[size_t(i / 16)])) * double(g);
  }
  if (near_boundary) {
    auto close = [](double v, double boundary) { return std::fabs(v - boundary) <= 1e-5 * std::fabs(boundary); };
    for (int64_t b = 0; b < K / 16; ++b) {
      double amax_b = 0;
      for (int i = 0; i < 16; ++i) amax_b = std::max(amax_b, double(std::fabs(row[size_t(b * 16 + i)])));
      const double v = amax_b / (6.0 * double(g));  // the block scale's quotient, docs/numerics.md §2
      const uint8_t s = scales[size_t(b)];
      // Midpoints to the neighbouring E4M3 values.
      for (int nb : {int(s) - 1, int(s) + 1})
        if (nb >= 0 && nb <= 0x7E)
          *near_boundary |= close(v, 0.5 * (double(e4m3_decode(s)) + double(e4m3_decode(uint8_t(nb)))));
      const double d = double(e4m3_decode(s)) * double(g);
      if (d == 0) continue;
      for (int i = 0; i < 16; ++i)
        for (double thr : {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0})
          *near_boundary |= close(std::fabs(double(row[size_t(b * 16 + i)])) / d, thr);
    }
  }
  return out;
}

// The other activation modes of docs/numerics.md §7, written out in double
// from their formulas: bf16 rounds each value to BF16; fp8 then takes blocks
// of 128 (the last one shorter), t = f32(max(amax, 1e-4) * f32(1/448)), the
// scale 2^ceil(log2 t) by ldexp, and e4m3(clamp(x / s, +-448)) x s.
std::vector<double> stage_f64(ActivationMode mode, const std::vector<float>& row, const float* static_g,
                              bool* near_boundary = nullptr) {
  if (mode == ActivationMode::Nvfp4) return qdq_f64(row, static_g, near_boundary);
  const int64_t K = int64_t(row.size());
  std::vector<float> b(row.size());
  for (size_t i = 0; i < row.size(); ++i) b[i] = bf16_to_float(bf16_from_float(row[i]));
  std::vector<double> out(b.begin(), b.end());
  if (mode == ActivationMode::Bf16) return out;
  for (int64_t b0 = 0; b0 < K; b0 += 128) {
    const int64_t n = std::min<int64_t>(128, K - b0);
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(b[size_t(b0 + i)]));
    const float t = std::max(amax, 1e-4f) * (1.0f / 448.0f);
    const double s = std::ldexp(1.0, int(std::ceil(std::log2(double(t)))));
    for (int64_t i = 0; i < n; ++i) {
      const double v = std::min(std::max(double(b[size_t(b0 + i)]) / s, -448.0), 448.0);
      out[size_t(b0 + i)] = double(e4m3_decode(e4m3_encode(float(v)))) * s;
    }
  }
  return out;
}

// One expert's weights dequantized in double: w1, w3 [I, H], w2 [H, I].
struct DenseExpert {
  std::vector<double> w1, w3, w2;
};

std::vector<double> dequant_f64(const uint8_t* codes, const uint8_t* scales, double g, int64_t rows,
                                int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols; ++i) {
      const uint8_t q = uint8_t((codes[r * cols / 2 + i / 2] >> ((i & 1) * 4)) & 15);
      out[size_t(r * cols + i)] = double(e2m1_decode(q)) * double(e4m3_decode(scales[r * cols / 16 + i / 16])) * g;
    }
  return out;
}

// MXFP4: value(q) x 2^(b - 127) by ldexp, blocks of 32.
std::vector<double> dequant_mxfp4_f64(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols; ++i) {
      const uint8_t q = uint8_t((codes[r * cols / 2 + i / 2] >> ((i & 1) * 4)) & 15);
      out[size_t(r * cols + i)] = double(e2m1_decode(q)) * std::ldexp(1.0, int(scales[r * cols / 32 + i / 32]) - 127);
    }
  return out;
}

DenseExpert dense_expert(const ExpertWeights& x, int64_t e) {
  const int64_t H = x.hidden, I = x.intermediate;
  DenseExpert d;
  if (x.format == ExpertFormat::Mxfp4) {
    d.w1 = dequant_mxfp4_f64(x.w13_codes.data() + e * 2 * I * H / 2, x.w13_scales.data() + e * 2 * I * H / 32, I, H);
    d.w3 = dequant_mxfp4_f64(x.w13_codes.data() + (e * 2 * I + I) * H / 2,
                             x.w13_scales.data() + (e * 2 * I + I) * H / 32, I, H);
    d.w2 = dequant_mxfp4_f64(x.w2_codes.data() + e * H * I / 2, x.w2_scales.data() + e * H * I / 32, H, I);
    return d;
  }
  d.w1 = dequant_f64(x.w13_codes.data() + e * 2 * I * H / 2, x.w13_scales.data() + e * 2 * I * H / 16,
                     x.w13_global[size_t(2 * e)], I, H);
  d.w3 = dequant_f64(x.w13_codes.data() + (e * 2 * I + I) * H / 2,
                     x.w13_scales.data() + (e * 2 * I + I) * H / 16, x.w13_global[size_t(2 * e + 1)], I, H);
  d.w2 = dequant_f64(x.w2_codes.data() + e * H * I / 2, x.w2_scales.data() + e * H * I / 16,
                     x.w2_global[size_t(e)], H, I);
  return d;
}

}  // namespace

RefRouting reference_router_f64(const MoeWeights& w, const std::vector<float>& x, int64_t T,
                                const std::vector<int32_t>* token_ids) {
  const MoeConfig& c = w.config;
  const int64_t H = c.hidden, E = c.experts, k = c.top_k;
  RefRouting r;
  r.ids.resize(size_t(T * k));
  r.weights.resize(size_t(T * k));
  r.keys.resize(size_t(T * E));
  r.scores.resize(size_t(T * E));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      double l = 0.0;
      for (int64_t i = 0; i < H; ++i) l += double(x[size_t(t * H + i)]) * double(w.router.gate[size_t(e * H + i)]);
      s[size_t(e)] = score(c.scoring, l);
    }
    if (c.scoring == Scoring::Softmax) {  // s currently holds sqrt-softplus; recompute as softmax of l
      std::vector<double> l(static_cast<size_t>(E));
      double m = -INFINITY, sum = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        double v = 0.0;
        for (int64_t i = 0; i < H; ++i) v += double(x[size_t(t * H + i)]) * double(w.router.gate[size_t(e * H + i)]);
        l[size_t(e)] = v;
        m = std::max(m, v);
      }
      for (int64_t e = 0; e < E; ++e) sum += std::exp(l[size_t(e)] - m);
      for (int64_t e = 0; e < E; ++e) s[size_t(e)] = std::exp(l[size_t(e)] - m) / sum;
    }
    std::vector<int32_t> sel(static_cast<size_t>(k));
    if (c.hash_routed) {
      for (int64_t j = 0; j < k; ++j) sel[size_t(j)] = w.router.tid2eid[size_t((*token_ids)[size_t(t)] * k + j)];
    } else {
      std::vector<int32_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      auto key = [&](int32_t e) { return s[size_t(e)] + (w.router.bias.empty() ? 0.0 : double(w.router.bias[size_t(e)])); };
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
      for (int64_t j = 0; j < k; ++j) sel[size_t(j)] = order[size_t(j)];
      for (int64_t e = 0; e < E; ++e) r.keys[size_t(t * E + e)] = key(int32_t(e));
    }
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += s[size_t(sel[size_t(j)])];
    for (int64_t j = 0; j < k; ++j) {
      r.ids[size_t(t * k + j)] = sel[size_t(j)];
      const double sj = s[size_t(sel[size_t(j)])];
      r.weights[size_t(t * k + j)] = double(c.routed_scaling_factor) * (c.norm_topk_prob ? sj / sum : sj);
    }
    for (int64_t e = 0; e < E; ++e) r.scores[size_t(t * E + e)] = s[size_t(e)];
  }
  return r;
}

std::vector<double> shared_weights_f64(const SharedExpertWeights& s, int which, int64_t rows, int64_t cols) {
  std::vector<double> w(size_t(rows * cols));
  if (s.format == SharedExpertFormat::Bf16) {
    const std::vector<Bf16>& b = which == 1 ? s.w1 : which == 3 ? s.w3 : s.w2;
    for (size_t i = 0; i < w.size(); ++i) w[i] = double(bf16_to_float(b[i]));
    return w;
  }
  // FP8 E4M3 value times its 128x128 tile's factor, the product formed in double.
  const std::vector<uint8_t>& q = which == 1 ? s.w1_fp8 : which == 3 ? s.w3_fp8 : s.w2_fp8;
  const std::vector<float>& sc = which == 1 ? s.w1_scale : which == 3 ? s.w3_scale : s.w2_scale;
  const int64_t t = SharedExpertWeights::kFp8Tile, tiles_c = (cols + t - 1) / t;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      w[size_t(r * cols + c)] =
          double(e4m3_decode(q[size_t(r * cols + c)])) * double(sc[size_t((r / t) * tiles_c + c / t)]);
  return w;
}

std::vector<double> reference_shared_f64(const MoeWeights& w, const std::vector<float>& x, int64_t T) {
  const MoeConfig& c = w.config;
  const int64_t H = c.hidden, Is = c.shared_inter();
  std::vector<double> y(size_t(T * H), 0.0);
  if (c.shared_experts == 0) return y;
  const std::vector<double> w1 = shared_weights_f64(w.shared, 1, Is, H);
  const std::vector<double> w3 = shared_weights_f64(w.shared, 3, Is, H);
  const std::vector<double> w2 = shared_weights_f64(w.shared, 2, H, Is);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> h(static_cast<size_t>(Is));
    for (int64_t n = 0; n < Is; ++n) {
      double g = 0.0, u = 0.0;
      for (int64_t i = 0; i < H; ++i) {
        g += w1[size_t(n * H + i)] * double(x[size_t(t * H + i)]);
        u += w3[size_t(n * H + i)] * double(x[size_t(t * H + i)]);
      }
      h[size_t(n)] = swiglu(c, g, u);
    }
    for (int64_t o = 0; o < H; ++o) {
      double acc = 0.0;
      for (int64_t n = 0; n < Is; ++n) acc += w2[size_t(o * Is + n)] * h[size_t(n)];
      y[size_t(t * H + o)] = acc;
    }
  }
  return y;
}

std::vector<double> reference_moe_f64(const MoeWeights& w, const std::vector<float>& x, int64_t T,
                                      const std::vector<int32_t>& ids, const std::vector<float>& weights,
                                      std::vector<uint8_t>* near_boundary) {
  const MoeConfig& c = w.config;
  const ExpertWeights& ex = w.experts;
  const int64_t H = c.hidden, I = c.intermediate, k = c.top_k;
  std::vector<double> y = reference_shared_f64(w, x, T);
  // Static L1 scale: the max over all experts of w13 input_scale.
  float l1_static = 0.0f;
  for (float v : ex.w13_input_scale) l1_static = std::max(l1_static, v);
  std::map<int64_t, DenseExpert> cache;
  if (near_boundary) near_boundary->assign(size_t(T), 0);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> xt(x.begin() + t * H, x.begin() + (t + 1) * H);
    const std::vector<double> a =
        stage_f64(c.activation, xt, c.l1_input == InputScaleMode::Static ? &l1_static : nullptr);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[size_t(t * k + j)];
      if (e < 0) continue;
      auto it = cache.find(e);
      if (it == cache.end()) it = cache.emplace(e, dense_expert(ex, e)).first;
      const DenseExpert& d = it->second;
      std::vector<float> h(static_cast<size_t>(I));
      for (int64_t n = 0; n < I; ++n) {
        double g = 0.0, u = 0.0;
        for (int64_t i = 0; i < H; ++i) {
          g += a[size_t(i)] * d.w1[size_t(n * H + i)];
          u += a[size_t(i)] * d.w3[size_t(n * H + i)];
        }
        h[size_t(n)] = float(swiglu(c, g, u));
      }
      const float* l2_static = c.l2_input == InputScaleMode::Static ? &ex.w2_input_scale[size_t(e)] : nullptr;
      bool near = false;
      const std::vector<double> hq = stage_f64(c.activation, h, l2_static, near_boundary ? &near : nullptr);
      if (near) (*near_boundary)[size_t(t)] = 1;
      const double wj = double(weights[size_t(t * k + j)]);
      for (int64_t o = 0; o < H; ++o) {
        double acc = 0.0;
        for (int64_t n = 0; n < I; ++n) acc += hq[size_t(n)] * d.w2[size_t(o * I + n)];
        y[size_t(t * H + o)] += wj * acc;
      }
    }
  }
  return y;
}

}  // namespace nvfp4moe::test
