// The format subcommands of the built `nvfp4moe` tool (NVFP4MOE_CLI_PATH):
// quantize bytes equal quantize_matrix bytes computed here on fresh random
// input, a hand-worked golden block, sharded directories, dequantize values,
// inspect output, and failures that exit non-zero with a message naming the
// problem while leaving an existing output file untouched.
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "checkpoint/checkpoint_files.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::read_bytes;
using test::ScratchDir;

struct CliResult {
  int code = -1;
  std::string out, err;
};

CliResult run_cli(const std::string& args) {
  ScratchDir logs;
  const std::string cmd = std::string(NVFP4MOE_CLI_PATH) + " " + args + " >" + (logs / "out") + " 2>" + (logs / "err");
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto text = [](const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); };
  r.out = text(read_bytes(logs / "out"));
  r.err = text(read_bytes(logs / "err"));
  return r;
}

const std::string kGate = "model.layers.1.mlp.experts.0.gate_proj";
const std::string kDown = "model.layers.1.mlp.experts.0.down_proj";

std::string fileio_text(const std::string& path) {
  const auto b = read_bytes(path);
  return std::string(b.begin(), b.end());
}

std::string q(const std::string& path) { return "'" + path + "'"; }

void expect_triple_equals(const SafetensorsFile& f, const std::string& prefix, const Nvfp4Matrix& want) {
  SCOPED_TRACE(prefix);
  const TensorInfo& w = f.get(prefix + ".weight");
  const TensorInfo& s = f.get(prefix + ".weight_scale");
  const TensorInfo& g = f.get(prefix + ".weight_scale_2");
  EXPECT_EQ(w.dtype, DType::U8);
  EXPECT_EQ(w.shape, (std::vector<int64_t>{want.rows, want.cols / 2}));
  EXPECT_EQ(s.dtype, DType::F8E4M3);
  EXPECT_EQ(s.shape, (std::vector<int64_t>{want.rows, want.cols / 16}));
  EXPECT_EQ(g.dtype, DType::F32);
  EXPECT_TRUE(g.shape.empty());
  ASSERT_EQ(w.nbytes, want.codes.size());
  ASSERT_EQ(s.nbytes, want.scales.size());
  EXPECT_BYTES_EQ(w.data, want.codes.data(), int64_t(w.nbytes), "codes");
  EXPECT_BYTES_EQ(s.data, want.scales.data(), int64_t(s.nbytes), "scales");
  float gv;
  std::memcpy(&gv, g.data, 4);
  EXPECT_EQ(gv, want.global_scale[0]);
}

