// sm90_nvfp4_stage / sm90_nvfp4_requant against the CPU quantizer (spec
// section 2) and the simple staging kernels, byte for byte, on fresh random
// rows including NaN, Inf, zero and saturating ones.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/ref/staging_ref.hpp"
#include "cuda/kernels/staging.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

using test::Rng;

// Rows of mixed magnitude plus the special rows the spec names.
std::vector<float> special_rows(Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::exp2(float(rng.below(40)) - 20.0f);
    for (int64_t c = 0; c < cols; ++c) x[size_t(r * cols + c)] = rng.normal() * scale;
  }
  if (rows > 8) {
    x[size_t(5 * cols + 17)] = std::nanf("");                            // NaN: its row only
    for (int64_t c = 0; c < cols; ++c) x[size_t(6 * cols + c)] = 0.0f;  // zero row: g = 1
    x[size_t(7 * cols + 3)] = INFINITY;                                   // Inf
    for (int64_t c = 0; c < 16; ++c) x[size_t(8 * cols + c)] = 1e-30f;    // a tiny block (subnormal scale)
  }
  if (rows > 9) {  // a large row holding one tiny negative value: its x / d underflows to -0, whose code is +0,
    for (int64_t c = 0; c < cols; ++c) x[size_t(9 * cols + c)] = rng.normal() * 0x1p40f;
    x[size_t(9 * cols + 20)] = -1e-38f;  // where quotient_rn would keep the sign: only the domain check tells
  }
  if (rows > 11) {  // the block-scale rules of docs/numerics.md §2 on the fast path (inside its domain)
    for (int64_t c = 16; c < 32; ++c) x[size_t(10 * cols + c)] = 0.0f;   // an all-zero block: scale 0x38, d = g
    for (int64_t c = 32; c < 48; ++c) x[size_t(10 * cols + c)] = -0.0f;  // and of -0: codes 0, not 8
    for (int64_t c = 16; c < 32; ++c) x[size_t(11 * cols + c)] *= 0x1p-22f;  // t ~ 2^-13: clamped to 0x01
  }
  return x;
}

