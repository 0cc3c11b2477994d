// Bad input to the CPU MoE (docs/numerics.md §6): each case throws before any work
// with a message naming the argument and the offending values, and leaves the
// output untouched.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

struct Fixture {
  MoeConfig c = small_config(64, 32, 8, 2);
  int64_t T = 4, H = 64, k = 2;
  std::vector<float> x = std::vector<float>(size_t(4 * 64), 0.5f);
  std::vector<Bf16> y = std::vector<Bf16>(size_t(4 * 64), Bf16{kPoisonBf16});
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> wts = std::vector<float>(8, 0.5f);
  TensorView xv() { return make_view(x.data(), DType::F32, {T, H}); }
  ForwardOutputs out() {
    ForwardOutputs o;
    o.y = make_view(y.data(), DType::BF16, {T, H});
    return o;
  }
  RoutingArgs routing() {
    RoutingArgs r;
    r.topk_ids = make_view(ids.data(), DType::I32, {T, k});
    r.topk_weights = make_view(wts.data(), DType::F32, {T, k});
    return r;
  }
  bool y_untouched() const {
    for (Bf16 b : y)
      if (b.bits != kPoisonBf16) return false;
    return true;
  }
};

TEST(CpuMoeErrors, ExpertIdOutOfRangeNamesTokenSlotAndId) {
  Fixture f;
  Moe moe(make_synthetic_moe(f.c, 1), MoeOptions{});
  f.ids[5] = 8;  // token 2 slot 1
  expect_error([&] { moe.forward(f.xv(), f.routing(), f.out()); }, {"token 2", "slot 1", "expert id 8", "E=8"});
  f.ids[5] = -2;
  expect_error([&] { moe.forward(f.xv(), f.routing(), f.out()); }, {"token 2", "slot 1", "expert id -2"});
  EXPECT_TRUE(f.y_untouched()) << "a failed call must not write the output";
  // int64 ids beyond int32 are caught before narrowing.
  std::vector<int64_t> ids64(f.ids.begin(), f.ids.end());
  ids64[5] = int64_t(1) << 33;
  RoutingArgs r = f.routing();
  r.topk_ids = make_view(ids64.data(), DType::I64, {f.T, f.k});
  expect_error([&] { moe.forward(f.xv(), r, f.out()); }, {"token 2", "slot 1", "8589934592"});
}

TEST(CpuMoeErrors, ShapesDtypesDevicesStrides) {
  Fixture f;
  Moe moe(make_synthetic_moe(f.c, 1), MoeOptions{});
  RoutingArgs none;
  // x: wrong H, wrong rank, wrong dtype, on cuda, non-contiguous.
  expect_error([&] { moe.forward(make_view(f.x.data(), DType::F32, {8, 32}), none, f.out()); }, {"x", "[8, 32]", "64"});
  expect_error([&] { moe.forward(make_view(f.x.data(), DType::F32, {256}), none, f.out()); }, {"x", "[256]"});
  expect_error([&] { moe.forward(make_view(f.x.data(), DType::F16, {f.T, f.H}), none, f.out()); },
               {"x", "F16", "BF16", "F32"});
  expect_error([&] { moe.forward(make_view(f.x.data(), DType::F32, {f.T, f.H}, DeviceKind::Cuda), none, f.out()); },
               {"x", "cuda", "cpu"});
  TensorView strided = make_view(f.x.data(), DType::F32, {f.T / 2, f.H});
  strided.strides[0] = 2 * f.H;  // every other row
  ForwardOutputs half;
  half.y = make_view(f.y.data(), DType::BF16, {f.T / 2, f.H});
  expect_error([&] { moe.forward(strided, none, half); }, {"x", "contiguous", "strides [128, 1]"});
  // y: wrong dtype / shape, missing.
  ForwardOutputs o = f.out();
  o.y.dtype = DType::F32;
  expect_error([&] { moe.forward(f.xv(), none, o); }, {"y", "F32", "BF16"});
  o = f.out();
  o.y = make_view(f.y.data(), DType::BF16, {f.T - 1, f.H});
  expect_error([&] { moe.forward(f.xv(), none, o); }, {"y", "[3, 64]"});
  expect_error([&] { moe.forward(f.xv(), none, ForwardOutputs{}); }, {"y", "required"});
  // routing: float ids, wrong k, ids without weights.
  RoutingArgs r = f.routing();
  r.topk_ids.dtype = DType::F32;
  expect_error([&] { moe.forward(f.xv(), r, f.out()); }, {"topk_ids", "F32", "I32", "I64"});
  r = f.routing();
  r.topk_ids = make_view(f.ids.data(), DType::I32, {f.T * 2, 1});
  expect_error([&] { moe.forward(f.xv(), r, f.out()); }, {"topk_ids", "[8, 1]"});
  r = f.routing();
  r.topk_weights = TensorView{};
  expect_error([&] { moe.forward(f.xv(), r, f.out()); }, {"topk_ids and topk_weights"});
  r = f.routing();
  r.topk_weights.dtype = DType::BF16;
  expect_error([&] { moe.forward(f.xv(), r, f.out()); }, {"topk_weights", "BF16"});
  // optional outputs.
  o = f.out();
  std::vector<int64_t> ids_out(8);
  o.topk_ids = make_view(ids_out.data(), DType::I64, {f.T, f.k});
  expect_error([&] { moe.forward(f.xv(), none, o); }, {"out topk_ids", "I64", "I32"});
  EXPECT_TRUE(f.y_untouched());
}