TEST(CliQuantize, BytesEqualQuantizeMatrixOnFreshInput) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir dir;
  const int64_t N = 48, K = 64;
  std::vector<float> gate = test::random_normal(rng, N * K, 0.02f);
  std::vector<Bf16> down(size_t(K * N));
  for (auto& v : down) v = bf16_from_float(rng.normal() * 3.0f);
  std::vector<float> other = test::random_normal(rng, 7);
  std::vector<float> attn = test::random_normal(rng, 16 * 16);  // 2-D floating but not matched
  SafetensorsWriter w;
  w.add(kGate + ".weight", DType::F32, {N, K}, gate.data());
  w.add(kDown + ".weight", DType::BF16, {K, N}, down.data());
  w.add("model.norm.weight", DType::F32, {7}, other.data());
  w.add("model.layers.1.self_attn.o_proj.weight", DType::F32, {16, 16}, attn.data());
  w.set_metadata("format", "pt");
  w.write(dir / "in.safetensors");

  CliResult r = run_cli("quantize --in " + q(dir / "in.safetensors") + " --out " + q(dir / "out.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");  // no progress bar when stderr is not a TTY
  SafetensorsFile f(dir / "out.safetensors");
  expect_triple_equals(f, kGate, quantize_matrix(gate.data(), N, K, ScaleScope::PerTensor, 1.0f, true));
  expect_triple_equals(f, kDown, quantize_matrix(down.data(), K, N, ScaleScope::PerTensor, 1.0f, true));
  // Unmatched tensors are copied unchanged, metadata kept.
  EXPECT_EQ(f.get("model.norm.weight").to_f32(), other);
  EXPECT_EQ(f.get("model.layers.1.self_attn.o_proj.weight").to_f32(), attn);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.tensors().size(), 8u);

  // dequantize: BF16 values of value(q) * e4m3(s) * g.
  r = run_cli("dequantize --in " + q(dir / "out.safetensors") + " --out " + q(dir / "deq.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  SafetensorsFile d(dir / "deq.safetensors");
  EXPECT_EQ(d.tensors().size(), 4u);
  const TensorInfo& dg = d.get(kGate + ".weight");
  EXPECT_EQ(dg.dtype, DType::BF16);
  EXPECT_EQ(dg.shape, (std::vector<int64_t>{N, K}));
  const Nvfp4Matrix m = quantize_matrix(gate.data(), N, K, ScaleScope::PerTensor, 1.0f, true);
  std::vector<float> got = dg.to_f32();
  for (int64_t i = 0; i < N * K; ++i) {
    const uint8_t byte = m.codes[size_t(i / 2)];
    const float code_value = e2m1_decode(i % 2 ? byte >> 4 : byte & 0xF);
    const float want = code_value * e4m3_decode(m.scales[size_t(i / 16)]) * m.global_scale[0];
    ASSERT_EQ(got[size_t(i)], bf16_to_float(bf16_from_float(want))) << "element " << i;
  }
  EXPECT_LT(test::rel_l2(got, gate), 0.2);  // and it is near the original (4-bit)
  EXPECT_EQ(d.get("model.norm.weight").to_f32(), other);
}

TEST(CliQuantize, HandWorkedGoldenBlock) {
  // Row 0: amax 6 -> g = 6/(6*448) = 1/448, s = e4m3(1/g) = 448 (0x7E), d = 1,
  //        codes are the E2M1 codes of the values themselves; -0.25 is a tie
  //        that rounds to magnitude 0 but keeps the sign bit (0x8).
  // Row 1: amax 1 -> s = e4m3((1/6)*448 = 74.67) = 72 (0x69), d = 72/448;
  //        1/d = 6.22 -> code 7 (6), 0.5/d = 3.11 -> code 5 (3).
  const std::vector<float> x = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -6, -4, -3, -2, -1.5f, -1, -0.5f, -0.25f,
                                1, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  ScratchDir dir;
  SafetensorsWriter w;
  w.add("blk.weight", DType::F32, {2, 16}, x.data());
  w.write(dir / "in.safetensors");
  CliResult r = run_cli("quantize --include 'blk' --in " + q(dir / "in.safetensors") + " --out " + q(dir / "out.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  SafetensorsFile f(dir / "out.safetensors");
  const std::vector<uint8_t> codes = {0x10, 0x32, 0x54, 0x76, 0xEF, 0xCD, 0xAB, 0x89,
                                      0x57, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55, 0x55};
  const std::vector<uint8_t> scales = {0x7E, 0x69};
  EXPECT_EQ(std::vector<uint8_t>(f.get("blk.weight").data, f.get("blk.weight").data + 16), codes);
  EXPECT_EQ(std::vector<uint8_t>(f.get("blk.weight_scale").data, f.get("blk.weight_scale").data + 2), scales);
  float g;
  std::memcpy(&g, f.get("blk.weight_scale_2").data, 4);
  EXPECT_EQ(g, 6.0f / (6.0f * 448.0f));
}

TEST(CliQuantize, FailuresExitNonZeroAndLeaveOutputIntact) {
  ScratchDir dir;
  const std::vector<uint8_t> old_bytes = {'o', 'l', 'd'};
  const std::string out = dir / "out.safetensors";
  struct Case {
    const char* label;
    std::vector<float> values;
    int64_t rows, cols;
    std::vector<const char*> message;
  };
  std::vector<float> nan_values(32, 1.0f);
  nan_values[21] = NAN;
  std::vector<float> inf_values(32, 1.0f);
  inf_values[3] = -INFINITY;
  const Case cases[] = {
      {"NaN in a weight", nan_values, 2, 16, {kGate.c_str(), "non-finite", "index 21"}},
      {"Inf in a weight", inf_values, 2, 16, {kGate.c_str(), "non-finite", "index 3"}},
      {"K not a multiple of 16", std::vector<float>(24, 1.0f), 2, 12, {kGate.c_str(), "K=12", "multiple of 16"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    test::write_bytes(out, old_bytes);
    SafetensorsWriter w;
    w.add(kGate + ".weight", DType::F32, {c.rows, c.cols}, c.values.data());
    w.write(dir / "in.safetensors");
    CliResult r = run_cli("quantize --in " + q(dir / "in.safetensors") + " --out " + q(out));
    EXPECT_EQ(r.code, 1);
    for (const char* want : c.message) EXPECT_NE(r.err.find(want), std::string::npos) << r.err << " lacks " << want;
    EXPECT_EQ(read_bytes(out), old_bytes);
  }
  // Malformed input files, unknown options and missing arguments.
  test::write_bytes(dir / "bad.safetensors", {1, 2, 3});
  CliResult r = run_cli("quantize --in " + q(dir / "bad.safetensors") + " --out " + q(out));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("truncated"), std::string::npos) << r.err;
  EXPECT_EQ(read_bytes(out), old_bytes);
  r = run_cli("quantize --in " + q(dir / "in.safetensors"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("missing required option --out"), std::string::npos) << r.err;
  r = run_cli("quantize --in a --out b --bogus 1");
  EXPECT_NE(r.err.find("unknown option --bogus"), std::string::npos) << r.err;
  r = run_cli("quantize --in a --out b --include '('");
  EXPECT_NE(r.err.find("--include '(': missing ')' at offset 1"), std::string::npos) << r.err;
  r = run_cli("inspect " + q(dir / "nope.safetensors"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("nope.safetensors: cannot open"), std::string::npos) << r.err;
}

TEST(CliDequantize, BadGlobalScaleOrMissingCodesFailCleanly) {
  ScratchDir dir;
  const std::string out = dir / "out.safetensors";
  const std::vector<uint8_t> old_bytes = {'k', 'e', 'e', 'p'};
  const std::vector<uint8_t> codes(8 * 8, 0x21), scales(8, 0x38);
  for (float g : {NAN, -1.0f, 0.0f}) {
    SCOPED_TRACE(g);
    test::write_bytes(out, old_bytes);
    SafetensorsWriter w;
    w.add("p.weight", DType::U8, {8, 8}, codes.data());
    w.add("p.weight_scale", DType::F8E4M3, {8, 1}, scales.data());
    w.add("p.weight_scale_2", DType::F32, {}, &g);
    w.write(dir / "in.safetensors");
    CliResult r = run_cli("dequantize --in " + q(dir / "in.safetensors") + " --out " + q(out));
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("p.weight_scale_2"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("must be finite and > 0"), std::string::npos) << r.err;
    EXPECT_EQ(read_bytes(out), old_bytes);
  }
  SafetensorsWriter w;
  w.add("p.weight_scale", DType::F8E4M3, {8, 1}, scales.data());
  w.write(dir / "in.safetensors");
  CliResult r = run_cli("dequantize --in " + q(dir / "in.safetensors") + " --out " + q(out));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("missing tensor \"p.weight\""), std::string::npos) << r.err;
  EXPECT_EQ(read_bytes(out), old_bytes);
}

// dequantize validates a triple as run's loader does: bad block-scale bytes
// and incomplete triples fail naming the tensor, the old output kept.
TEST(CliDequantize, BadBlockScalesAndIncompleteTriplesFail) {
  ScratchDir dir;
  const std::string out = dir / "out.safetensors";
  const std::vector<uint8_t> old_bytes = {'k', 'e', 'e', 'p'};
  struct Case {
    const char* label;
    uint8_t scale_byte;
    bool with_scales, with_global;
    std::string message;
  };
  const Case cases[] = {
      {"NaN block scale", 0x7F, true, true, "tensor \"p.weight_scale\": block scale byte 5 (row 5, block 0) is NaN (0x7f)"},
      {"negative block scale", 0xB8, true, true, "block scale byte 5 (row 5, block 0) is negative (0xb8)"},
      {"missing weight_scale", 0x38, false, true, "missing tensor \"p.weight_scale\" of the NVFP4 weight p"},
      {"missing weight_scale_2", 0x38, true, false, "missing tensor \"p.weight_scale_2\" of the NVFP4 weight p"},
  };
  const std::vector<uint8_t> codes(8 * 8, 0x21);
  const float g = 0.5f;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    test::write_bytes(out, old_bytes);
    std::vector<uint8_t> scales(8, 0x38);
    scales[5] = c.scale_byte;
    SafetensorsWriter w;
    w.add("p.weight", DType::U8, {8, 8}, codes.data());
    if (c.with_scales) w.add("p.weight_scale", DType::F8E4M3, {8, 1}, scales.data());
    if (c.with_global) w.add("p.weight_scale_2", DType::F32, {}, &g);
    w.write(dir / "in.safetensors");
    CliResult r = run_cli("dequantize --in " + q(dir / "in.safetensors") + " --out " + q(out));
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_EQ(read_bytes(out), old_bytes);
    // inspect reports the same problem, naming the weight.
    r = run_cli("inspect " + q(dir / "in.safetensors"));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("MALFORMED: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << r.out;
  }
}

// A two-shard model directory with config.json and an extra file.
void make_sharded_model(const ScratchDir& dir, test::Rng& rng, std::vector<float>& e0, std::vector<float>& e1) {
  const int64_t N = 16, K = 32;
  e0 = test::random_normal(rng, N * K);
  e1 = test::random_normal(rng, N * K);
  static std::vector<float> router;
  router = test::random_normal(rng, 2 * 32);
  SafetensorsWriter s1, s2;
  s1.add("model.layers.0.mlp.experts.0.up_proj.weight", DType::F32, {N, K}, e0.data());
  s1.add("model.layers.0.mlp.gate.weight", DType::F32, {2, 32}, router.data());
  s2.add("model.layers.0.mlp.experts.1.up_proj.weight", DType::F32, {N, K}, e1.data());
  s1.write(dir / "model-00001-of-00002.safetensors");
  s2.write(dir / "model-00002-of-00002.safetensors");
  test::write_text(dir / "model.safetensors.index.json",
                   R"({"metadata": {"total_size": 4352}, "weight_map": {
                       "model.layers.0.mlp.experts.0.up_proj.weight": "model-00001-of-00002.safetensors",
                       "model.layers.0.mlp.gate.weight": "model-00001-of-00002.safetensors",
                       "model.layers.0.mlp.experts.1.up_proj.weight": "model-00002-of-00002.safetensors"}})");
  test::write_text(dir / "config.json",
                   R"({"hidden_size": 32, "moe_intermediate_size": 16, "n_routed_experts": 2, "num_experts_per_tok": 1,
                       "mlp_layer_types": ["moe"]})");
  test::write_text(dir / "tokenizer.json", "{}");
}

TEST(CliQuantize, ShardedDirectoryKeepsShardsAndRewritesIndex) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir in, out_parent;
  std::vector<float> e0, e1;
  make_sharded_model(in, rng, e0, e1);
  const std::string out = out_parent / "q";
  CliResult r = run_cli("quantize --in " + q(in.path()) + " --out " + q(out));
  ASSERT_EQ(r.code, 0) << r.err;
  SafetensorsFile s1(out + "/model-00001-of-00002.safetensors"), s2(out + "/model-00002-of-00002.safetensors");
  expect_triple_equals(s1, "model.layers.0.mlp.experts.0.up_proj", quantize_matrix(e0.data(), 16, 32, ScaleScope::PerTensor));
  expect_triple_equals(s2, "model.layers.0.mlp.experts.1.up_proj", quantize_matrix(e1.data(), 16, 32, ScaleScope::PerTensor));
  EXPECT_NE(s1.find("model.layers.0.mlp.gate.weight"), nullptr);

  json::Value index = json::parse(fileio_text(out + "/model.safetensors.index.json"));
  const json::Value* map = index.find("weight_map");
  ASSERT_NE(map, nullptr);
  EXPECT_EQ(map->members().size(), 7u);
  EXPECT_EQ(map->find("model.layers.0.mlp.experts.1.up_proj.weight_scale_2")->as_string(),
            "model-00002-of-00002.safetensors");
  EXPECT_EQ(index.find("metadata")->find("total_size")->as_int(),
            int64_t(16 * 16 * 2 + 16 * 2 * 2 + 4 * 2 + 2 * 32 * 4));
  json::Value hq = json::parse(fileio_text(out + "/hf_quant_config.json"));
  EXPECT_EQ(hq.find("quantization")->find("quant_algo")->as_string(), "NVFP4");
  EXPECT_EQ(hq.find("quantization")->find("group_size")->as_int(), 16);
  EXPECT_EQ(hq.find("producer")->find("name")->as_string(), "nvfp4moe");
  const auto& excluded = hq.find("quantization")->find("exclude_modules")->items();
  ASSERT_EQ(excluded.size(), 1u);
  EXPECT_EQ(excluded[0].as_string(), "model.layers.0.mlp.gate");
  json::Value cfg = json::parse(fileio_text(out + "/config.json"));
  EXPECT_EQ(cfg.find("quantization_config")->find("quant_algo")->as_string(), "NVFP4");
  EXPECT_EQ(cfg.find("hidden_size")->as_int(), 32);
  EXPECT_TRUE(std::filesystem::exists(out + "/tokenizer.json"));
  EXPECT_EQ(ModelDir(out).quant_algo(), "NVFP4");
  // No staging directory is left behind.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(out_parent.path())) entries += e.is_directory();
  EXPECT_EQ(entries, 1);

  // inspect recognises the quantization and reads the MoE config.
  r = run_cli("inspect " + q(out));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("quant_algo NVFP4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 NVFP4 (ModelOpt) weights, 1 other weights"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MoE config: H=32 I=16 E=2 top_k=1"), std::string::npos) << r.out;
  r = run_cli("inspect --json " + q(out));
  ASSERT_EQ(r.code, 0) << r.err;
  json::Value j = json::parse(r.out);
  EXPECT_EQ(j.find("tensors")->items().size(), 7u);
  const auto& nv = j.find("nvfp4")->items();
  ASSERT_EQ(nv.size(), 2u);
  const Nvfp4Matrix m0 = quantize_matrix(e0.data(), 16, 32, ScaleScope::PerTensor);
  EXPECT_EQ(float(nv[0].find("global_scale")->as_double()), m0.global_scale[0]);
  float lo = INFINITY, hi = 0;
  for (uint8_t s : m0.scales) lo = std::min(lo, e4m3_decode(s)), hi = std::max(hi, e4m3_decode(s));
  EXPECT_EQ(float(nv[0].find("block_scale_min")->as_double()), lo);
  EXPECT_EQ(float(nv[0].find("block_scale_max")->as_double()), hi);
  EXPECT_EQ(j.find("moe_config")->find("n_routed_experts")->as_int(), 2);

  // dequantize back to a directory: BF16 weights, no quantization config.
  const std::string back = out_parent / "back";
  r = run_cli("dequantize --in " + q(out) + " --out " + q(back));
  ASSERT_EQ(r.code, 0) << r.err;
  ModelDir b(back);
  EXPECT_EQ(b.get("model.layers.0.mlp.experts.1.up_proj.weight").dtype, DType::BF16);
  EXPECT_FALSE(b.has("model.layers.0.mlp.experts.1.up_proj.weight_scale"));
  EXPECT_EQ(b.quant_algo(), "");
  EXPECT_FALSE(std::filesystem::exists(back + "/hf_quant_config.json"));
  EXPECT_LT(test::rel_l2(b.get("model.layers.0.mlp.experts.0.up_proj.weight").to_f32(), e0), 0.2);
}

TEST(CliQuantize, FailedDirectoryQuantizeLeavesOutputDirectoryIntact) {
  test::Rng rng(3);
  ScratchDir in, out_parent;
  std::vector<float> e0, e1;
  make_sharded_model(in, rng, e0, e1);
  const std::string out = out_parent / "q";
  ASSERT_EQ(run_cli("quantize --in " + q(in.path()) + " --out " + q(out)).code, 0);
  const auto before = read_bytes(out + "/model-00001-of-00002.safetensors");
  // Poison the second shard: NaN in a matched weight.
  e1[5] = NAN;
  SafetensorsWriter s2;
  s2.add("model.layers.0.mlp.experts.1.up_proj.weight", DType::F32, {16, 32}, e1.data());
  s2.write(in / "model-00002-of-00002.safetensors");
  CliResult r = run_cli("quantize --in " + q(in.path()) + " --out " + q(out));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("experts.1.up_proj.weight: non-finite"), std::string::npos) << r.err;
  EXPECT_EQ(read_bytes(out + "/model-00001-of-00002.safetensors"), before);
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(out_parent.path())) entries += 1, (void)e;
  EXPECT_EQ(entries, 1) << "staging directory left behind";
}

