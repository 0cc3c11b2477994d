// `nvfp4moe quantize --device cuda` writes the same files as the host, byte
// for byte (amaxes, the shared gate/up scale, codes and block scales come
// from the GPU's quantizer, the host's formula), and refuses a tensor with
// a NaN naming it, leaving no output.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!::nvfp4moe::cuda_available()) GTEST_SKIP() << "no CUDA device"

std::string q(const std::string& p) { return "'" + p + "'"; }

std::vector<Bf16> random_bf16(test::Rng& rng, int64_t n, float scale) {
  std::vector<Bf16> v;
  for (float x : test::random_normal(rng, n, scale)) v.push_back(bf16_from_float(x));
  return v;
}

// A two-shard DeepSeek-named BF16 layer: two experts, w1 and w3 of expert 0
// in different shards, and an attention weight that stays BF16.
void write_model(const std::string& dir, test::Rng& rng, bool nan_in_w2) {
  const int64_t H = 1024, I = 512;
  const std::string ffn = "layers.0.ffn.experts.";
  std::vector<std::vector<Bf16>> t;
  for (int i = 0; i < 7; ++i) t.push_back(random_bf16(rng, I * H, i == 1 ? 3.0f : 1.0f));
  if (nan_in_w2) t[2][12345] = Bf16{0x7fc0};
  SafetensorsWriter s1, s2;
  s1.add(ffn + "0.w1.weight", DType::BF16, {I, H}, t[0].data());
  s2.add(ffn + "0.w3.weight", DType::BF16, {I, H}, t[1].data());
  s1.add(ffn + "0.w2.weight", DType::BF16, {H, I}, t[2].data());
  s1.add(ffn + "1.w1.weight", DType::BF16, {I, H}, t[3].data());
  s1.add(ffn + "1.w3.weight", DType::BF16, {I, H}, t[4].data());
  s2.add(ffn + "1.w2.weight", DType::BF16, {H, I}, t[5].data());
  s2.add("layers.0.attn.wq.weight", DType::BF16, {I, H}, t[6].data());
  s1.write(dir + "/model-00001-of-00002.safetensors");
  s2.write(dir + "/model-00002-of-00002.safetensors");
  json::Value map = json::Value::object();
  for (const char* n : {"0.w1.weight", "0.w2.weight", "1.w1.weight", "1.w3.weight"})
    map.set(ffn + n, json::Value::string("model-00001-of-00002.safetensors"));
  for (const std::string& n : {ffn + "0.w3.weight", ffn + "1.w2.weight", std::string("layers.0.attn.wq.weight")})
    map.set(n, json::Value::string("model-00002-of-00002.safetensors"));
  test::write_text(dir + "/model.safetensors.index.json",
                   json::dump(json::Value::object({{"metadata", json::Value::object()}, {"weight_map", map}})));
  test::write_text(dir + "/config.json", R"({"hidden_size": 1024, "moe_intermediate_size": 512,
      "n_routed_experts": 2, "num_experts_per_tok": 1, "num_hash_layers": 0, "swiglu_limit": 10.0})");
}

TEST(CliQuantizeCuda, SameFilesAsTheHost) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  test::ScratchDir in, out;
  write_model(in.path(), rng, false);
  const test::ToolRun host = test::run_tool("quantize --in " + q(in.path()) + " --out " + q(out / "host"));
  ASSERT_EQ(host.code, 0) << host.err;
  const test::ToolRun gpu =
      test::run_tool("quantize --device cuda --in " + q(in.path()) + " --out " + q(out / "gpu"));
  ASSERT_EQ(gpu.code, 0) << gpu.err;
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                        "model.safetensors.index.json", "config.json", "hf_quant_config.json"})
    EXPECT_EQ(test::read_bytes(out / "gpu" + "/" + f), test::read_bytes(out / "host" + "/" + f)) << f;
}

TEST(CliQuantizeCuda, NanIsRefusedNamingTheTensor) {
  SKIP_WITHOUT_GPU();
  test::Rng rng(test::fresh_seed());
  test::ScratchDir in, out;
  write_model(in.path(), rng, true);
  const test::ToolRun r = test::run_tool("quantize --device cuda --in " + q(in.path()) + " --out " + q(out / "q"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("layers.0.ffn.experts.0.w2.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("NaN"), std::string::npos) << r.err;
}

// Without a GPU the option is refused with a message, before any output.
TEST(CliQuantizeCuda, WithoutAGpuTheOptionIsRefused) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  test::Rng rng(test::fresh_seed());
  test::ScratchDir in, out;
  write_model(in.path(), rng, false);
  const test::ToolRun r = test::run_tool("quantize --device cuda --in " + q(in.path()) + " --out " + q(out / "q"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("no CUDA device"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out / "q"));
}

}  // namespace
}  // namespace nvfp4moe