bool same_g(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

struct Staged {
  std::vector<float> g;
  std::vector<uint8_t> codes, lin, swz;
  std::vector<uint16_t> deq;
};

// deq_only: only the BF16 operand and g requested (the routed path), so the
// fast kernel forms no codes.
Staged run_stage(bool fast, const void* dx, bool bf16, int64_t rows, int64_t cols, int64_t deq_ld, ActScope scope,
                 float static_g, OperandOrder order = {}, bool deq_only = false) {
  const int64_t k = cols / 16, swz_bytes = swizzled_scale_bytes(rows, k);
  DeviceBuffer<float> g(static_cast<size_t>(rows));
  DeviceBuffer<uint8_t> codes(size_t(rows * cols / 2)), lin(size_t(rows * k)), swz(static_cast<size_t>(swz_bytes));
  DeviceBuffer<__nv_bfloat16> deq(size_t(rows * deq_ld));
  NVFP4_CUDA_CHECK(cudaMemset(deq.get(), 0xFF, deq.bytes()));
  NVFP4_CUDA_CHECK(cudaMemset(swz.get(), 0xEE, swz.bytes()));
  QuantizeActArgs a;
  a.x = dx;
  a.x_is_bf16 = bf16;
  a.rows = rows;
  a.cols = cols;
  a.scope = scope;
  a.static_g = static_g;
  a.g_out = g.get();
  a.codes = deq_only ? nullptr : codes.get();
  a.scales_linear = deq_only ? nullptr : lin.get();
  a.scales_swizzled = deq_only ? nullptr : swz.get();
  a.deq = deq.get();
  a.deq_ld = deq_ld;
  a.deq_order = order;
  if (fast) {
    EXPECT_TRUE(sm90_nvfp4_stage_supports(a));
    sm90_nvfp4_stage(a, nullptr);
  } else {
    quantize_activations_ref(a, nullptr);
  }
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  Staged s;
  s.g.resize(size_t(rows));
  s.codes.resize(codes.size());
  s.lin.resize(lin.size());
  s.swz.resize(swz.size());
  s.deq.resize(deq.size());
  g.download(s.g.data(), s.g.size());
  codes.download(s.codes.data(), s.codes.size());
  lin.download(s.lin.data(), s.lin.size());
  swz.download(s.swz.data(), s.swz.size());
  deq.download(reinterpret_cast<__nv_bfloat16*>(s.deq.data()), s.deq.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  return s;
}

class Sm90Stage : public ::testing::TestWithParam<std::tuple<bool, int64_t, int64_t>> {};

TEST_P(Sm90Stage, MatchesCpuQuantizerAndSimpleKernelByteForByte) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const auto [bf16, rows, cols] = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " bf16=" << bf16 << " rows=" << rows << " cols=" << cols);
  Rng rng(seed);
  std::vector<float> x = special_rows(rng, rows, cols);
  std::vector<Bf16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_from_float(x[i]);
  DeviceBuffer<uint8_t> dx(x.size() * 4);
  if (bf16) {
    NVFP4_CUDA_CHECK(cudaMemcpy(dx.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
  } else {
    NVFP4_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  }
  const int64_t deq_ld = cols + 64;  // a zero tail, as the GEMM operand rows have
  for (ActScope scope : {ActScope::PerRow, ActScope::Static}) {
    SCOPED_TRACE(scope == ActScope::PerRow ? "per-row" : "static");
    const Staged fast = run_stage(true, dx.get(), bf16, rows, cols, deq_ld, scope, 0.0123f);
    const Staged simple = run_stage(false, dx.get(), bf16, rows, cols, deq_ld, scope, 0.0123f);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_TRUE(same_g(fast.g[size_t(r)], simple.g[size_t(r)])) << "g of row " << r << ": " << fast.g[size_t(r)]
                                                                  << " vs " << simple.g[size_t(r)];
    EXPECT_BYTES_EQ(fast.codes.data(), simple.codes.data(), int64_t(fast.codes.size()), "codes vs simple kernel");
    EXPECT_BYTES_EQ(fast.lin.data(), simple.lin.data(), int64_t(fast.lin.size()), "linear scales vs simple kernel");
    EXPECT_BYTES_EQ(fast.swz.data(), simple.swz.data(), int64_t(fast.swz.size()), "swizzled scales vs simple kernel");
    EXPECT_BYTES_EQ(reinterpret_cast<const uint8_t*>(fast.deq.data()), reinterpret_cast<const uint8_t*>(simple.deq.data()),
                    int64_t(fast.deq.size() * 2), "BF16 operand vs simple kernel");
    const Staged deq_only = run_stage(true, dx.get(), bf16, rows, cols, deq_ld, scope, 0.0123f, {}, true);
    EXPECT_BYTES_EQ(reinterpret_cast<const uint8_t*>(deq_only.deq.data()),
                    reinterpret_cast<const uint8_t*>(simple.deq.data()), int64_t(deq_only.deq.size() * 2),
                    "BF16 operand without codes vs simple kernel");

    // The CPU quantizer (the spec in code) on the same rows and global scales.
    std::vector<uint8_t> codes(fast.codes.size()), scales(fast.lin.size());
    if (bf16) {
      quantize_rows(xb.data(), rows, cols, cols, fast.g.data(), 1, codes.data(), scales.data());
    } else {
      quantize_rows(x.data(), rows, cols, cols, fast.g.data(), 1, codes.data(), scales.data());
    }
    EXPECT_BYTES_EQ(fast.codes.data(), codes.data(), int64_t(codes.size()), "codes vs CPU quantize_rows");
    EXPECT_BYTES_EQ(fast.lin.data(), scales.data(), int64_t(scales.size()), "scales vs CPU quantize_rows");
    if (scope == ActScope::PerRow && rows > 8) {
      EXPECT_TRUE(std::isnan(fast.g[5]) || std::isinf(fast.g[5]) || fast.lin[size_t(5 * cols / 16)] == 0x7F)
          << "a NaN row must mark its scales";
      EXPECT_EQ(fast.g[6], 1.0f) << "a zero row has g = 1";
    }
    if (scope == ActScope::PerRow && rows > 11) {  // the rules themselves, whatever the CPU says
      const int64_t kb = cols / 16;
      EXPECT_EQ(fast.lin[size_t(10 * kb + 1)], 0x38) << "an all-zero block has scale 1.0";
      EXPECT_EQ(fast.lin[size_t(10 * kb + 2)], 0x38) << "a block of -0 has scale 1.0";
      for (int64_t i = 10 * cols / 2 + 8; i < 10 * cols / 2 + 24; ++i)
        EXPECT_EQ(fast.codes[size_t(i)], 0) << "codes of the zero blocks, byte " << i;
      EXPECT_EQ(fast.lin[size_t(11 * kb + 1)], 0x01) << "a block far below its row's maximum is clamped to 2^-9";
    }
    // Tail of every operand row is zero.
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_EQ(fast.deq[size_t(r * deq_ld + cols + 63)], 0) << "tail of operand row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90Stage,
                         ::testing::Values(std::make_tuple(true, int64_t(1), int64_t(7168)),
                                           std::make_tuple(true, int64_t(37), int64_t(7168)),
                                           std::make_tuple(false, int64_t(19), int64_t(3072)),
                                           std::make_tuple(true, int64_t(12), int64_t(48))));

// The wgmma kernel's operand order (operand_order.hpp): both staging kernels
// write exactly the logical bytes, each column pair moved by
// operand_kslot_column, when the device-side rule says so, and logical bytes
// otherwise.
TEST(Sm90Stage, KSlotOrderIsTheLogicalOperandPermuted) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int64_t rows = 9, cols = 1024, deq_ld = cols;
  std::vector<float> x = special_rows(rng, rows, cols);
  DeviceBuffer<float> dx(x.size());
  dx.upload(x.data(), x.size());
  const int32_t live = 100;
  DeviceBuffer<int32_t> dlive(1);
  dlive.upload(&live, 1);
  for (bool fast : {true, false}) {
    SCOPED_TRACE(fast ? "sm90_nvfp4_stage" : "quantize_activations_ref");
    const Staged logical = run_stage(fast, dx.get(), false, rows, cols, deq_ld, ActScope::PerRow, 0.0f);
    struct Case {
      OperandOrder order;
      bool kslot;
      const char* what;
    };
    const Case cases[] = {{OperandOrder{nullptr, -1}, true, "always"},
                          {OperandOrder{dlive.get(), live - 1}, true, "live above the threshold"},
                          {OperandOrder{dlive.get(), live}, false, "live at the threshold"}};
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      for (bool deq_only : {false, true}) {
        SCOPED_TRACE(deq_only ? "operand only" : "with codes");
        const Staged got =
            run_stage(fast, dx.get(), false, rows, cols, deq_ld, ActScope::PerRow, 0.0f, c.order, deq_only);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t col = 0; col < cols; ++col) {
            const int64_t at = c.kslot ? operand_kslot_column(col) : col;
            ASSERT_EQ(got.deq[size_t(r * deq_ld + at)], logical.deq[size_t(r * deq_ld + col)])
                << "row " << r << " column " << col << " (written at " << at << ")";
          }
      }
    }
  }
  // The permutation itself: inside a chunk, a bijection that keeps column pairs together.
  std::vector<int> seen(64, 0);
  for (int64_t c = 0; c < 64; ++c) {
    const int64_t k = operand_kslot_column(c);
    ASSERT_TRUE(k >= 0 && k < 64) << c;
    ++seen[size_t(k)];
    EXPECT_EQ(k % 2, c % 2) << "column " << c;
    EXPECT_EQ(operand_kslot_column(c + 64 * 5), k + 64 * 5) << "chunks move as a whole";
  }
  for (int k = 0; k < 64; ++k) EXPECT_EQ(seen[size_t(k)], 1) << "slot " << k;
  // Hand-worked: block t = 1 (columns 16..31), k-step s = 2, second pair (h = 1): columns 26, 27 -> slots 2t + 8 + 16s = 42, 43.
  EXPECT_EQ(operand_kslot_column(26), 42);
  EXPECT_EQ(operand_kslot_column(27), 43);
  EXPECT_EQ(operand_kslot_column(0), 0);
  EXPECT_EQ(operand_kslot_column(16), 2);  // block 1, step 0, first pair: k-slots 2, 3
}

