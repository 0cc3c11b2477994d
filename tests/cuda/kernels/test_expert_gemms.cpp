// sm90_nvfp4_decode_gemm (the decode GEMM) against a scalar FP64 reference of
// its contract, on fresh random inputs; and its fragment layout, on the host.
//
// The GPU tests build the same GroupedGemmPlan the cuda backend builds
// (group_pairs_ref on random routing), run every kernel configuration AND the
// correctness-first grouped_gemm_ref on poisoned outputs, and check
// every live output against the reference.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <sstream>
#include <vector>

#include "cuda/backend/expert_gemm.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels/grouping.hpp"
#include "cuda/kernels/ref/grouped_gemm_ref.hpp"
#include "cuda/kernels/ref/grouping_ref.hpp"
#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"
#include "cuda/kernels/sm90_nvfp4_prefill_gemm.hpp"
#include "cuda/layout/fragment_layout.hpp"
#include "cuda/layout/operand_order.hpp"
#include "cuda/layout/weight_upload.hpp"
#include "format/nvfp4_codec.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

using test::Rng;

float bf16_bits_to_float(uint16_t b) { return fmt::bits_to_float(uint32_t(b) << 16); }

// ---- host: the fragment word ------------------------------------------------

TEST(FragmentLayout, FragmentWordDecodesEveryCodeInEverySlot) {
  for (int slot = 0; slot < 8; ++slot)
    for (int code = 0; code < 16; ++code) {
      uint8_t codes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      codes[slot] = uint8_t(code);
      uint32_t out[4];
      unpack_fragment_word(pack_fragment_word(codes), out);
      for (int s = 0; s < 8; ++s) {
        const uint16_t half = uint16_t(out[s / 2] >> (16 * (s % 2)));
        const float got = bf16_bits_to_float(half) * 0x1p126f;
        const float want = fmt::e2m1_value(codes[s]);
        EXPECT_EQ(got, want) << "slot " << s << " code 0x" << std::hex << int(codes[s]) << std::dec
                             << " (planted in slot " << slot << "): bf16 bits 0x" << std::hex << half;
        // -0 must stay a signed zero (code 8): compare the sign too.
        EXPECT_EQ(std::signbit(got), (codes[s] & 8) != 0) << "slot " << s << " code " << int(codes[s]);
      }
    }
}

// The layout is a permutation of the word: 8 codes x 4 bits take each of the
// 32 bits once (two codes sharing a bit would still decode a lone code right).
TEST(FragmentLayout, FragmentLayoutUsesEveryWordBitOnce) {
  uint32_t seen = 0;
  for (int i = 0; i < 4; ++i)
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < 4; ++b) {
        const int bit = (b < 3 ? kFragMagBit[i] + b : kFragSignBit[i]) + 16 * h;
        EXPECT_FALSE(seen >> bit & 1u) << "bit " << bit << " used twice (register " << i << " half " << h << ")";
        seen |= 1u << bit;
      }
  EXPECT_EQ(seen, 0xFFFFFFFFu);
  // Golden: code 0xB (sign, magnitude 3 = 1.5) as register 3, half 1: magnitude at bits 25..27, sign at bit 29.
  const uint8_t codes[8] = {0, 0, 0, 0, 0, 0, 0, 0xB};
  EXPECT_EQ(pack_fragment_word(codes), (3u << 25) | (1u << 29));
}

TEST(FragmentLayout, FragmentWordRoundTripsRandomWords) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int it = 0; it < 10000; ++it) {
    uint8_t codes[8];
    for (auto& c : codes) c = uint8_t(rng.below(16));
    uint32_t out[4];
    unpack_fragment_word(pack_fragment_word(codes), out);
    for (int s = 0; s < 8; ++s) {
      const float got = bf16_bits_to_float(uint16_t(out[s / 2] >> (16 * (s % 2)))) * 0x1p126f;
      ASSERT_EQ(got, fmt::e2m1_value(codes[s])) << "iteration " << it << " slot " << s;
    }
  }
}

TEST(FragmentLayout, PackUnpackRoundTripsBothProjections) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  struct Case {
    Projection p;
    int64_t H, I;
  };
  // I = 136: m-tiles that are not a power of two; H = 48: three m-tiles of down rows.
  for (const Case& c : {Case{Projection::GateUp, 256, 136}, Case{Projection::Down, 48, 256}}) {
    SCOPED_TRACE(::testing::Message() << "H=" << c.H << " I=" << c.I);
    const int64_t rows = c.p == Projection::GateUp ? 2 * c.I : c.H;
    const int64_t k = c.p == Projection::GateUp ? c.H : c.I;
    std::vector<uint8_t> codes(size_t(rows * k / 2)), scales(size_t(rows * k / 16));
    for (auto& b : codes) b = uint8_t(rng.next());
    for (auto& b : scales) b = uint8_t(rng.next());
    const FragmentGeometry g = fragment_geometry(c.p, c.H, c.I);
    std::vector<uint8_t> pc(size_t(g.code_bytes_per_expert())), ps(size_t(g.scale_bytes_per_expert()));
    EXPECT_EQ(int64_t(pc.size()) * 2, rows * k) << "the layout adds no padding";
    pack_fragment_weights(c.p, codes.data(), scales.data(), c.H, c.I, pc.data(), ps.data());
    std::vector<uint8_t> uc(codes.size(), 0xAA), us(scales.size(), 0xAA);
    unpack_fragment_weights(c.p, pc.data(), ps.data(), c.H, c.I, uc.data(), us.data());
    EXPECT_BYTES_EQ(uc.data(), codes.data(), int64_t(codes.size()), "codes after pack/unpack");
    EXPECT_BYTES_EQ(us.data(), scales.data(), int64_t(scales.size()), "scales after pack/unpack");
  }
}

TEST(FragmentLayout, GeometryRejectsBadShapesNamingThem) {
  try {
    fragment_geometry(Projection::Down, 1024, 1000);  // K = I = 1000 not a multiple of 128
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("1000"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fragment_geometry(Projection::GateUp, 1024, 12), Error);  // I % 8
}

// ---- GPU: the kernel against the reference ------------------------------------

struct Problem {
  int64_t H = 1024, I = 1024, E = 3, k = 2, T = 0;
  float limit = 10.0f;
  std::vector<int32_t> ids;          // [T, k]
  std::vector<uint8_t> w13c, w13s;   // [E, 2I, H/2], [E, 2I, H/16]
  std::vector<uint8_t> w2c, w2s;     // [E, H, I/2], [E, H, I/16]
  std::vector<float> w13g, w2g;      // [E, 2], [E]
  std::vector<uint16_t> x;           // [T, H] bf16 operand (value * scale, exact)
  std::vector<float> gx;             // [T]
  std::vector<uint16_t> hop;         // [T*k, I] L2 operand rows by PAIR
  std::vector<float> gh;             // [T*k]
  std::vector<float> wts;            // [T*k]
  std::vector<double> h_ref, y_ref;  // [T*k, I], [T*k, H] by pair
};

// A random value(q) * f32(s) as BF16 (exact: docs/numerics.md §2).
uint16_t random_operand(Rng& rng, uint8_t scale) {
  const float v = fmt::e2m1_value(uint8_t(rng.below(16))) * fmt::e4m3_value(scale);
  return uint16_t(fmt::float_to_bits(v) >> 16);
}

void fill_operand(Rng& rng, std::vector<uint16_t>& a, int64_t rows, int64_t cols) {
  a.resize(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 16; ++b) {
      const uint8_t s = uint8_t(rng.below(0x7F));  // any finite UE4M3, subnormals and zero included
      for (int i = 0; i < 16; ++i) a[size_t(r * cols + b * 16 + i)] = random_operand(rng, s);
    }
}

// Dequantized weight rows value(q) * f32(s) of [rows, K] linear bytes, in double.
std::vector<double> dequant_ref(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t K) {
  std::vector<double> w(size_t(rows * K));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < K; ++c) {
      const uint8_t byte = codes[r * K / 2 + c / 2];
      w[size_t(r * K + c)] = double(fmt::e2m1_value(uint8_t((c & 1) ? byte >> 4 : byte & 15))) *
                             double(fmt::e4m3_value(scales[r * K / 16 + c / 16]));
    }
  return w;
}

