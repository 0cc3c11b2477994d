// The benchmarks' weight formats and random MXFP4 experts (see bench_weights.hpp).
#include "cli/bench_weights.hpp"

#include <algorithm>
#include <vector>

#include "common/parallel.hpp"
#include "common/splitmix.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

namespace {

constexpr int64_t kChunk = int64_t(1) << 20;  // bytes of one generator stream

// Fills `per_expert` bytes of each of `count` experts (tensor `tensor`) from
// streams keyed by (seed, tensor, global expert, chunk), 8 bytes a draw;
// byte(r) turns 8 random bits into the stored byte.
template <typename Byte>
void fill_experts(std::vector<uint8_t>& v, int64_t first, int64_t count, int64_t per_expert, uint64_t seed,
                  uint64_t tensor, Byte byte) {
  v.resize(size_t(count * per_expert));
  const int64_t chunks = (per_expert + kChunk - 1) / kChunk;
  parallel_for(count * chunks, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t e = w / chunks, c = w % chunks;
      SplitMix64 rng{splitmix64_mix(seed ^ (tensor * 0x632be59bd9b4e019ull)) ^
                     splitmix64_mix(uint64_t(first + e) * kSplitMixGamma + uint64_t(c))};
      uint8_t* out = v.data() + e * per_expert;
      const int64_t end = std::min(per_expert, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; i += 8) {
        uint64_t r = rng.next();
        for (int64_t j = i; j < std::min(end, i + 8); ++j, r >>= 8) out[j] = byte(uint32_t(r & 0xffu));
      }
    }
  });
}

}  // namespace

const char* format_option_name(ExpertFormat f) { return f == ExpertFormat::Mxfp4 ? "mxfp4" : "nvfp4"; }

ExpertFormat parse_format_option(const std::string& s) {
  if (s == "nvfp4") return ExpertFormat::Nvfp4;
  if (s == "mxfp4") return ExpertFormat::Mxfp4;
  NVFP4_FAIL("unknown expert format '", s, "': expected nvfp4 or mxfp4");
}

SharedExpertFormat parse_shared_format_option(const std::string& s) {
  if (s == "bf16") return SharedExpertFormat::Bf16;
  if (s == "fp8") return SharedExpertFormat::Fp8Block;
  NVFP4_FAIL("unknown shared expert format '", s, "': expected bf16 or fp8");
}

ExpertWeights make_random_mxfp4_experts(const MoeConfig& cfg, uint64_t seed, int64_t first, int64_t count) {
  NVFP4_CHECK(first >= 0 && count > 0 && first + count <= cfg.experts, "make_random_mxfp4_experts: experts [", first,
              ", ", first + count, ") outside [0, ", cfg.experts, ")");
  const int64_t H = cfg.hidden, I = cfg.intermediate, B = kMxfp4BlockSize;
  ExpertWeights ex;
  ex.format = ExpertFormat::Mxfp4;
  ex.count = count;
  ex.first_expert = first;
  ex.hidden = H;
  ex.intermediate = I;
  auto code = [](uint32_t r) { return uint8_t(r); };
  // (r * span) >> 8: each of the span bytes from 51 or 52 of the 256 values.
  constexpr uint32_t span = kRandomMxfp4ScaleHi - kRandomMxfp4ScaleLo + 1;
  auto scale = [](uint32_t r) { return uint8_t(kRandomMxfp4ScaleLo + ((r * span) >> 8)); };
  fill_experts(ex.w13_codes, first, count, 2 * I * H / 2, seed, 1, code);
  fill_experts(ex.w13_scales, first, count, 2 * I * H / B, seed, 2, scale);
  fill_experts(ex.w2_codes, first, count, H * I / 2, seed, 3, code);
  fill_experts(ex.w2_scales, first, count, H * I / B, seed, 4, scale);
  return ex;
}

}  // namespace nvfp4moe