// ---- The operand path (BF16 operand + g only) against the CPU quantizer ----

// The operand rows docs/numerics.md §2 gives for rows of x (row stride ld) under
// the global scales g: value(q) * f32(s) as BF16 at each column's place in
// `kslot` or logical order, then zeros up to deq_ld.
template <typename T>
std::vector<uint16_t> cpu_operand_rows(const T* x, int64_t rows, int64_t cols, int64_t ld, const std::vector<float>& g,
                                       int64_t deq_ld, bool kslot) {
  std::vector<uint8_t> codes(size_t(rows * cols / 2)), scales(size_t(rows * cols / 16));
  quantize_rows(x, rows, cols, ld, g.data(), 1, codes.data(), scales.data());
  std::vector<uint16_t> out(size_t(rows * deq_ld), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t q = (codes[size_t(r * cols / 2 + c / 2)] >> (4 * (c & 1))) & 15;
      const float v = fmt::e2m1_value(q) * fmt::e4m3_value(scales[size_t(r * cols / 16 + c / 16)]);
      out[size_t(r * deq_ld + (kslot ? operand_kslot_column(c) : c))] = bf16_from_float(v).bits;
    }
  return out;
}

// The first operand element that differs (NaN matches any NaN), with its row and column.
void expect_same_operand(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int64_t rows,
                         int64_t deq_ld) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < deq_ld; ++c) {
      const uint16_t a = got[size_t(r * deq_ld + c)], b = want[size_t(r * deq_ld + c)];
      if (std::isnan(bf16_to_float(Bf16{a})) && std::isnan(bf16_to_float(Bf16{b}))) continue;
      ASSERT_EQ(a, b) << "operand row " << r << " element " << c << " (deq_ld " << deq_ld << ")";
    }
}