double dot(const double* w, const uint16_t* a, int64_t K) {
  double s = 0.0;
  for (int64_t c = 0; c < K; ++c) s += w[c] * double(bf16_bits_to_float(a[c]));
  return s;
}

// The contract in FP64: h = SwiGLU(alpha * W13 a) per pair; y = w_j * alpha * W2 h_op.
void compute_reference(Problem& p) {
  const int64_t P = p.T * p.k;
  p.h_ref.assign(size_t(P * p.I), std::nan(""));
  p.y_ref.assign(size_t(P * p.H), std::nan(""));
  for (int64_t e = 0; e < p.E; ++e) {
    const auto w13 = dequant_ref(p.w13c.data() + e * 2 * p.I * p.H / 2, p.w13s.data() + e * 2 * p.I * p.H / 16, 2 * p.I, p.H);
    const auto w2 = dequant_ref(p.w2c.data() + e * p.H * p.I / 2, p.w2s.data() + e * p.H * p.I / 16, p.H, p.I);
    for (int64_t pair = 0; pair < P; ++pair) {
      if (p.ids[size_t(pair)] != e) continue;
      const int64_t t = pair / p.k;
      const double L = p.limit;
      for (int64_t i = 0; i < p.I; ++i) {
        double gate = dot(&w13[size_t(i * p.H)], &p.x[size_t(t * p.H)], p.H) * p.gx[size_t(t)] * p.w13g[size_t(2 * e)];
        double up = dot(&w13[size_t((p.I + i) * p.H)], &p.x[size_t(t * p.H)], p.H) * p.gx[size_t(t)] *
                    p.w13g[size_t(2 * e + 1)];
        gate = std::min(gate, L);
        up = std::max(std::min(up, L), -L);
        p.h_ref[size_t(pair * p.I + i)] = gate / (1.0 + std::exp(-gate)) * up;
      }
      for (int64_t n = 0; n < p.H; ++n)
        p.y_ref[size_t(pair * p.H + n)] = dot(&w2[size_t(n * p.I)], &p.hop[size_t(pair * p.I)], p.I) *
                                          p.gh[size_t(pair)] * p.w2g[size_t(e)] * p.wts[size_t(pair)];
    }
  }
}

Problem make_problem(Rng& rng, int64_t T, int64_t H = 1024, int64_t I = 1024) {
  Problem p;
  p.T = T;
  p.H = H;
  p.I = I;
  p.ids.assign(size_t(T * p.k), -1);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t a = int32_t(rng.below(p.E)), b = int32_t((a + 1 + rng.below(p.E - 1)) % p.E);
    p.ids[size_t(t * p.k)] = a;
    p.ids[size_t(t * p.k + 1)] = rng.below(8) == 0 ? -1 : b;  // some empty slots
  }
  auto bytes = [&](std::vector<uint8_t>& v, int64_t n, bool scale) {
    v.resize(size_t(n));
    for (auto& b : v) b = scale ? uint8_t(rng.below(0x7F)) : uint8_t(rng.next());
  };
  bytes(p.w13c, p.E * 2 * p.I * p.H / 2, false);
  bytes(p.w13s, p.E * 2 * p.I * p.H / 16, true);
  bytes(p.w2c, p.E * p.H * p.I / 2, false);
  bytes(p.w2s, p.E * p.H * p.I / 16, true);
  for (int64_t i = 0; i < 2 * p.E; ++i) p.w13g.push_back(rng.uniform(0.5f, 2.0f) * 1e-3f);
  for (int64_t i = 0; i < p.E; ++i) p.w2g.push_back(rng.uniform(0.5f, 2.0f) * 1e-3f);
  fill_operand(rng, p.x, T, p.H);
  for (int64_t t = 0; t < T; ++t) p.gx.push_back(rng.uniform(0.5f, 2.0f) * 1e-2f);
  fill_operand(rng, p.hop, T * p.k, p.I);
  for (int64_t i = 0; i < T * p.k; ++i) p.gh.push_back(rng.uniform(0.5f, 2.0f) * 1e-2f);
  for (int64_t i = 0; i < T * p.k; ++i) p.wts.push_back(rng.uniform(0.1f, 1.0f));
  compute_reference(p);
  return p;
}

// Operand rows [rows, cols] (BF16 bits) from logical to k-slot column order.
void permute_to_kslot(std::vector<uint16_t>& a, int64_t rows, int64_t cols) {
  std::vector<uint16_t> out(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[size_t(r * cols + operand_kslot_column(c))] = a[size_t(r * cols + c)];
  a.swap(out);
}

template <typename T>
DeviceBuffer<T> to_device(const std::vector<T>& v) {
  DeviceBuffer<T> d(std::max<size_t>(1, v.size()));
  d.upload(v.data(), v.size());
  return d;
}

// Relative L2 error of `got` against the finite entries of `want`; counts
// non-finite `got` where `want` is finite (unwritten or wrong NaN).
double compare(const std::vector<float>& got, const std::vector<double>& want, int64_t& bad) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) continue;
    if (!std::isfinite(got[i])) {
      if (bad++ < 3) ADD_FAILURE() << "element " << i << " not written or not finite: " << got[i];
      continue;
    }
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 0 ? std::sqrt(num / den) : 0.0;
}

// The kernel a check runs: the decode kernel with `mma`, the correctness-first
// kernel, the wgmma kernel with `block_n`, or run_expert_gemm's device-side
// choice among all of them (pairs_bound: the host's bound it is given).
struct KernelUnderTest {
  // WgmmaSplit: every TokenBlocks::Split launch together; SplitOne: the
  // one of width block_n alone, which must write exactly the positions of
  // its blocks (the full ones for 128, last blocks of its width).
  enum Which { Mma, Simple, Wgmma, Chosen, WgmmaSplit, SplitOne } which = Mma;
  Sm90DecodeGemmConfig mma;
  int block_n = 0;
  int64_t pairs_bound = 0;
  // Expected written: false when the device-side choice must rule this kernel out.
  bool expect_written = true;
};
std::ostream& operator<<(std::ostream& os, const KernelUnderTest& k) {
  switch (k.which) {
    case KernelUnderTest::Mma: return os << "decode " << k.mma;
    case KernelUnderTest::Simple: return os << "simple";
    case KernelUnderTest::Wgmma: return os << "wgmma block_n=" << k.block_n;
    case KernelUnderTest::Chosen: return os << "run_expert_gemm pairs_bound=" << k.pairs_bound;
    case KernelUnderTest::WgmmaSplit: return os << "wgmma split, every width";
    case KernelUnderTest::SplitOne: return os << "wgmma split, width " << k.block_n << " alone";
  }
  return os;
}
KernelUnderTest simple_kernel() { return KernelUnderTest{KernelUnderTest::Simple, {}, 0, 0}; }
KernelUnderTest wgmma_kernel(int block_n) { return KernelUnderTest{KernelUnderTest::Wgmma, {}, block_n, 0}; }