// `bench --unbounded` (value-less) and `--max-tokens` belong to the
// expert-parallel bench: the usage lists them and the single-process bench
// refuses them by name. `--graph` belongs to both forms.
TEST(CliBench, UnboundedAndMaxTokensAreExpertParallelFlags) {
  CliResult r = run_cli("bench --unbounded --workload ep8 --tokens 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("unknown option --unbounded"), std::string::npos) << r.err;
  r = run_cli("bench --max-tokens 4 --workload ep8 --tokens 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("unknown option --max-tokens"), std::string::npos) << r.err;
  r = run_cli("bench --graph=1 --workload ep8 --tokens 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--graph"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("CUDA"), std::string::npos) << "got as far as the device: " << r.err;
  r = run_cli("bench --help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"[--graph]   (each forward a replay", "--unbounded", "--max-tokens"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " not in the usage: " << r.out;
}

// `bench --format`, `--act` and `--model` take one of their names; any other
// value, an empty one, a list, a repeat or a missing value is refused naming
// the option and the value before any work (so before looking for a GPU).
TEST(CliBench, FormatAndActValuesAreCheckedByName) {
  struct Bad {
    const char* args;
    const char* says;
  };
  for (const Bad& b : {Bad{"--format fp4", "--format: 'fp4' is not one of nvfp4, mxfp4"},
                       Bad{"--format MXFP4", "--format: 'MXFP4' is not one of nvfp4, mxfp4"},
                       Bad{"--format=", "--format: '' is not one of nvfp4, mxfp4"},
                       Bad{"--format nvfp4,mxfp4", "--format: 'nvfp4,mxfp4' is not one of nvfp4, mxfp4"},
                       Bad{"--act int8", "--act: 'int8' is not one of nvfp4, bf16, fp8"},
                       Bad{"--act fp16", "--act: 'fp16' is not one of nvfp4, bf16, fp8"},
                       Bad{"--act mxfp4", "--act: 'mxfp4' is not one of nvfp4, bf16, fp8"},
                       Bad{"--format mxfp4 --format nvfp4", "option --format is given twice"},
                       Bad{"--act fp8 --act=bf16", "option --act is given twice"},
                       Bad{"--tokens 1 --act", "option --act needs a value"},
                       Bad{"--model dsv4", "--model: 'dsv4' is not one of dsv4-pro, dsv4-flash"},
                       Bad{"--model small", "--model: 'small' is not one of dsv4-pro, dsv4-flash"}}) {
    const CliResult r = run_cli(std::string("bench --workload ep8 ") + b.args);
    EXPECT_EQ(r.code, 1) << b.args;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << b.args << ": " << r.err;
    EXPECT_EQ(r.err.find("CUDA"), std::string::npos) << b.args << " got as far as the device: " << r.err;
  }
  const CliResult r = run_cli("bench --help");
  for (const char* usage : {"--format nvfp4|mxfp4", "--act nvfp4|bf16|fp8", "--model dsv4-pro|dsv4-flash"})
    EXPECT_NE(r.out.find(usage), std::string::npos) << usage << " not in the usage: " << r.out;
}

}  // namespace
}  // namespace nvfp4moe