// The global scale the spec gives a row: amax / 2688 per row, or the static g.
template <typename T>
std::vector<float> cpu_row_scales(const T* x, int64_t rows, int64_t cols, int64_t ld, bool per_row, float static_g) {
  std::vector<float> g(size_t(rows), static_g);
  if (per_row)
    for (int64_t r = 0; r < rows; ++r) g[size_t(r)] = global_scale_for_amax(abs_max(x + r * ld, cols));
  return g;
}

struct OperandCase {
  bool bf16;
  int64_t rows, cols;
  bool kslot, per_row;
  const char* what;
};

// Single rows (one thread per block) and more rows than fit on the GPU at
// once (CTAs of at most 128 threads, each through both stages several times;
// K=8192: every thread quantizes 4 blocks a row; K=1088: a warp with live and
// dead lanes), logical and k-slot order, a zero tail, NaN / Inf / zero / tiny
// rows (tiny BF16 values take the packed domain check's fallback).
TEST(Sm90StageOperand, MatchesTheCpuQuantizerByteForByte) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const OperandCase cases[] = {
      {true, 1, 7168, false, true, "one row, logical"},
      {true, 1, 7168, true, true, "one row holding NaN, k-slot"},
      {true, 1, 7168, true, false, "one row, k-slot, static g"},
      {true, 3000, 7168, true, true, "many rows, k-slot"},
      {true, 3000, 7168, false, false, "many rows, logical, static g"},
      {false, 2000, 3072, true, true, "FP32 rows, k-slot"},
      {false, 300, 1024, false, false, "FP32 rows, logical, static g"},
      {true, 1000, 8192, true, true, "K=8192: every thread holds four blocks"},
      {false, 1000, 7168, true, true, "FP32 K=7168: 28 KB rows, 3.5 blocks a thread"},
      {true, 400, 7168, true, true, "400 rows: 3-4 rows a CTA"},
      {true, 200, 1088, true, true, "K=1088: 68 blocks on 96 threads, a partial last warp"},
      {false, 3000, 1088, false, true, "FP32 K=1088, many rows on 96 threads"},
  };
  for (const OperandCase& oc : cases) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(::testing::Message() << oc.what << ": seed " << seed << " bf16=" << oc.bf16 << " rows=" << oc.rows
                                      << " cols=" << oc.cols);
    Rng rng(seed);
    std::vector<float> x = special_rows(rng, oc.rows, oc.cols);
    if (oc.rows == 1 && oc.kslot && oc.per_row) x[size_t(oc.cols / 2 + 5)] = std::nanf("");
    std::vector<Bf16> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_from_float(x[i]);
    DeviceBuffer<uint8_t> dx(x.size() * 4);
    if (oc.bf16) {
      NVFP4_CUDA_CHECK(cudaMemcpy(dx.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
    } else {
      NVFP4_CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    }
    const int64_t deq_ld = oc.cols + 64;
    const float static_g = 0.0123f;
    const ActScope scope = oc.per_row ? ActScope::PerRow : ActScope::Static;
    const OperandOrder order = oc.kslot ? OperandOrder{nullptr, -1} : OperandOrder{};
    const Staged got = run_stage(true, dx.get(), oc.bf16, oc.rows, oc.cols, deq_ld, scope, static_g, order, true);

    const std::vector<float> g = oc.bf16 ? cpu_row_scales(xb.data(), oc.rows, oc.cols, oc.cols, oc.per_row, static_g)
                                         : cpu_row_scales(x.data(), oc.rows, oc.cols, oc.cols, oc.per_row, static_g);
    for (int64_t r = 0; r < oc.rows; ++r)
      ASSERT_TRUE(same_g(got.g[size_t(r)], g[size_t(r)]))
          << "g of row " << r << ": " << got.g[size_t(r)] << " vs " << g[size_t(r)];
    const std::vector<uint16_t> want =
        oc.bf16 ? cpu_operand_rows(xb.data(), oc.rows, oc.cols, oc.cols, g, deq_ld, oc.kslot)
                : cpu_operand_rows(x.data(), oc.rows, oc.cols, oc.cols, g, deq_ld, oc.kslot);
    expect_same_operand(got.deq, want, oc.rows, deq_ld);
    if (oc.rows == 1 && oc.kslot && oc.per_row) EXPECT_TRUE(std::isnan(got.g[0])) << "a NaN row has a NaN g";
  }
}

