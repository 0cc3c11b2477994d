#include "checkpoint/shared_expert_io.hpp"

#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "checkpoint/dtypes.hpp"
#include "checkpoint/weight_format.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

namespace {

constexpr int64_t kTile = SharedExpertWeights::kFp8Tile;
constexpr int64_t kV41Block = 32;  // DeepSeek-V4.1's FP8 blocks

int64_t blocks(int64_t n, int64_t block) { return (n + block - 1) / block; }
int64_t tiles(int64_t n) { return blocks(n, kTile); }

void expect_shape(const TensorInfo& t, const std::vector<int64_t>& shape) {
  NVFP4_CHECK(t.shape == shape, "tensor \"", t.name, "\": shape ", shape_text(t.shape), ", expected ",
              shape_text(shape));
}

std::vector<Bf16> read_bf16(const TensorInfo& t) {
  std::vector<Bf16> out(size_t(t.numel()));
  if (t.dtype == DType::BF16) {
    std::memcpy(out.data(), t.data, t.nbytes);
  } else {
    const std::vector<float> f = t.to_f32();
    for (size_t i = 0; i < f.size(); ++i) out[i] = bf16_from_float(f[i]);
  }
  check_finite(out.data(), int64_t(out.size()), t.name.c_str());
  return out;
}

// E4M3 weight bytes [N, K]; 0x7F / 0xFF (NaN) is an error naming the element.
std::vector<uint8_t> read_fp8_weight(const TensorInfo& t, int64_t N, int64_t K) {
  NVFP4_CHECK(t.dtype == DType::F8E4M3, "tensor \"", t.name, "\": dtype ", dtype_name(t.dtype),
              ", expected F8_E4M3");
  expect_shape(t, {N, K});
  for (uint64_t i = 0; i < t.nbytes; ++i)
    NVFP4_CHECK((t.data[i] & 0x7F) != 0x7F, "tensor \"", t.name, "\": weight byte ", i, " (row ", int64_t(i) / K,
                ", column ", int64_t(i) % K, ") is NaN (0x", std::hex, int(t.data[i]), std::dec, ")");
  return std::vector<uint8_t>(t.data, t.data + t.nbytes);
}

}  // namespace

// The block factors of "<prefix>.weight" [N, K]: `scale` or
// `weight_scale_inv`, F8_E8M0 (2^(b - 127)) or F32, one per 128 x 128 block
// (DeepSeek-V4) or 32 x 32 block (DeepSeek-V4.1), told by the shape.
Fp8BlockScales read_block_scales(const ModelDir& dir, const std::string& prefix, int64_t N, int64_t K) {
  const bool scale = dir.has(prefix + ".scale"), inv = dir.has(prefix + ".weight_scale_inv");
  NVFP4_CHECK(scale || inv, dir.path(), ": missing tensor \"", prefix, ".scale\" (or \"", prefix,
              ".weight_scale_inv\"): the FP8 weight \"", prefix, ".weight\" needs its 128x128 tile scales (or "
              "DeepSeek-V4.1's 32x32 ones)");
  NVFP4_CHECK(!(scale && inv), "tensors \"", prefix, ".scale\" and \"", prefix,
              ".weight_scale_inv\" both given for one weight");
  const TensorInfo& t = dir.get(prefix + (scale ? ".scale" : ".weight_scale_inv"));
  NVFP4_CHECK(t.dtype == DType::F8E8M0 || t.dtype == DType::F32, "tensor \"", t.name, "\": dtype ",
              dtype_name(t.dtype), ", expected F8_E8M0 or F32 (one factor per 128x128 or 32x32 tile)");
  Fp8BlockScales out;
  const std::vector<int64_t> v4 = {blocks(N, kTile), blocks(K, kTile)};
  const std::vector<int64_t> v41 = {blocks(N, kV41Block), blocks(K, kV41Block)};
  NVFP4_CHECK(t.shape == v4 || t.shape == v41, "tensor \"", t.name, "\": shape ", shape_text(t.shape), ", expected ",
              shape_text(v4), " (128x128 tiles) or ", shape_text(v41), " (32x32 tiles) for the weight [", N, ", ",
              K, "]");
  out.block = t.shape == v4 ? kTile : kV41Block;  // both (N, K <= 32): one block either way
  out.factors = t.to_f32();
  const int64_t cols = t.shape[1];
  for (size_t i = 0; i < out.factors.size(); ++i) {
    if (t.dtype == DType::F8E8M0)
      NVFP4_CHECK(t.data[i] != 0xFF, "tensor \"", t.name, "\": scale byte ", i, " (tile ", int64_t(i) / cols, ", ",
                  int64_t(i) % cols, ") is NaN (0xff)");
    NVFP4_CHECK(std::isfinite(out.factors[i]) && out.factors[i] > 0, "tensor \"", t.name, "\": scale of tile (",
                int64_t(i) / cols, ", ", int64_t(i) % cols, ") is ", out.factors[i], " (must be finite and > 0)");
  }
  return out;
}