TEST(CpuMoeErrors, HashLayerNeedsTokenIdsInVocab) {
  Fixture f;
  f.c.hash_routed = true;
  MoeWeights w = make_synthetic_moe(f.c, 1);
  Moe moe(w, MoeOptions{});
  expect_error([&] { moe.forward(f.xv(), RoutingArgs{}, f.out()); }, {"token_ids", "hash-routed", "required"});
  std::vector<int32_t> tok = {0, 1, int32_t(kSyntheticVocab), 3};
  RoutingArgs r;
  r.token_ids = make_view(tok.data(), DType::I32, {f.T});
  expect_error([&] { moe.forward(f.xv(), r, f.out()); }, {"token 2", "token id 4096", "vocab=4096"});
  tok[2] = -5;
  expect_error([&] { moe.forward(f.xv(), r, f.out()); }, {"token 2", "-5"});
  std::vector<float> tokf(4);
  r.token_ids = make_view(tokf.data(), DType::F32, {f.T});
  expect_error([&] { moe.forward(f.xv(), r, f.out()); }, {"token_ids", "F32"});
  EXPECT_TRUE(f.y_untouched());
  // Caller routing makes token_ids unnecessary.
  EXPECT_NO_THROW(moe.forward(f.xv(), f.routing(), f.out()));
  // tid2eid out of range is rejected when the layer is built.
  w.router.tid2eid[7] = 8;
  expect_error([&] { Moe bad(w, MoeOptions{}); }, {"tid2eid[3][1]", "= 8", "E=8"});
}

TEST(CpuMoeErrors, WeightsAndConfig) {
  Fixture f;
  MoeWeights w = make_synthetic_moe(f.c, 1);
  MoeWeights bad = w;
  bad.experts.w2_global[3] = NAN;
  expect_error([&] { Moe m(bad, MoeOptions{}); }, {"w2", "expert 3", "nan"});
  bad = w;
  bad.router.gate.resize(10);
  expect_error([&] { Moe m(bad, MoeOptions{}); }, {"gate", "10", "[8, 64]"});
  bad = w;
  bad.router.gate[70] = INFINITY;
  expect_error([&] { Moe m(bad, MoeOptions{}); }, {"gate", "[1, 6]", "inf"});
  bad = w;
  bad.config.l1_input = InputScaleMode::Static;
  bad.experts.w13_input_scale.clear();
  expect_error([&] { Moe m(bad, MoeOptions{}); }, {"static", "input_scale"});
  bad = w;
  bad.shared.w2.resize(5);
  expect_error([&] { Moe m(bad, MoeOptions{}); }, {"shared", "w2=5"});
  bad = w;
  bad.config.hidden = 72;
  expect_error([&] { Moe m(bad, MoeOptions{}); }, {"H", "72"});
}

}  // namespace
}  // namespace nvfp4moe::test