// Inputs of the requantization tests: rows_max rows of special values (row
// stride cols + 4), each row's expert among the static scales gE, and the
// device count of live rows; args() describes them, written to fresh,
// 0xFF-poisoned g and operand buffers (deq_ld = cols + 64).
struct RequantCase {
  int64_t rows_max, cols, ld_h, deq_ld;
  int32_t live;
  std::vector<float> h, gE;
  std::vector<int32_t> row_expert;
  DeviceBuffer<float> dh, dgE, dg;
  DeviceBuffer<int32_t> dn, dre;
  DeviceBuffer<__nv_bfloat16> deq;

  RequantCase(Rng& rng, int64_t rows, int32_t live_rows, int64_t k, std::vector<float> expert_g)
      : rows_max(rows), cols(k), ld_h(k + 4), deq_ld(k + 64), live(live_rows), gE(std::move(expert_g)) {
    h = special_rows(rng, rows_max, ld_h);
    row_expert.resize(static_cast<size_t>(rows_max));
    for (auto& e : row_expert) e = int32_t(rng.below(uint64_t(gE.size())));
    dh = DeviceBuffer<float>(h.size());
    dgE = DeviceBuffer<float>(gE.size());
    dh.upload(h.data(), h.size());
    dgE.upload(gE.data(), gE.size());
    dn = DeviceBuffer<int32_t>(1);
    dre = DeviceBuffer<int32_t>(row_expert.size());
    dn.upload(&live, 1);
    dre.upload(row_expert.data(), row_expert.size());
  }