// Runs L1 (gate/up + SwiGLU) and L2 (down x w_j) with one kernel on poisoned
// outputs and compares with the FP64 reference.
void run_and_check(const Problem& p, const KernelUnderTest& kut, const char* what, int64_t nan_token = -1) {
  SCOPED_TRACE(::testing::Message() << what << " T=" << p.T << " " << kut);
  const Sm90DecodeGemmConfig& cfg = kut.mma;
  const int64_t P = p.T * p.k;
  auto d_ids = to_device(p.ids);
  DeviceBuffer<int32_t> offsets(static_cast<size_t>(p.E + 1)), pair_of_pos(static_cast<size_t>(P)), pos_of_pair(static_cast<size_t>(P)),
      expert_of_pos(static_cast<size_t>(P)), num_tiles(1);
  const int64_t max_tiles = max_gemm_tiles(P, p.E, kGemmTileTokens);
  DeviceBuffer<GemmTile> tiles(static_cast<size_t>(max_tiles));
  DeviceBuffer<uint32_t> err(4);
  NVFP4_CUDA_CHECK(cudaMemset(err.get(), 0, 16));
  GroupingArgs ga;
  ga.topk_ids = d_ids.get();
  ga.tokens = p.T;
  ga.top_k = int(p.k);
  ga.experts = p.E;
  ga.local_experts = p.E;
  ga.tile_rows = kGemmTileTokens;
  ga.offsets = offsets.get();
  ga.pair_of_pos = pair_of_pos.get();
  ga.pos_of_pair = pos_of_pair.get();
  ga.expert_of_pos = expert_of_pos.get();
  ga.tiles = tiles.get();
  ga.num_tiles = num_tiles.get();
  ga.error_word = err.get();
  group_pairs_ref(ga, nullptr);
  std::vector<int32_t> h_pos_of_pair(static_cast<size_t>(P));
  pos_of_pair.download(h_pos_of_pair.data(), size_t(P));
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());

  // The L2 operand and its g by POSITION, as the backend's requantize writes them.
  std::vector<uint16_t> hop_pos(size_t(P * p.I), 0x7FC0);  // rows of empty positions: NaN, never read
  std::vector<float> gh_pos(size_t(P), std::nanf(""));
  for (int64_t pair = 0; pair < P; ++pair) {
    const int32_t pos = h_pos_of_pair[size_t(pair)];
    if (pos < 0) continue;
    std::memcpy(&hop_pos[size_t(pos * p.I)], &p.hop[size_t(pair * p.I)], size_t(p.I) * 2);
    gh_pos[size_t(pos)] = p.gh[size_t(pair)];
  }

  // Weights in both layouts: tile (simple, wgmma) and fragment (decode).
  const bool has_fragment = fragment_layout_fits(p.H, p.I);
  const FragmentGeometry g1 = has_fragment ? fragment_geometry(Projection::GateUp, p.H, p.I) : FragmentGeometry{};
  const FragmentGeometry g2 = has_fragment ? fragment_geometry(Projection::Down, p.H, p.I) : FragmentGeometry{};
  const PackedGeometry q1 = packed_geometry(Projection::GateUp, p.H, p.I), q2 = packed_geometry(Projection::Down, p.H, p.I);
  std::vector<uint8_t> t1, t2, c1, s1, c2, s2;
  for (int64_t e = 0; e < p.E; ++e) {
    const uint8_t* wc1 = p.w13c.data() + e * 2 * p.I * p.H / 2;
    const uint8_t* ws1 = p.w13s.data() + e * 2 * p.I * p.H / 16;
    const uint8_t* wc2 = p.w2c.data() + e * p.H * p.I / 2;
    const uint8_t* ws2 = p.w2s.data() + e * p.H * p.I / 16;
    const size_t u1 = t1.size(), u2 = t2.size();
    t1.resize(u1 + size_t(q1.bytes_per_expert()));
    t2.resize(u2 + size_t(q2.bytes_per_expert()));
    // The scales as the kernels read them: multiplier bytes (scale_multiplier.hpp).
    const LinearExpertProjection l1{.projection = Projection::GateUp, .hidden = p.H, .inter = p.I, .codes = wc1,
                                    .scales = ws1, .expert = e};
    LinearExpertProjection l2 = l1;
    l2.projection = Projection::Down;
    l2.codes = wc2;
    l2.scales = ws2;
    pack_tile_expert(l1, t1.data() + u1, nullptr);
    pack_tile_expert(l2, t2.data() + u2, nullptr);
    if (!has_fragment) continue;
    const size_t o1 = c1.size(), v1 = s1.size(), o2 = c2.size(), v2 = s2.size();
    c1.resize(o1 + size_t(g1.code_bytes_per_expert()));
    s1.resize(v1 + size_t(g1.scale_bytes_per_expert()));
    c2.resize(o2 + size_t(g2.code_bytes_per_expert()));
    s2.resize(v2 + size_t(g2.scale_bytes_per_expert()));
    pack_fragment_expert(l1, c1.data() + o1, s1.data() + v1, nullptr);
    pack_fragment_expert(l2, c2.data() + o2, s2.data() + v2, nullptr);
  }
  auto dt1 = to_device(t1), dt2 = to_device(t2);
  auto dc1 = to_device(c1), ds1 = to_device(s1), dc2 = to_device(c2), ds2 = to_device(s2);
  // The operand order the kernel reads (operand_order.hpp): k-slot order for wgmma, as the staging
  // kernels would write it for the same device-side choice.
  const FragmentWeights m1{dc1.get(), ds1.get(), g1}, m2{dc2.get(), ds2.get(), g2};
  const ExpertGemmChoice choice =
      expert_gemm_choice(p.E, kut.pairs_bound, -1, has_fragment ? &m1 : nullptr, has_fragment ? &m2 : nullptr);
  int64_t live = 0;
  for (int32_t id : p.ids) live += id >= 0;
  using K = ExpertGemmCandidate;
  const bool kslot = kut.which == KernelUnderTest::Wgmma || kut.which == KernelUnderTest::WgmmaSplit ||
                     kut.which == KernelUnderTest::SplitOne ||
                     (kut.which == KernelUnderTest::Chosen &&
                      K::prefill(choice.kind_for(live)));
  // The order the staging kernels would be told to write agrees with the kernel that runs.
  if (kut.which == KernelUnderTest::Chosen) {
    const OperandOrder order = choice.operand_order(offsets.get());
    EXPECT_EQ(kslot, order.live_pairs ? live > order.kslot_above : order.kslot_above < 0) << "live pairs " << live;
  }
  std::vector<uint16_t> x_op = p.x;
  if (kslot) {
    permute_to_kslot(x_op, p.T, p.H);
    permute_to_kslot(hop_pos, P, p.I);
  }
  auto dx = to_device(x_op), dhop = to_device(hop_pos);
  auto dgx = to_device(p.gx), dgh = to_device(gh_pos), dwts = to_device(p.wts);
  auto dw13g = to_device(p.w13g), dw2g = to_device(p.w2g);
  DeviceBuffer<float> h(size_t(P * p.I)), y(size_t(P * p.H));
  NVFP4_CUDA_CHECK(cudaMemset(h.get(), 0xFF, h.bytes()));  // NaN poison
  NVFP4_CUDA_CHECK(cudaMemset(y.get(), 0xFF, y.bytes()));

  GroupedGemmPlan l1;
  l1.projection = Projection::GateUp;
  l1.weights = dt1.get();
  l1.geometry = q1;
  l1.n_valid = p.I;
  l1.w_global = dw13g.get();
  l1.act = reinterpret_cast<const __nv_bfloat16*>(dx.get());
  l1.ld_act = p.H;
  l1.act_rows = int64_t(x_op.size()) / p.H;
  l1.pair_of_pos = pair_of_pos.get();
  l1.top_k = int(p.k);
  l1.act_g = dgx.get();
  l1.tiles = tiles.get();
  l1.num_tiles = num_tiles.get();
  l1.max_tiles = max_tiles;
  l1.offsets = offsets.get();
  l1.local_experts = p.E;
  l1.h_out = h.get();
  l1.ld_h = p.I;
  l1.has_limit = true;
  l1.limit = p.limit;
  GroupedGemmPlan l2 = l1;
  l2.projection = Projection::Down;
  l2.weights = dt2.get();
  l2.geometry = q2;
  l2.n_valid = p.H;
  l2.w_global = dw2g.get();
  l2.act = reinterpret_cast<const __nv_bfloat16*>(dhop.get());
  l2.ld_act = p.I;
  l2.act_rows = int64_t(hop_pos.size()) / p.I;
  l2.act_g = dgh.get();
  l2.h_out = nullptr;
  l2.y_pair.rows = y.get();
  l2.topk_weights = dwts.get();
  prepare_expert_gemm(p.E);
  if (!kut.expect_written) {  // a device-side choice that rules this kernel out, whatever the count
    for (GroupedGemmPlan* pl : {&l1, &l2}) {
      pl->live_pairs = offsets.get() + p.E;
      pl->pairs_above = std::numeric_limits<int32_t>::max() - 1;
    }
  }
  auto run = [&](const GroupedGemmPlan& pl, const FragmentWeights& m) {
    switch (kut.which) {
      case KernelUnderTest::Simple:
        grouped_gemm_ref(pl, nullptr);
        break;
      case KernelUnderTest::Mma:
        sm90_nvfp4_decode_gemm(pl, m, cfg, nullptr);
        break;
      case KernelUnderTest::Wgmma:
        sm90_nvfp4_prefill_gemm(pl, m, Sm90PrefillGemmConfig{kut.block_n, 0}, nullptr);
        break;
      case KernelUnderTest::Chosen:
        run_expert_gemm(pl, has_fragment ? &m : nullptr, choice, nullptr);
        break;
      case KernelUnderTest::WgmmaSplit:
        sm90_nvfp4_prefill_gemm_split(pl, m, nullptr);
        break;
      case KernelUnderTest::SplitOne:
        sm90_nvfp4_prefill_gemm(pl, m, Sm90PrefillGemmConfig{kut.block_n, 0, TokenBlocks::Split}, nullptr);
        break;
    }
  };
  run(l1, m1);
  run(l2, m2);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());

  // h is by position: gather it by pair for the comparison.
  std::vector<float> hh(size_t(P * p.I)), yy(size_t(P * p.H)), h_pair(size_t(P * p.I), std::nanf(""));
  h.download(hh.data(), hh.size());
  y.download(yy.data(), yy.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  for (int64_t pair = 0; pair < P; ++pair)
    if (const int32_t pos = h_pos_of_pair[size_t(pair)]; pos >= 0)
      std::memcpy(&h_pair[size_t(pair * p.I)], &hh[size_t(pos * p.I)], size_t(p.I) * 4);
  if (kut.which == KernelUnderTest::SplitOne) {  // written exactly in the blocks of its width
    std::vector<int32_t> off(static_cast<size_t>(p.E + 1));
    offsets.download(off.data(), off.size());
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
    int64_t wrong = 0, tails = 0;
    for (int64_t e = 0; e < p.E; ++e) {
      const int32_t rows = off[size_t(e + 1)] - off[size_t(e)], full = rows / 128 * 128, last = rows % 128;
      for (int32_t r = 0; r < rows; ++r) {
        const bool want = r < full ? kut.block_n == 128 : wgmma_tile_width(last) == kut.block_n;
        tails += want;
        const int64_t pos = off[size_t(e)] + r;
        const bool got_h = !std::isnan(hh[size_t(pos * p.I)]), got_h_last = !std::isnan(hh[size_t(pos * p.I + p.I - 1)]);
        if ((got_h != want || got_h_last != want) && wrong++ < 3)
          ADD_FAILURE() << "expert " << e << " (" << rows << " rows) row " << r << ": h written " << got_h
                        << ", expected " << want;
      }
    }
    EXPECT_EQ(wrong, 0);
    ::testing::Test::RecordProperty("tail_rows", int(tails));
    return;
  }
  if (!kut.expect_written) {
    int64_t written = 0;
    for (float v : hh) written += !std::isnan(v);
    for (float v : yy) written += !std::isnan(v);
    EXPECT_EQ(written, 0) << "a kernel the device-side choice ruled out wrote outputs";
    return;
  }
  int64_t bad = 0;
  EXPECT_LT(compare(h_pair, p.h_ref, bad), 1e-5) << "L1 (gate/up + SwiGLU) relative L2 error";
  EXPECT_LT(compare(yy, p.y_ref, bad), 1e-5) << "L2 (down x w_j) relative L2 error";
  EXPECT_EQ(bad, 0);
  if (nan_token >= 0) {
    for (int64_t pair = nan_token * p.k; pair < (nan_token + 1) * p.k; ++pair) {
      if (p.ids[size_t(pair)] < 0) continue;
      for (int64_t i = 0; i < p.I; i += 97) {
        EXPECT_TRUE(std::isnan(h_pair[size_t(pair * p.I + i)])) << "token " << nan_token << " pair " << pair << " i " << i;
      }
    }
  }
  // Rows of empty slots are never written: they stay poisoned.
  for (int64_t pair = 0; pair < P; ++pair) {
    if (p.ids[size_t(pair)] < 0) {
      EXPECT_TRUE(std::isnan(yy[size_t(pair * p.H)])) << "y row of empty slot " << pair;
    }
  }
  // The same down GEMM writing each pair's row where a table points, in
  // BF16 (an expert-parallel owner's combine rows on the tokens' ranks): pair
  // p's row at row P - 1 - p of another buffer, each value the FP32 result
  // rounded once; the rows of empty slots untouched.
  DeviceBuffer<uint16_t> y16(size_t(P * p.H));
  NVFP4_CUDA_CHECK(cudaMemset(y16.get(), 0xFF, y16.bytes()));
  std::vector<void*> rows(static_cast<size_t>(P));
  for (int64_t pair = 0; pair < P; ++pair) rows[size_t(pair)] = y16.get() + (P - 1 - pair) * p.H;
  auto d_rows = to_device(rows);
  GroupedGemmPlan l2_rows = l2;
  l2_rows.y_pair = PairOutput{.row_of_pair = d_rows.get(), .bf16 = true};
  run(l2_rows, m2);
  std::vector<uint16_t> got16(size_t(P * p.H));
  y16.download(got16.data(), got16.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  int64_t mismatches = 0;
  for (int64_t pair = 0; pair < P; ++pair)
    for (int64_t n = 0; n < p.H; ++n) {
      const uint16_t got = got16[size_t((P - 1 - pair) * p.H + n)];
      const float y32 = yy[size_t(pair * p.H + n)];
      const uint16_t want = p.ids[size_t(pair)] < 0 ? uint16_t(0xFFFF) : bf16_from_float(y32).bits;
      const bool both_nan = p.ids[size_t(pair)] >= 0 && std::isnan(y32) && std::isnan(bf16_to_float(Bf16{got}));
      if (got != want && !both_nan && mismatches++ < 3)
        ADD_FAILURE() << "BF16 row of pair " << pair << " column " << n << ": 0x" << std::hex << got << ", expected 0x"
                      << want << std::dec;
    }
  EXPECT_EQ(mismatches, 0) << "pair rows through row_of_pair (BF16)";
}

class Sm90DecodeGemm : public ::testing::TestWithParam<int64_t> {};

TEST_P(Sm90DecodeGemm, MatchesFp64ReferenceInEveryConfiguration) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  const Problem p = make_problem(rng, GetParam());
  const Sm90DecodeGemmConfig configs[] = {{1, 1, 0}, {2, 1, 0}, {4, 1, 0}, {1, 2, 0}, {2, 2, 0},
                                       {4, 2, 0}, {1, 1, 7}, {2, 2, 3}, {4, 1, 1}};
  for (const auto& c : configs) run_and_check(p, KernelUnderTest{KernelUnderTest::Mma, c}, "mma");
  run_and_check(p, simple_kernel(), "correctness-first kernel");
  // The device-side choice: every kernel stays silent when its range excludes the count.
  for (KernelUnderTest k : {KernelUnderTest{KernelUnderTest::Mma, configs[4]}, simple_kernel(), wgmma_kernel(64)}) {
    k.expect_written = false;
    run_and_check(p, k, "ruled out");
  }
}

