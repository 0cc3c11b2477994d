// MoeConfig and ExpertWeights validation, published geometries.
#include <cmath>

#include "format/nvfp4_validate.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

void MoeConfig::validate() const {
  NVFP4_CHECK(hidden > 0 && hidden % 16 == 0, "MoeConfig: hidden H must be a positive multiple of 16, got ", hidden);
  NVFP4_CHECK(intermediate > 0 && intermediate % 16 == 0,
              "MoeConfig: intermediate I must be a positive multiple of 16, got ", intermediate);
  NVFP4_CHECK(experts > 0, "MoeConfig: experts E must be > 0, got ", experts);
  NVFP4_CHECK(top_k >= 1 && top_k <= experts, "MoeConfig: top_k must be in [1, E=", experts, "], got ", top_k);
  NVFP4_CHECK(shared_experts == 0 || shared_experts == 1, "MoeConfig: shared_experts must be 0 or 1, got ",
              shared_experts);
  NVFP4_CHECK(shared_experts == 0 || (shared_inter() > 0 && shared_inter() % 16 == 0),
              "MoeConfig: shared intermediate must be a positive multiple of 16, got ", shared_inter());
  NVFP4_CHECK(std::isfinite(routed_scaling_factor), "MoeConfig: routed_scaling_factor must be finite, got ",
              routed_scaling_factor);
  NVFP4_CHECK(!swiglu_limit || (std::isfinite(*swiglu_limit) && *swiglu_limit > 0),
              "MoeConfig: swiglu_limit must be finite and > 0, got ", swiglu_limit.value_or(0));
  const bool any_static = l1_input == InputScaleMode::Static || l2_input == InputScaleMode::Static;
  NVFP4_CHECK(activation == ActivationMode::Nvfp4 || !any_static, "MoeConfig: static input scales are NVFP4 ",
              "global scales; activation mode ", activation_mode_name(activation), " takes none (l1_input ",
              l1_input == InputScaleMode::Static ? "static" : "dynamic", ", l2_input ",
              l2_input == InputScaleMode::Static ? "static" : "dynamic", ")");
}

const char* expert_format_name(ExpertFormat f) { return f == ExpertFormat::Mxfp4 ? "MXFP4" : "NVFP4"; }

const char* activation_mode_name(ActivationMode m) {
  switch (m) {
    case ActivationMode::Bf16: return "bf16";
    case ActivationMode::Fp8: return "fp8";
    case ActivationMode::Nvfp4: break;
  }
  return "nvfp4";
}

ActivationMode parse_activation_mode(const std::string& s) {
  if (s == "nvfp4") return ActivationMode::Nvfp4;
  if (s == "bf16") return ActivationMode::Bf16;
  if (s == "fp8") return ActivationMode::Fp8;
  NVFP4_FAIL("unknown activation mode '", s, "': expected nvfp4, bf16 or fp8");
}

MoeConfig dsv4_pro_config() {
  MoeConfig c;
  c.hidden = 7168;
  c.intermediate = 3072;
  c.experts = 384;
  c.top_k = 6;
  c.shared_experts = 1;
  c.routed_scaling_factor = 1.5f;
  c.swiglu_limit = 10.0f;
  return c;
}

MoeConfig dsv4_flash_config() {
  MoeConfig c = dsv4_pro_config();
  c.hidden = 4096;
  c.intermediate = 2048;
  c.experts = 256;
  return c;
}

MoeConfig small_demo_config() {
  MoeConfig c = dsv4_pro_config();
  c.hidden = 1024;
  c.intermediate = 512;
  c.experts = 32;
  return c;
}

void ExpertWeights::validate() const {
  const int64_t H = hidden, I = intermediate, n = count, B = scale_block();
  const bool mx = format == ExpertFormat::Mxfp4;
  NVFP4_CHECK(H % B == 0 && I % B == 0 && n >= 0, "ExpertWeights (", expert_format_name(format), "): H=", H,
              " I=", I, " must be multiples of the scale block ", B, ", count=", n);
  auto size_is = [&](size_t got, int64_t want, const char* name) {
    NVFP4_CHECK(int64_t(got) == want, "ExpertWeights (", expert_format_name(format), "): ", name, " has ", got,
                " elements, expected ", want, " (count=", n, " H=", H, " I=", I, ")");
  };
  size_is(w13_codes.size(), n * 2 * I * H / 2, "w13_codes");
  size_is(w13_scales.size(), n * 2 * I * H / B, "w13_scales");
  size_is(w13_global.size(), mx ? 0 : n * 2, "w13_global");
  size_is(w2_codes.size(), n * H * I / 2, "w2_codes");
  size_is(w2_scales.size(), n * H * I / B, "w2_scales");
  size_is(w2_global.size(), mx ? 0 : n, "w2_global");
  if (mx) {
    NVFP4_CHECK(w13_input_scale.empty() && w2_input_scale.empty(), "ExpertWeights (MXFP4): input scales are ",
                "NVFP4 global scales; MXFP4 experts carry none (w13_input_scale ", w13_input_scale.size(),
                ", w2_input_scale ", w2_input_scale.size(), " values)");
    for (int64_t e = 0; e < n; ++e) {
      const std::string who = "ExpertWeights (MXFP4): expert " + std::to_string(first_expert + e);
      check_mxfp4_scales(w13_scales.data() + e * 2 * I * H / B, 2 * I, H, (who + " w13_scales").c_str());
      check_mxfp4_scales(w2_scales.data() + e * H * I / B, H, I, (who + " w2_scales").c_str());
    }
  }
  if (!mx) {
    // Caller-supplied bytes get the checkpoint reader's rule (0x7F/0xFF NaN,
    // sign bit set): one linear pass over each array, the message built only
    // for the first bad byte.
    auto check_block_bytes = [&](const std::vector<uint8_t>& s, int64_t rows, int64_t blocks, const char* name) {
      const int64_t i = first_bad_block_scale(s.data(), int64_t(s.size()));
      if (i < 0) return;
      const int64_t per_expert = rows * blocks;
      NVFP4_FAIL("ExpertWeights (NVFP4): ", name, " of expert ", first_expert + i / per_expert, ": block scale byte 0x",
                 std::hex, int(s[size_t(i)]), std::dec, " at row ", i % per_expert / blocks, " block ", i % blocks,
                 " is ", block_scale_fault(s[size_t(i)]) == ScaleByteFault::NaN ? "NaN" : "negative",
                 " (UE4M3 block scales must be finite and >= 0)");
    };
    check_block_bytes(w13_scales, 2 * I, H / B, "w13_scales");
    check_block_bytes(w2_scales, H, I / B, "w2_scales");
  }
  if (!w13_input_scale.empty()) size_is(w13_input_scale.size(), n, "w13_input_scale");
  if (!w2_input_scale.empty()) size_is(w2_input_scale.size(), n, "w2_input_scale");
  auto check_scales = [&](const std::vector<float>& v, int per, const char* name) {
    for (size_t i = 0; i < v.size(); ++i)
      NVFP4_CHECK(std::isfinite(v[i]) && v[i] > 0, "ExpertWeights: ", name, " of expert ",
                  first_expert + int64_t(i) / per, " is ", v[i], " (must be finite and > 0)");
  };
  check_scales(w13_global, 2, "w13 weight_scale_2");
  check_scales(w2_global, 1, "w2 weight_scale_2");
  check_scales(w13_input_scale, 1, "w13 input_scale");
  check_scales(w2_input_scale, 1, "w2 input_scale");
}