  RequantRowsArgs args(bool static_g, bool kslot) {
    dg = DeviceBuffer<float>(static_cast<size_t>(rows_max));
    deq = DeviceBuffer<__nv_bfloat16>(size_t(rows_max * deq_ld));
    NVFP4_CUDA_CHECK(cudaMemset(deq.get(), 0xFF, deq.bytes()));
    NVFP4_CUDA_CHECK(cudaMemset(dg.get(), 0xFF, dg.bytes()));
    RequantRowsArgs a;
    a.h = dh.get();
    a.ld_h = ld_h;
    a.cols = cols;
    a.rows_max = rows_max;
    a.num_rows = dn.get();
    a.static_g_per_expert = static_g ? dgE.get() : nullptr;
    a.row_expert = dre.get();
    a.g_out = dg.get();
    a.deq = deq.get();
    a.deq_ld = deq_ld;
    if (kslot) a.deq_order = OperandOrder{dn.get(), live - 1};
    return a;
  }
};

TEST(Sm90Requant, MatchesSimpleKernelAndLeavesDeadRowsAlone) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  RequantCase rc(rng, 50, 41, 3072, {0.01f, 0.02f, 0.5f});
  const int64_t rows_max = rc.rows_max, live = rc.live, cols = rc.cols, deq_ld = rc.deq_ld;
  std::vector<uint16_t> logical;  // mode 0's operand, for the k-slot check
  for (int mode = 0; mode < 3; ++mode) {
    const bool static_g = mode == 1, kslot = mode == 2;
    SCOPED_TRACE(static_g ? "static per expert" : (kslot ? "dynamic per row, k-slot order" : "dynamic per row"));
    std::vector<uint16_t> out[2];
    std::vector<float> g[2];
    for (int fast = 0; fast < 2; ++fast) {
      RequantRowsArgs a = rc.args(static_g, kslot);
      DeviceBuffer<float>& dg = rc.dg;
      DeviceBuffer<__nv_bfloat16>& deq = rc.deq;
      if (fast) {
        ASSERT_TRUE(sm90_nvfp4_requant_supports(a));
        sm90_nvfp4_requant(a, nullptr);
      } else {
        requantize_rows_ref(a, nullptr);
      }
      NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
      out[fast].resize(deq.size());
      g[fast].resize(size_t(rows_max));
      deq.download(reinterpret_cast<__nv_bfloat16*>(out[fast].data()), out[fast].size());
      dg.download(g[fast].data(), g[fast].size());
      NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
    }
    for (int64_t r = 0; r < rows_max; ++r) ASSERT_TRUE(same_g(g[0][size_t(r)], g[1][size_t(r)])) << "g of row " << r;
    EXPECT_BYTES_EQ(reinterpret_cast<const uint8_t*>(out[1].data()), reinterpret_cast<const uint8_t*>(out[0].data()),
                    int64_t(out[0].size() * 2), "requantized operand vs simple kernel");
    EXPECT_EQ(out[1][size_t(live * deq_ld)], 0xFFFF) << "row past num_rows was written";
    if (mode == 0) logical = out[1];
    if (kslot)
      for (int64_t r = 0; r < live; ++r)
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(out[1][size_t(r * deq_ld + operand_kslot_column(c))], logical[size_t(r * deq_ld + c)])
              << "row " << r << " column " << c;
  }
}