// T=1: one token; 5: under an n8 tile; 40: token groups not a multiple of 8;
// 100: an expert with more than one 64-position work tile.
INSTANTIATE_TEST_SUITE_P(Tokens, Sm90DecodeGemm, ::testing::Values(1, 5, 40, 100));

// The wgmma prefill kernel at every tile width, and run_expert_gemm's
// device-side choice among all kernels, against the same FP64 reference.
struct WgmmaCase {
  int64_t T, H, I;
};
std::ostream& operator<<(std::ostream& os, const WgmmaCase& c) { return os << "T" << c.T << "_H" << c.H << "_I" << c.I; }

class Sm90PrefillGemm : public ::testing::TestWithParam<WgmmaCase> {};

TEST_P(Sm90PrefillGemm, MatchesFp64ReferenceAtEveryTileWidthAndWhenChosen) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  const WgmmaCase c = GetParam();
  const Problem p = make_problem(rng, c.T, c.H, c.I);
  if (fragment_layout_fits(c.H, c.I)) {
    for (const int width : kWgmmaWidths) {
      run_and_check(p, wgmma_kernel(width), "wgmma");
      run_and_check(p, KernelUnderTest{KernelUnderTest::SplitOne, {}, width}, "wgmma split, one width");
    }
    run_and_check(p, KernelUnderTest{KernelUnderTest::WgmmaSplit}, "wgmma split");
  }
  // The host bound exact (T*k) and loose (10x: every candidate queued, the device picks).
  for (int64_t bound : {c.T * p.k, 10 * c.T * p.k}) {
    KernelUnderTest k{KernelUnderTest::Chosen};
    k.pairs_bound = bound;
    run_and_check(p, k, "chosen");
  }
}

