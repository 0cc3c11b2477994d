// Random NVFP4 weights as bytes (see random_weights.hpp).
#include "moe/random_weights.hpp"

#include <cmath>

#include "common/parallel.hpp"
#include "common/splitmix.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

struct SplitMix : SplitMix64 {
  float normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

uint64_t mix(uint64_t seed, uint64_t tensor, uint64_t chunk) {
  SplitMix m{seed ^ (tensor * 0x632be59bd9b4e019ull) ^ (chunk * 0x8cb92ba72f3d8dd7ull)};
  return m.next();
}

constexpr int64_t kChunk = 1 << 20;

// Fills n values with gen(rng) in parallel chunks, deterministic per chunk.
template <typename T, typename Gen>
void fill(std::vector<T>& v, int64_t n, uint64_t seed, uint64_t tensor, Gen gen) {
  v.resize(size_t(n));
  parallel_for((n + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      SplitMix rng{mix(seed, tensor, uint64_t(c))};
      const int64_t end = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) v[size_t(i)] = gen(rng);
    }
  });
}

// Code bytes: random bytes, filled 8 at a time.
void fill_codes(std::vector<uint8_t>& v, int64_t n, uint64_t seed, uint64_t tensor) {
  v.resize(size_t(n));
  parallel_for((n + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      SplitMix rng{mix(seed, tensor, uint64_t(c))};
      const int64_t end = std::min(n, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; i += 8) {
        uint64_t r = rng.next();
        for (int64_t j = i; j < std::min(end, i + 8); ++j, r >>= 8) v[size_t(j)] = uint8_t(r);
      }
    }
  });
}

// RMS of value(q) * s for uniform code bytes and scale bytes 0x30..0x38 (0.5..1).
constexpr double kWeightRms = 2.93 * 0.75;

}  // namespace

MoeWeights make_random_nvfp4_moe(const MoeConfig& cfg, uint64_t seed, int64_t first, int64_t count, int64_t vocab,
                                 SharedExpertFormat shared_format) {
  cfg.validate();
  if (count == 0) count = cfg.experts - first;
  NVFP4_CHECK(first >= 0 && count > 0 && first + count <= cfg.experts, "make_random_nvfp4_moe: experts [", first,
              ", ", first + count, ") outside [0, ", cfg.experts, ")");
  const int64_t H = cfg.hidden, I = cfg.intermediate, E = cfg.experts, k = cfg.top_k, n = count;
  MoeWeights w;
  w.config = cfg;
  ExpertWeights& ex = w.experts;
  ex.count = n;
  ex.first_expert = first;
  ex.hidden = H;
  ex.intermediate = I;
  auto scale_byte = [](SplitMix& r) { return uint8_t(0x30 + r.next() % 9); };
  fill_codes(ex.w13_codes, n * 2 * I * H / 2, seed, 1);
  fill(ex.w13_scales, n * 2 * I * H / 16, seed, 2, scale_byte);
  fill_codes(ex.w2_codes, n * H * I / 2, seed, 3);
  fill(ex.w2_scales, n * H * I / 16, seed, 4, scale_byte);
  const float g13 = float(1.0 / (kWeightRms * std::sqrt(double(H))));
  const float g2 = float(1.0 / (kWeightRms * std::sqrt(double(I))));
  fill(ex.w13_global, n * 2, seed, 5, [&](SplitMix& r) { return g13 * float(0.8 + 0.4 * r.uniform()); });
  fill(ex.w2_global, n, seed, 6, [&](SplitMix& r) { return g2 * float(0.8 + 0.4 * r.uniform()); });
  ex.w13_input_scale.assign(size_t(n), 8.0f / 2688.0f);
  ex.w2_input_scale.assign(size_t(n), 12.0f / 2688.0f);

  const float rs = float(1.0 / std::sqrt(double(H)));
  fill(w.router.gate, E * H, seed, 7, [&](SplitMix& r) { return r.normal() * rs; });
  fill(w.router.bias, E, seed, 8, [](SplitMix& r) { return float(r.uniform() * 0.1 - 0.05); });
  if (cfg.hash_routed) {
    w.router.vocab = vocab;
    w.router.tid2eid.resize(size_t(vocab * k));
    SplitMix r{mix(seed, 9, 0)};
    for (int64_t t = 0; t < vocab; ++t)
      for (int64_t j = 0; j < k; ++j) {
        int32_t e;
        bool dup;
        do {  // k distinct experts per token
          e = int32_t(r.next() % uint64_t(E));
          dup = false;
          for (int64_t i = 0; i < j; ++i) dup |= w.router.tid2eid[size_t(t * k + i)] == e;
        } while (dup);
        w.router.tid2eid[size_t(t * k + j)] = e;
      }
  }
  if (cfg.shared_experts && shared_format == SharedExpertFormat::Fp8Block) {
    w.shared = make_random_fp8_shared_expert(H, cfg.shared_inter(), seed);
  } else if (cfg.shared_experts) {
    const int64_t Is = cfg.shared_inter();
    const float r1 = float(1.0 / std::sqrt(double(H))), r2 = float(1.0 / std::sqrt(double(Is)));
    fill(w.shared.w1, Is * H, seed, 10, [&](SplitMix& r) { return bf16_from_float(r.normal() * r1); });
    fill(w.shared.w3, Is * H, seed, 11, [&](SplitMix& r) { return bf16_from_float(r.normal() * r1); });
    fill(w.shared.w2, H * Is, seed, 12, [&](SplitMix& r) { return bf16_from_float(r.normal() * r2); });
  }
  return w;
}

int fp8_shared_factor_exponent(int64_t k) { return -int(std::lround(std::log2(kE4m3ByteRms * std::sqrt(double(k))))); }

SharedExpertWeights make_random_fp8_shared_expert(int64_t hidden, int64_t shared_inter, uint64_t seed) {
  NVFP4_CHECK(hidden > 0 && shared_inter > 0, "make_random_fp8_shared_expert: H=", hidden, " Is=", shared_inter);
  const int64_t H = hidden, Is = shared_inter, t = SharedExpertWeights::kFp8Tile;
  auto e4m3 = [](SplitMix& r) {
    uint8_t b = uint8_t(r.next());
    while ((b & 0x7F) == 0x7F) b = uint8_t(r.next());
    return b;
  };
  // 2^-round(log2(kE4m3Rms sqrt(K))) times 2^-1, 1 or 2 per tile.
  auto factors = [&](std::vector<float>& v, int64_t rows, int64_t cols, uint64_t tensor) {
    const int base = fp8_shared_factor_exponent(cols);
    fill(v, ((rows + t - 1) / t) * ((cols + t - 1) / t), seed, tensor,
         [&](SplitMix& r) { return std::ldexp(1.0f, base + int(r.next() % 3) - 1); });
  };
  SharedExpertWeights s;
  s.format = SharedExpertFormat::Fp8Block;
  fill(s.w1_fp8, Is * H, seed, 13, e4m3);
  fill(s.w3_fp8, Is * H, seed, 14, e4m3);
  fill(s.w2_fp8, H * Is, seed, 15, e4m3);
  factors(s.w1_scale, Is, H, 16);
  factors(s.w3_scale, Is, H, 17);
  factors(s.w2_scale, H, Is, 18);
  s.validate(H, Is);
  return s;
}

}  // namespace nvfp4moe