ExpertWeights ExpertWeights::slice(int64_t first, int64_t n) const {
  NVFP4_CHECK(first >= 0 && n >= 0 && first + n <= count, "ExpertWeights::slice: [", first, ", ", first + n,
              ") outside [0, ", count, ")");
  const int64_t H = hidden, I = intermediate;
  ExpertWeights s;
  s.count = n;
  s.first_expert = first_expert + first;
  s.hidden = H;
  s.intermediate = I;
  auto cut = [&](const auto& v, int64_t per) {
    using V = std::decay_t<decltype(v)>;
    if (v.empty()) return V{};
    return V(v.begin() + first * per, v.begin() + (first + n) * per);
  };
  s.format = format;
  s.w13_codes = cut(w13_codes, 2 * I * H / 2);
  s.w13_scales = cut(w13_scales, 2 * I * H / scale_block());
  s.w13_global = cut(w13_global, 2);
  s.w2_codes = cut(w2_codes, H * I / 2);
  s.w2_scales = cut(w2_scales, H * I / scale_block());
  s.w2_global = cut(w2_global, 1);
  s.w13_input_scale = cut(w13_input_scale, 1);
  s.w2_input_scale = cut(w2_input_scale, 1);
  return s;
}

void SharedExpertWeights::validate(int64_t hidden, int64_t inter) const {
  const int64_t H = hidden, Is = inter, t = kFp8Tile;
  auto size_is = [&](size_t got, int64_t want, const char* name) {
    NVFP4_CHECK(int64_t(got) == want, "SharedExpertWeights (shared expert): ", name, "=", got, " elements, expected ",
                want, " (Is=", Is, " H=", H, ", format ", format == SharedExpertFormat::Bf16 ? "BF16" : "FP8", ")");
  };
  if (format == SharedExpertFormat::Bf16) {
    size_is(w1.size(), Is * H, "w1");
    size_is(w3.size(), Is * H, "w3");
    size_is(w2.size(), H * Is, "w2");
    return;
  }
  const int64_t ti = (Is + t - 1) / t, th = (H + t - 1) / t;
  size_is(w1_fp8.size(), Is * H, "w1_fp8");
  size_is(w3_fp8.size(), Is * H, "w3_fp8");
  size_is(w2_fp8.size(), H * Is, "w2_fp8");
  size_is(w1_scale.size(), ti * th, "w1_scale");
  size_is(w3_scale.size(), ti * th, "w3_scale");
  size_is(w2_scale.size(), th * ti, "w2_scale");
  // E4M3 (float8_e4m3fn) has no infinities; S.1111.111 is NaN.
  for (const auto* v : {&w1_fp8, &w3_fp8, &w2_fp8}) {
    const char* name = v == &w1_fp8 ? "w1_fp8" : v == &w3_fp8 ? "w3_fp8" : "w2_fp8";
    const int64_t cols = v == &w2_fp8 ? Is : H;
    for (size_t i = 0; i < v->size(); ++i)
      NVFP4_CHECK(((*v)[i] & 0x7Fu) != 0x7Fu, "SharedExpertWeights (shared expert): ", name, "[", int64_t(i) / cols,
                  ", ", int64_t(i) % cols, "] is the E4M3 NaN byte 0x", std::hex, int((*v)[i]));
  }
  for (const auto* v : {&w1_scale, &w3_scale, &w2_scale}) {
    const char* name = v == &w1_scale ? "w1_scale" : v == &w3_scale ? "w3_scale" : "w2_scale";
    const int64_t cols = v == &w2_scale ? ti : th;
    for (size_t i = 0; i < v->size(); ++i)
      NVFP4_CHECK(std::isfinite((*v)[i]) && (*v)[i] > 0, "SharedExpertWeights (shared expert): ", name,
                  " of tile (", int64_t(i) / cols, ", ", int64_t(i) % cols, ") is ", (*v)[i],
                  " (must be finite and > 0)");
  }
}

}  // namespace nvfp4moe