// T=1: one token; 10: ~19 live pairs of 3 experts, the narrow candidate's
// range (4-16 a expert); 40: under one tile; 300: experts with several
// 64-position blocks and a partial 128 one; 100 and 200: experts around 64
// and 128 rows, last blocks of several widths (TokenBlocks::Split). H=640,
// I=384: 40 down m-tiles (a last block with one idle warpgroup), K not a
// multiple of 1024 (no decode kernel: the prefill kernel from zero pairs,
// narrow at T=8, Split at 150). H=576, I=320: no fragment layout (the simple
// kernel).
INSTANTIATE_TEST_SUITE_P(Shapes, Sm90PrefillGemm,
                         ::testing::Values(WgmmaCase{1, 1024, 1024}, WgmmaCase{10, 1024, 1024},
                                           WgmmaCase{40, 1024, 1024}, WgmmaCase{8, 640, 384},
                                           WgmmaCase{100, 1024, 1024}, WgmmaCase{200, 1024, 1024},
                                           WgmmaCase{300, 1024, 1024}, WgmmaCase{150, 640, 384},
                                           WgmmaCase{150, 576, 320}),
                         [](const auto& info) {
                           std::ostringstream os;
                           os << info.param;
                           return os.str();
                         });

// TokenBlocks::Split with routing that fixes every expert's row count, so
// that each width class of a last block is present whatever the seed, at
// both ends of each class (last block rows in brackets, width after the
// arrow): 138 (10 -> 32), 148 (20 -> 32), 168 (40 -> 64); 188 (60 -> 64),
// 198 (70 -> 96), 218 (90 -> 96); 228 (100 -> 128), 248 (120 -> 128), 256
// (two full blocks, no last one).
// Each problem routes T = (sum of counts) / 2 tokens to two distinct experts
// (no empty slots); no count reaches the sum of the other two, so the two
// slots of a token always differ.
TEST(Sm90PrefillSplit, EveryLastBlockWidthMatchesFp64Reference) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  using Counts = std::array<int32_t, 3>;
  for (const Counts counts : {Counts{138, 148, 168}, Counts{188, 198, 218}, Counts{228, 248, 256}}) {
    const int64_t T = (counts[0] + counts[1] + counts[2]) / 2;
    Problem p = make_problem(rng, T);
    ASSERT_EQ(p.E, 3);
    ASSERT_EQ(p.k, 2);
    // Slot 0 of token t takes entry t of the experts in order, slot 1 entry t + T.
    std::vector<int32_t> order;
    for (int32_t e = 0; e < 3; ++e) order.insert(order.end(), size_t(counts[size_t(e)]), e);
    ASSERT_EQ(order.size(), size_t(2 * p.T));
    for (int64_t t = 0; t < p.T; ++t) {
      p.ids[size_t(2 * t)] = order[size_t(t)];
      p.ids[size_t(2 * t + 1)] = order[size_t(t + p.T)];
      ASSERT_NE(p.ids[size_t(2 * t)], p.ids[size_t(2 * t + 1)]) << "token " << t;
    }
    compute_reference(p);
    SCOPED_TRACE(::testing::Message() << "rows per expert " << counts[0] << ", " << counts[1] << ", " << counts[2]);
    run_and_check(p, KernelUnderTest{KernelUnderTest::WgmmaSplit}, "wgmma split");
    for (const int width : kWgmmaWidths)
      run_and_check(p, KernelUnderTest{KernelUnderTest::SplitOne, {}, width}, "wgmma split, one width");
  }
}

TEST(Sm90PrefillSplit, TileWidthIsTheRowsRoundedUpTo32) {
  EXPECT_EQ(wgmma_tile_width(1), 32);
  EXPECT_EQ(wgmma_tile_width(32), 32);
  EXPECT_EQ(wgmma_tile_width(33), 64);
  EXPECT_EQ(wgmma_tile_width(64), 64);
  EXPECT_EQ(wgmma_tile_width(65), 96);
  EXPECT_EQ(wgmma_tile_width(96), 96);
  EXPECT_EQ(wgmma_tile_width(97), 128);
  EXPECT_EQ(wgmma_tile_width(127), 128);
  // Every width a tile can get has a kernel, widest first (the launch order).
  for (int rows = 1; rows <= 128; ++rows) EXPECT_TRUE(is_wgmma_width(wgmma_tile_width(rows))) << rows << " rows";
  EXPECT_TRUE(std::is_sorted(std::begin(kWgmmaWidths), std::end(kWgmmaWidths), std::greater<int>()));
}

// A NaN in one token's operand reaches that token's outputs only (docs/numerics.md §6).
TEST(Sm90DecodeGemmNaN, PropagatesToItsTokenOnly) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  Problem p = make_problem(rng, 12);
  p.x[size_t(3 * p.H + 100)] = 0x7FC0;  // token 3
  for (int64_t pair = 0; pair < p.T * p.k; ++pair)
    if (pair / p.k == 3 && p.ids[size_t(pair)] >= 0)
      for (int64_t i = 0; i < p.I; ++i) p.h_ref[size_t(pair * p.I + i)] = std::nan("");  // excluded from the error
  // run_and_check requires every other token finite and accurate; token 3's h must be NaN.
  run_and_check(p, KernelUnderTest{KernelUnderTest::Mma, Sm90DecodeGemmConfig{2, 1, 0}}, "nan", 3);
  run_and_check(p, wgmma_kernel(64), "nan", 3);
}