namespace {

// e4m3(q[n, k]) * factor of its block as BF16 [N, K]: exact (a BF16 holds
// every E4M3 value times a power of two within its range, and F32 factors
// are checked), else an error naming the element.
std::vector<Bf16> dequantize_fp8_blocks(const TensorInfo& w, const std::vector<uint8_t>& q, const Fp8BlockScales& s,
                                        int64_t N, int64_t K) {
  std::vector<Bf16> out(size_t(N * K));
  const int64_t cols = blocks(K, s.block);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const float v = fmt::e4m3_value(q[size_t(n * K + k)]) * s.factors[size_t((n / s.block) * cols + k / s.block)];
      const Bf16 b = bf16_from_float(v);
      NVFP4_CHECK(std::isfinite(v) && bf16_to_float(b) == v, "tensor \"", w.name, "\": element (", n, ", ", k,
                  ") times its block scale is ", v, ", not exact in BF16");
      out[size_t(n * K + k)] = b;
    }
  return out;
}

}  // namespace

void load_shared_expert(const ModelDir& dir, const MoeNames& names, MoeConfig& cfg, SharedExpertWeights& out) {
  const int64_t H = cfg.hidden;
  const TensorInfo& g = dir.get(names.shared(Proj::Gate) + ".weight");
  NVFP4_CHECK(g.shape.size() == 2 && g.shape[1] == H, "tensor \"", g.name, "\": shape ", shape_text(g.shape),
              ", expected [Is, H=", H, "]");
  const int64_t Is = g.shape[0];
  WeightFormat f[3];
  for (Proj p : kProjs) {
    const std::string prefix = names.shared(p);
    f[int(p)] = classify_weight(dir, prefix);
    NVFP4_CHECK(f[int(p)] != WeightFormat::Missing, dir.path(), ": missing tensor \"", prefix, ".weight\"");
    NVFP4_CHECK(f[int(p)] == WeightFormat::Bf16 || f[int(p)] == WeightFormat::Fp8Block, names.label(),
                ": the shared expert's weight is ", weight_format_name(f[int(p)]), " (", describe_weight(dir, prefix),
                "); expected BF16, or FP8 E4M3 with 128x128 or 32x32 block scales");
    NVFP4_CHECK(f[int(p)] == f[0], names.label(), ": the shared expert mixes formats: ",
                describe_weight(dir, names.shared(Proj::Gate)), " is ", weight_format_name(f[0]), " but ",
                describe_weight(dir, prefix), " is ", weight_format_name(f[int(p)]));
  }
  out = SharedExpertWeights{};
  auto dims = [&](Proj p) { return std::pair<int64_t, int64_t>{p == Proj::Down ? H : Is, p == Proj::Down ? Is : H}; };
  // FP8 with 32x32 blocks (DeepSeek-V4.1) is held as its exact BF16 values:
  // the FP8 kernels take one factor per 128x128 tile.
  std::array<Fp8BlockScales, 3> scales;
  bool fp8_blocks_32 = false;
  if (f[0] == WeightFormat::Fp8Block) {
    for (Proj p : kProjs) scales[size_t(p)] = read_block_scales(dir, names.shared(p), dims(p).first, dims(p).second);
    fp8_blocks_32 = scales[0].block != kTile;
    for (Proj p : kProjs)
      NVFP4_CHECK(scales[size_t(p)].block == scales[0].block, names.label(), ": the shared expert mixes block sizes: ",
                  names.shared(Proj::Gate), " has ", scales[0].block, "x", scales[0].block, " blocks, ",
                  names.shared(p), " ", scales[size_t(p)].block, "x", scales[size_t(p)].block);
  }
  out.format = f[0] == WeightFormat::Fp8Block && !fp8_blocks_32 ? SharedExpertFormat::Fp8Block : SharedExpertFormat::Bf16;
  for (Proj p : kProjs) {
    const TensorInfo& w = dir.get(names.shared(p) + ".weight");
    const auto [N, K] = dims(p);
    if (f[0] == WeightFormat::Bf16) {
      expect_shape(w, {N, K});
      (p == Proj::Gate ? out.w1 : p == Proj::Up ? out.w3 : out.w2) = read_bf16(w);
    } else if (fp8_blocks_32) {
      (p == Proj::Gate ? out.w1 : p == Proj::Up ? out.w3 : out.w2) =
          dequantize_fp8_blocks(w, read_fp8_weight(w, N, K), scales[size_t(p)], N, K);
    } else {
      (p == Proj::Gate ? out.w1_fp8 : p == Proj::Up ? out.w3_fp8 : out.w2_fp8) = read_fp8_weight(w, N, K);
      (p == Proj::Gate ? out.w1_scale : p == Proj::Up ? out.w3_scale : out.w2_scale) =
          std::move(scales[size_t(p)].factors);
    }
  }
  cfg.shared_intermediate = Is == cfg.intermediate * cfg.shared_experts ? 0 : Is;
}