// The requantization entry on more rows than fit on the GPU at once, fewer
// of them live (*num_rows) than rows_max: per-row g in k-slot order, the
// static g of each row's expert in logical order, against the CPU quantizer;
// rows past *num_rows keep their bytes (g and operand).
TEST(Sm90Requant, ManyRowsMatchTheCpuQuantizerByteForByte) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  RequantCase rc(rng, 2500, 2100, 3072, {0.01f, 0.02f, 0.5f, 3e-5f, 7.0f});
  const int64_t rows_max = rc.rows_max, live = rc.live, cols = rc.cols, ld_h = rc.ld_h, deq_ld = rc.deq_ld;
  const std::vector<float>& h = rc.h;
  for (bool static_g : {false, true}) {
    const bool kslot = !static_g;
    SCOPED_TRACE(static_g ? "static per expert, logical" : "dynamic per row, k-slot order");
    RequantRowsArgs a = rc.args(static_g, kslot);
    DeviceBuffer<float>& dg = rc.dg;
    DeviceBuffer<__nv_bfloat16>& deq = rc.deq;
    ASSERT_TRUE(sm90_nvfp4_requant_supports(a));
    sm90_nvfp4_requant(a, nullptr);
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(deq.size());
    std::vector<float> g(static_cast<size_t>(rows_max));
    deq.download(reinterpret_cast<__nv_bfloat16*>(got.data()), got.size());
    dg.download(g.data(), g.size());
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());

    std::vector<float> want_g = cpu_row_scales(h.data(), live, cols, ld_h, !static_g, 0.0f);
    if (static_g)
      for (int64_t r = 0; r < live; ++r) want_g[size_t(r)] = rc.gE[size_t(rc.row_expert[size_t(r)])];
    for (int64_t r = 0; r < live; ++r)
      ASSERT_TRUE(same_g(g[size_t(r)], want_g[size_t(r)])) << "g of row " << r << ": " << g[size_t(r)] << " vs "
                                                            << want_g[size_t(r)];
    expect_same_operand(got, cpu_operand_rows(h.data(), live, cols, ld_h, want_g, deq_ld, kslot), live, deq_ld);
    for (int64_t r = live; r < rows_max; ++r) {
      ASSERT_TRUE(std::isnan(g[size_t(r)])) << "g of row " << r << " past num_rows was written";
      ASSERT_EQ(got[size_t(r * deq_ld)], 0xFFFF) << "row " << r << " past num_rows was written";
      ASSERT_EQ(got[size_t(r * deq_ld + deq_ld - 1)], 0xFFFF) << "tail of row " << r << " past num_rows was written";
    }
  }
}

TEST(Sm90Stage, RefusesWhatItDoesNotSupport) {
  QuantizeActArgs a;
  a.cols = 16 * 1025;  // more blocks than threads per row
  EXPECT_FALSE(sm90_nvfp4_stage_supports(a));
  a.cols = 7168;
  a.scope = ActScope::PerTensor;
  EXPECT_FALSE(sm90_nvfp4_stage_supports(a));
  try {
    sm90_nvfp4_stage(a, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K=7168"), std::string::npos) << e.what();
  }
  a = QuantizeActArgs{};
  a.cols = 16 * 513;  // one thread per block, at most 512 a row
  EXPECT_FALSE(sm90_nvfp4_stage_supports(a));
}

// K-slot order permutes whole 64-column chunks: a row of 48 columns is
// refused before anything is queued (host only).
TEST(Sm90Stage, KSlotOrderNeedsWholeChunks) {
  alignas(16) static uint8_t bytes[256] = {};
  QuantizeActArgs a;
  a.x = bytes;
  a.x_is_bf16 = true;
  a.rows = 1;
  a.cols = 48;
  a.scope = ActScope::PerRow;
  a.g_out = reinterpret_cast<float*>(bytes);
  a.deq = reinterpret_cast<__nv_bfloat16*>(bytes);
  a.deq_ld = 48;
  a.deq_order = OperandOrder{nullptr, -1};  // always k-slot
  ASSERT_TRUE(sm90_nvfp4_stage_supports(a));
  EXPECT_ERROR_CONTAINS(sm90_nvfp4_stage(a, nullptr), "multiple of 64", "K=48");
}

}  // namespace
}  // namespace nvfp4moe::cuda