// The kernel choice (host only): the thresholds measured on the H200
// (docs/kernels.md, "Which kernel runs"), disjoint ranges covering [0, bound].
void expect_partition(const ExpertGemmChoice& c, int64_t bound) {
  ASSERT_GE(c.count, 1);
  EXPECT_EQ(c.candidates[0].above, -1);
  for (int i = 1; i < c.count; ++i) EXPECT_EQ(c.candidates[i].above, c.candidates[i - 1].at_most) << "candidate " << i;
  EXPECT_EQ(c.candidates[c.count - 1].at_most, bound);
}

TEST(ExpertGemmChoice, DecodeUpToThreeTokensPerExpertNarrowUpToSixteenThenSplit) {
  using K = ExpertGemmCandidate;
  ExpertGemmChoice c = choose_expert_gemm(48, 6, -1, true, true, nullptr);  // T=1, EP8: decode only, no device choice
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].kind, K::Decode);
  expect_partition(c, 6);
  c = choose_expert_gemm(48, 3 * 48, -1, true, true, nullptr);  // the boundary: still decode only
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].kind, K::Decode);
  c = choose_expert_gemm(48, 3 * 48 + 1, -1, true, true, nullptr);  // one pair more: the device decides
  ASSERT_EQ(c.count, 2);
  EXPECT_EQ(c.candidates[1].kind, K::Narrow);
  expect_partition(c, 3 * 48 + 1);
  c = choose_expert_gemm(48, 1680, -1, true, true, nullptr);  // 280 tokens with -1 slots: all three queued
  ASSERT_EQ(c.count, 3);
  EXPECT_EQ(c.candidates[0].kind, K::Decode);
  EXPECT_EQ(c.candidates[0].at_most, 3 * 48);
  EXPECT_EQ(c.candidates[1].kind, K::Narrow);
  EXPECT_EQ(c.candidates[1].at_most, 16 * 48);
  EXPECT_EQ(c.candidates[2].kind, K::Wgmma);
  expect_partition(c, 1680);
  EXPECT_EQ(c.kind_for(3 * 48), K::Decode);
  EXPECT_EQ(c.kind_for(3 * 48 + 1), K::Narrow);
  EXPECT_EQ(c.kind_for(16 * 48), K::Narrow);
  EXPECT_EQ(c.kind_for(16 * 48 + 1), K::Wgmma);
  c = choose_expert_gemm(48, 16 * 48, -1, true, true, nullptr);  // the bound at the narrow range's end: no Split
  ASSERT_EQ(c.count, 2);
  EXPECT_EQ(c.candidates[1].kind, K::Narrow);
  expect_partition(c, 16 * 48);
  c = choose_expert_gemm(48, 8192 * 6, -1, true, false, nullptr);  // K the decode kernel cannot split: prefill from zero
  ASSERT_EQ(c.count, 2);
  EXPECT_EQ(c.candidates[0].kind, K::Narrow);
  EXPECT_EQ(c.candidates[1].kind, K::Wgmma);
  expect_partition(c, 8192 * 6);
  c = choose_expert_gemm(48, 8192 * 6, -1, false, false, nullptr);  // no fragment layout: the simple kernel, alone
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].kind, K::Simple);
  expect_partition(c, 8192 * 6);
  c = choose_expert_gemm(384, 0, -1, true, true, nullptr);  // nothing can be live
  ASSERT_EQ(c.count, 1);
  expect_partition(c, 0);
}

// Where many experts are local the decode range also ends at the pairs that
// uniform routing needs to touch 80 of them (docs/kernels.md).
TEST(ExpertGemmChoice, DecodeRangeEndsAtEightyTouchedExperts) {
  // Against the expectation computed directly: E (1 - (1 - 1/E)^p) <= 80 < the same at p + 1.
  auto touched = [](int64_t E, int64_t p) { return double(E) * (1.0 - std::pow(1.0 - 1.0 / double(E), double(p))); };
  for (const int64_t E : {81, 96, 128, 192, 256, 384, 1024, 4096}) {
    const int64_t p = pairs_touching_at_most(E, 80);
    EXPECT_LE(touched(E, p), 80.0) << E;
    EXPECT_GT(touched(E, p + 1), 80.0) << E;
  }
  EXPECT_EQ(pairs_touching_at_most(384, 80), 89);  // V4-Pro EP1: decode up to T = 14 (at T = 15 it took 8 % longer)
  EXPECT_EQ(pairs_touching_at_most(256, 80), 95);  // V4-Flash EP1: up to T = 15
  EXPECT_EQ(pairs_touching_at_most(384, 0), 0);
  EXPECT_EQ(pairs_touching_at_most(80, 80), std::numeric_limits<int64_t>::max());  // never more than 80 touched
  EXPECT_EQ(pairs_touching_at_most(1, 5), std::numeric_limits<int64_t>::max());
  EXPECT_ERROR_CONTAINS(pairs_touching_at_most(0, 80), "80 of 0 experts");
  EXPECT_ERROR_CONTAINS(pairs_touching_at_most(384, -1), "-1 of 384 experts");

  using K = ExpertGemmCandidate;
  ExpertGemmChoice c = choose_expert_gemm(384, 64 * 6, -1, true, true, nullptr);  // EP1 T = 64
  ASSERT_EQ(c.count, 2);
  EXPECT_EQ(c.candidates[0].kind, K::Decode);
  EXPECT_EQ(c.candidates[0].at_most, 89);
  EXPECT_EQ(c.candidates[1].kind, K::Narrow);
  expect_partition(c, 64 * 6);
  EXPECT_EQ(c.kind_for(89), K::Decode);
  EXPECT_EQ(c.kind_for(90), K::Narrow);
  EXPECT_EQ(c.decode_sized_for, 89);  // the items sized for the decode range's end, not the bound
  c = choose_expert_gemm(384, 14 * 6, -1, true, true, nullptr);  // T = 14: decode alone
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].kind, K::Decode);
  c = choose_expert_gemm(256, 15 * 6, -1, true, true, nullptr);  // V4-Flash EP1 T = 15: decode alone
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].kind, K::Decode);
  c = choose_expert_gemm(256, 16 * 6, -1, true, true, nullptr);  // T = 16: the device decides
  ASSERT_EQ(c.count, 2);
  EXPECT_EQ(c.candidates[0].at_most, 95);
  // Up to 84 local experts the range of 3 pairs an expert ends first.
  EXPECT_EQ(choose_expert_gemm(84, 1000, -1, true, true, nullptr).candidates[0].at_most, 3 * 84);
  EXPECT_EQ(choose_expert_gemm(85, 1000, -1, true, true, nullptr).candidates[0].at_most, 239);
  EXPECT_EQ(choose_expert_gemm(32, 1000, -1, true, true, nullptr).candidates[0].at_most, 3 * 32);  // V4-Flash EP8
}