namespace {

// The UE8M0 byte of v when v is 2^k with k in [-127, 127], else -1.
int e8m0_byte(float v) {
  int e = 0;
  const float m = std::frexp(v, &e);  // v = m * 2^e, m in [0.5, 1)
  return m == 0.5f && e - 1 >= -127 && e - 1 <= 127 ? e - 1 + 127 : -1;
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

}  // namespace

void append_shared_expert(SafetensorsWriter& st, const MoeNames& names, const SharedExpertWeights& s,
                          int64_t H, int64_t Is) {
  s.validate(H, Is);
  for (Proj p : kProjs) {
    const std::string prefix = names.shared(p);
    const int64_t N = p == Proj::Down ? H : Is, K = p == Proj::Down ? Is : H;
    if (s.format == SharedExpertFormat::Bf16) {
      st.add(prefix + ".weight", DType::BF16, {N, K}, (p == Proj::Gate ? s.w1 : p == Proj::Up ? s.w3 : s.w2).data());
      continue;
    }
    st.add(prefix + ".weight", DType::F8E4M3, {N, K},
           (p == Proj::Gate ? s.w1_fp8 : p == Proj::Up ? s.w3_fp8 : s.w2_fp8).data());
    const std::vector<float>& sc = p == Proj::Gate ? s.w1_scale : p == Proj::Up ? s.w3_scale : s.w2_scale;
    const std::vector<int64_t> shape = {tiles(N), tiles(K)};
    std::vector<uint8_t> e8m0;
    for (float v : sc) e8m0.push_back(uint8_t(std::max(0, e8m0_byte(v))));
    bool pow2 = true;
    for (float v : sc) pow2 = pow2 && e8m0_byte(v) >= 0;
    if (names.layout() == CheckpointLayout::DeepSeek && pow2)
      st.add_owned(prefix + ".scale", DType::F8E8M0, shape, std::move(e8m0));
    else if (names.layout() == CheckpointLayout::DeepSeek)
      st.add_owned(prefix + ".scale", DType::F32, shape, f32_bytes(sc));
    else
      st.add_owned(prefix + ".weight_scale_inv", DType::F32, shape, f32_bytes(sc));
  }
}

}  // namespace nvfp4moe