// The decode kernel's items are sized for the planned pairs, not the bound:
// one EP8 rank (48 of 384 experts) of a forward of 4 tokens a rank can be
// sent 192 pairs but usually gets ~24.
TEST(ExpertGemmChoice, DecodeConfigurationFollowsThePlannedPairs) {
  EXPECT_EQ(planned_pairs(6, 384, 384), 6);        // every expert local: the bound itself
  EXPECT_EQ(planned_pairs(48, 48, 384), 9);        // EP8 T=1: 1.5 times the uniform share (6) of 48 slots
  EXPECT_EQ(planned_pairs(384, 48, 384), 72);      // EP8 T=8
  EXPECT_EQ(planned_pairs(7, 48, 384), 2);         // rounded up: ceil(1.3125)
  EXPECT_EQ(planned_pairs(0, 48, 384), 0);
  EXPECT_ERROR_CONTAINS(planned_pairs(6, 48, 8), "48 local experts of 8");
  EXPECT_ERROR_CONTAINS(planned_pairs(-1, 48, 384), "-1 slots");

  ExpertGemmChoice c = choose_expert_gemm(48, 48, -1, true, true, nullptr);
  EXPECT_EQ(c.decode_sized_for, 48);  // no plan: the bound
  c = choose_expert_gemm(48, 48, planned_pairs(48, 48, 384), true, true, nullptr);
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].at_most, 48);  // the candidates still cover the bound
  EXPECT_EQ(c.decode_sized_for, 9);
  EXPECT_EQ(sm90_nvfp4_decode_gemm_config(c.decode_sized_for, 48).m_tiles, 1);  // 1x1, where 48 pairs take 1x2
  EXPECT_EQ(sm90_nvfp4_decode_gemm_config(48, 48).m_tiles, 2);
  c = choose_expert_gemm(48, 192, planned_pairs(192, 48, 384), true, true, nullptr);  // EP8 T=4
  ASSERT_EQ(c.count, 2);  // decode up to 144 pairs, then narrow
  EXPECT_EQ(c.candidates[0].at_most, 3 * 48);
  EXPECT_EQ(c.decode_sized_for, 36);
  const Sm90DecodeGemmConfig planned = sm90_nvfp4_decode_gemm_config(c.decode_sized_for, 48);
  const Sm90DecodeGemmConfig bound = sm90_nvfp4_decode_gemm_config(c.candidates[0].at_most, 48);
  EXPECT_EQ(planned.n_tiles * 10 + planned.m_tiles, 11);  // 1x1 for 0.75 pairs an expert
  EXPECT_EQ(bound.n_tiles * 10 + bound.m_tiles, 12);      // 1x2 for the decode range's 3
  c = choose_expert_gemm(48, 1680, 5000, true, true, nullptr);  // a plan above the bound: the bound
  EXPECT_EQ(c.decode_sized_for, 3 * 48);
  c = choose_expert_gemm(48, 1680, 100, true, true, "decode");  // forced: the plan still sizes the items
  EXPECT_EQ(c.decode_sized_for, 100);
}

// Layers of different sizes in one process: preparing a small one after a
// large one must not lower the large one's shared-memory opt-in (a launch with
// 1000 local experts and no live pair must still start).
TEST(Sm90PrefillGemmPrepare, NeverLowersAnEarlierOptIn) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t E = 1000;
  prepare_expert_gemm(E);
  prepare_expert_gemm(2);
  std::vector<int32_t> zeros(size_t(E + 1), 0);
  auto offsets = to_device(zeros);
  DeviceBuffer<uint8_t> codes(1024), scales(1024);
  DeviceBuffer<__nv_bfloat16> act(1024);
  DeviceBuffer<float> g(16), h(16);
  DeviceBuffer<int32_t> pairs(16);
  GroupedGemmPlan plan;
  plan.projection = Projection::GateUp;
  plan.n_valid = 128 * 8;  // 128 m-tiles of gate/up rows
  plan.act = act.get();
  plan.ld_act = 128;
  plan.act_rows = 8;
  plan.act_g = g.get();
  plan.w_global = g.get();
  plan.pair_of_pos = pairs.get();
  plan.top_k = 1;
  plan.offsets = offsets.get();
  plan.local_experts = E;
  plan.h_out = h.get();
  plan.ld_h = plan.n_valid;
  const FragmentWeights w{codes.get(), scales.get(), FragmentGeometry{128, 2}};
  for (int bn : kWgmmaWidths) {
    EXPECT_NO_THROW(sm90_nvfp4_prefill_gemm(plan, w, Sm90PrefillGemmConfig{bn, 0}, nullptr)) << "block_n " << bn;
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

// The decode kernel only when it takes BOTH projections' K (one choice per
// forward: the operand order of L1 and L2 must agree).
TEST(ExpertGemmChoice, DecodeNeedsBothProjections) {
  uint8_t byte = 0;
  const FragmentWeights l1{&byte, &byte, fragment_geometry(Projection::GateUp, 1024, 512)};  // K = H = 1024: decode fits
  const FragmentWeights l2{&byte, &byte, fragment_geometry(Projection::Down, 1024, 512)};    // K = I = 512: it does not
  ASSERT_TRUE(sm90_nvfp4_decode_gemm_supports(l1.geometry));
  ASSERT_FALSE(sm90_nvfp4_decode_gemm_supports(l2.geometry));
  ExpertGemmChoice c = expert_gemm_choice(4, 8, -1, &l1, &l2);
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].kind, ExpertGemmCandidate::Narrow);  // 2 pairs a expert: the prefill kernel, narrow
  const FragmentWeights l2ok{&byte, &byte, fragment_geometry(Projection::Down, 1024, 1024)};
  c = expert_gemm_choice(4, 8, -1, &l1, &l2ok);
  EXPECT_EQ(c.candidates[0].kind, ExpertGemmCandidate::Decode);
  EXPECT_ERROR_CONTAINS(expert_gemm_choice(4, 8, -1, &l1, nullptr), "both projections");
}

// The operand order follows the kernel that will run: logical for decode and
// the simple kernel, k-slot for wgmma, decided on the device by the same
// threshold when several kernels are queued.
TEST(ExpertGemmChoice, OperandOrderFollowsTheKernelThatRuns) {
  int32_t live = 0;  // stands for the device count: only its address is taken
  auto kslot = [](const OperandOrder& o, int64_t n) { return o.live_pairs ? n > o.kslot_above : o.kslot_above < 0; };
  OperandOrder o = choose_expert_gemm(48, 6, -1, true, true, nullptr).operand_order(&live);  // decode alone
  EXPECT_EQ(o.live_pairs, nullptr);
  EXPECT_FALSE(kslot(o, 6));
  o = choose_expert_gemm(48, 6, -1, true, true, "wgmma").operand_order(&live);  // wgmma alone
  EXPECT_EQ(o.live_pairs, nullptr);
  EXPECT_TRUE(kslot(o, 0));
  o = choose_expert_gemm(48, 8192 * 6, -1, false, false, nullptr).operand_order(&live);  // simple kernel
  EXPECT_FALSE(kslot(o, 8192 * 6));
  const ExpertGemmChoice c = choose_expert_gemm(48, 8192 * 6, -1, true, true, nullptr);
  o = c.operand_order(&live);
  EXPECT_EQ(o.live_pairs, &live);
  for (int64_t n : {int64_t(0), int64_t(16 * 48), int64_t(16 * 48 + 1), int64_t(8192 * 6)}) {
    const ExpertGemmCandidate::Kind k = c.kind_for(n);
    EXPECT_EQ(kslot(o, n), ExpertGemmCandidate::prefill(k)) << n << " live pairs";
  }
  o = choose_expert_gemm(48, 8192 * 6, -1, true, false, nullptr).operand_order(&live);  // wgmma from zero pairs
  EXPECT_TRUE(kslot(o, 0));
}

// The host's view of the same rule: whether a writer must be ready for k-slot order.
TEST(ExpertGemmChoice, MayBeKslotMirrorsTheDeviceRule) {
  int32_t live = 0;
  EXPECT_FALSE(OperandOrder{}.may_be_kslot());                                          // logical, no count
  EXPECT_TRUE((OperandOrder{nullptr, -1}.may_be_kslot()));                              // always k-slot
  EXPECT_TRUE((OperandOrder{&live, 5}.may_be_kslot()));                                 // decided by the count
  EXPECT_FALSE((OperandOrder{&live, std::numeric_limits<int32_t>::max()}.may_be_kslot()));  // no count exceeds it
  EXPECT_FALSE(choose_expert_gemm(48, 6, -1, true, true, nullptr).operand_order(&live).may_be_kslot());  // decode only
  EXPECT_TRUE(choose_expert_gemm(48, 8192 * 6, -1, true, true, nullptr).operand_order(&live).may_be_kslot());
}

TEST(ExpertGemmChoice, ForcedKernelAndBadNames) {
  using K = ExpertGemmCandidate;
  ExpertGemmChoice c = choose_expert_gemm(48, 4096, -1, true, true, "decode");
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].kind, K::Decode);
  c = choose_expert_gemm(48, 4096, -1, true, false, "decode");  // decode cannot take the shape: wgmma
  EXPECT_EQ(c.candidates[0].kind, K::Wgmma);
  c = choose_expert_gemm(48, 6, -1, true, true, "wgmma");
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].kind, K::Wgmma);
  c = choose_expert_gemm(48, 4096, -1, true, true, "narrow");
  ASSERT_EQ(c.count, 1);
  EXPECT_EQ(c.candidates[0].kind, K::Narrow);
  EXPECT_ERROR_CONTAINS(choose_expert_gemm(48, 6, -1, true, true, "fast"), "NVFP4MOE_GEMM=fast");
  EXPECT_ERROR_CONTAINS(choose_expert_gemm(48, 6, -1, false, false, "fast"), "NVFP4MOE_GEMM=fast");
  EXPECT_ERROR_CONTAINS(choose_expert_gemm(0, 6, -1, true, true, nullptr), "got 0");
}

TEST(Sm90DecodeGemmHeuristic, ConfigFromTokensPerExpert) {
  const Sm90DecodeGemmConfig one = sm90_nvfp4_decode_gemm_config(6, 48);
  EXPECT_EQ(one.n_tiles, 1);
  EXPECT_EQ(one.m_tiles, 1);
  const Sm90DecodeGemmConfig per_one = sm90_nvfp4_decode_gemm_config(384, 384);  // T=64, EP1: one token per expert
  EXPECT_EQ(per_one.n_tiles, 1);
  EXPECT_EQ(per_one.m_tiles, 2);
  const Sm90DecodeGemmConfig eight = sm90_nvfp4_decode_gemm_config(384, 48);  // T=64, EP8
  EXPECT_EQ(eight.n_tiles, 2);
  EXPECT_EQ(eight.m_tiles, 2);
}

TEST(Sm90DecodeGemmHeuristic, FitsDeepSeekShapesOnly) {
  auto fits = [](int64_t H, int64_t I) {
    return sm90_nvfp4_decode_fits(fragment_geometry(Projection::GateUp, H, I), fragment_geometry(Projection::Down, H, I));
  };
  EXPECT_TRUE(fits(7168, 3072));   // V4-Pro
  EXPECT_TRUE(fits(4096, 2048));   // V4-Flash
  EXPECT_FALSE(fits(256, 128));    // the small demo layer: K not a multiple of 1024
  EXPECT_FALSE(fragment_layout_fits(7168, 0));  // not even the fragment layout
}

// The wgmma launcher's checks come before any CUDA call: host only. Each bad
// plan is a valid one with one thing changed, and the error names it.
TEST(Sm90PrefillGemmChecks, RejectsBadPlansNamingTheValue) {
  alignas(16) static uint8_t bytes[64] = {};
  const auto* any_f = reinterpret_cast<const float*>(bytes);
  const auto* any_i = reinterpret_cast<const int32_t*>(bytes);
  GroupedGemmPlan good;
  good.projection = Projection::Down;
  good.n_valid = 4 * kMmaTileRows;
  good.act = reinterpret_cast<const __nv_bfloat16*>(bytes);
  good.ld_act = 128;
  good.act_rows = 8;
  good.act_g = good.w_global = good.topk_weights = any_f;
  good.pair_of_pos = good.offsets = any_i;
  good.local_experts = 3;
  good.y_pair.rows = reinterpret_cast<float*>(bytes);
  const FragmentWeights w{bytes, bytes, FragmentGeometry{4, 2}};  // 64 rows, K = 128
  const Sm90PrefillGemmConfig cfg{128, 0};
  GroupedGemmPlan p = good;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, FragmentWeights{bytes, bytes, FragmentGeometry{4, 1}}, cfg, nullptr), "K=64");
  p.n_valid = 60;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w, cfg, nullptr), "n_valid=60");
  p = good;
  p.ld_act = 120;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w, cfg, nullptr), "stride 120");
  p = good;
  p.local_experts = 0;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w, cfg, nullptr), "got 0");
  p = good;
  p.offsets = nullptr;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w, cfg, nullptr), "offsets null");
  p = good;
  p.act = reinterpret_cast<const __nv_bfloat16*>(bytes + 4);
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w, cfg, nullptr), "16-byte aligned");
  p = good;
  p.y_pair = PairOutput{};
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w, cfg, nullptr), "y_pair");
  p = good;
  p.act_rows = 0;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w, cfg, nullptr), "act_rows", "got 0");
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(good, FragmentWeights{nullptr, bytes, w.geometry}, cfg, nullptr), "null");
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(good, w, Sm90PrefillGemmConfig{40, 0, TokenBlocks::Split}, nullptr),
                        "block_n=40", "128, 96, 64, 32");
  // The FP8 form: its operand scales with K/128 per row, and the weights' FP8 row exponents.
  p = good;
  p.act_fp8 = bytes;
  p.act_scale = any_f;
  p.ld_act_scale = 1;
  const auto* any_rows = reinterpret_cast<const int8_t*>(bytes);
  const FragmentWeights w8{bytes, bytes, w.geometry, any_rows};
  p.act_scale = nullptr;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w8, cfg, nullptr), "FP8 operand", "act_scale");
  p.act_scale = any_f;
  p.ld_act_scale = 2;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w8, cfg, nullptr), "K/128 = 1", "got 2");
  p.ld_act_scale = 1;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w, cfg, nullptr), "FP8 row exponents", "(null)");
  p.act_fp8 = bytes + 4;
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_prefill_gemm(p, w8, cfg, nullptr), "16-byte aligned");
  EXPECT_ERROR_CONTAINS(prepare_expert_gemm(0), "local_experts=0");
  EXPECT_ERROR_CONTAINS(prepare_expert_gemm(5000), "local_experts=5000");
  p = good;
  p.offsets = nullptr;
  EXPECT_ERROR_CONTAINS(run_expert_gemm(p, &w, choose_expert_gemm(3, 6, -1, true, false, nullptr), nullptr),
                        "plan.offsets");
  EXPECT_ERROR_CONTAINS(run_expert_gemm(good, nullptr, choose_expert_gemm(3, 6, -1, true, false, nullptr), nullptr),
                        "fragment-layout weights");
}

TEST(Sm90DecodeGemmChecks, RejectsUnsupportedKNamingIt) {
  GroupedGemmPlan plan;
  plan.projection = Projection::Down;
  FragmentGeometry g{64, 2};  // K = 128: not a multiple of 1024
  uint8_t dummy = 0;
  try {
    sm90_nvfp4_decode_gemm(plan, FragmentWeights{&dummy, &dummy, g}, Sm90DecodeGemmConfig{}, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K=128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nvfp4moe::cuda
