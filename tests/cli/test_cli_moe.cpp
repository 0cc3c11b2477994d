// `nvfp4moe run` and `nvfp4moe demo` end to end: a layer written by
// save_moe_layer, inputs in a safetensors file, the output compared with the
// FP64 reference and with the in-process API.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/moe_reference_f64.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

struct CliResult {
  int code;
  std::string output;  // stdout + stderr
};

CliResult run_cli(const std::string& args, const ScratchDir& dir) {
  const std::string log = dir / "cli.log";
  const std::string cmd = std::string(NVFP4MOE_CLI_PATH) + " " + args + " > " + log + " 2>&1";
  const int status = std::system(cmd.c_str());
  const std::vector<uint8_t> b = read_bytes(log);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(b.begin(), b.end())};
}

struct Layer {
  MoeConfig c;
  MoeWeights w;
  int layer = 4;
};

Layer write_layer(const ScratchDir& dir, uint64_t seed, bool hash) {
  Layer l;
  l.c = small_config(64, 32, 8, 2);
  l.c.hash_routed = hash;
  l.w = make_synthetic_moe(l.c, seed);
  save_moe_layer(dir.path() + "/model", l.layer, l.w);
  return l;
}

std::vector<float> read_f32(const TensorInfo& t) { return t.to_f32(); }

TEST(CliRun, OutputMatchesReferenceAndApiAndEpRanks) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  ScratchDir dir;
  Layer l = write_layer(dir, seed, false);
  Rng rng(seed);
  const int64_t T = 13, H = l.c.hidden, k = l.c.top_k;
  std::vector<float> x = random_hidden(rng, T, H);
  std::vector<Bf16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = bf16_from_float(x[i]);
    x[i] = bf16_to_float(xb[i]);
  }
  SafetensorsWriter in;
  in.add("hidden_states", DType::BF16, {T, H}, xb.data());
  in.write(dir / "x.safetensors");

  const std::string base = "run --model " + dir.path() + "/model --layer 4 --input " + (dir / "x.safetensors");
  CliResult r = run_cli(base + " --output " + (dir / "y.safetensors"), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  SafetensorsFile y(dir / "y.safetensors");
  ASSERT_EQ(y.get("output").dtype, DType::BF16);
  ASSERT_EQ(y.get("output").shape, (std::vector<int64_t>{T, H}));
  ASSERT_EQ(y.get("topk_ids").dtype, DType::I32);
  ASSERT_EQ(y.get("topk_weights").dtype, DType::F32);
  const std::vector<float> out = read_f32(y.get("output"));
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> wts(static_cast<size_t>(T * k));
  std::memcpy(ids.data(), y.get("topk_ids").data, ids.size() * 4);
  std::memcpy(wts.data(), y.get("topk_weights").data, wts.size() * 4);

  // Against the FP64 reference on the weights as the CLI loaded them.
  const MoeWeights loaded = load_moe_layer(ModelDir(dir.path() + "/model"), 4);
  EXPECT_EQ(count_non_finite(out), 0);
  EXPECT_LE(rel_l2(out, reference_moe_f64(loaded, x, T, ids, wts)), 1e-2);
  expect_same_selection(loaded.config, reference_router_f64(loaded, x, T), ids, wts, T);
  // Same bits as the in-process API.
  Moe moe(loaded, MoeOptions{});
  EXPECT_EQ(moe.forward_host({.x = x, .tokens = T}).y, out);

  // --ep 4: same bits.
  r = run_cli(base + " --ep 4 --threads 1 --output " + (dir / "y4.safetensors"), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_f32(SafetensorsFile(dir / "y4.safetensors").get("output")), out);

  // Caller routing (int64 ids with -1) skips the router.
  std::vector<int64_t> cids(ids.begin(), ids.end());
  cids[1] = -1;
  SafetensorsWriter in2;
  in2.add("hidden_states", DType::BF16, {T, H}, xb.data());
  in2.add("topk_ids", DType::I64, {T, k}, cids.data());
  in2.add("topk_weights", DType::F32, {T, k}, wts.data());
  in2.write(dir / "x2.safetensors");
  r = run_cli("run --model " + dir.path() + "/model --layer 4 --input " + (dir / "x2.safetensors") + " --output " +
                  (dir / "y2.safetensors"),
              dir);
  ASSERT_EQ(r.code, 0) << r.output;
  SafetensorsFile y2(dir / "y2.safetensors");
  EXPECT_EQ(reinterpret_cast<const int32_t*>(y2.get("topk_ids").data)[1], -1);
  std::vector<int32_t> ids2(cids.begin(), cids.end());
  EXPECT_LE(rel_l2(read_f32(y2.get("output")), reference_moe_f64(loaded, x, T, ids2, wts)), 1e-2);
}

TEST(CliRun, HashLayerNeedsTokenIdsAndFailedRunKeepsOldOutput) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  ScratchDir dir;
  Layer l = write_layer(dir, seed, true);
  Rng rng(seed);
  const int64_t T = 6, H = l.c.hidden;
  const std::vector<float> x = random_hidden(rng, T, H);
  std::vector<int32_t> tok = {0, 5, 17, 4095, 3, 3};
  SafetensorsWriter in;
  in.add("hidden_states", DType::F32, {T, H}, x.data());
  in.write(dir / "x_notok.safetensors");
  in.add("token_ids", DType::I32, {T}, tok.data());
  in.write(dir / "x.safetensors");

  const std::string base = "run --model " + dir.path() + "/model --layer 4 --output " + (dir / "y.safetensors");
  CliResult r = run_cli(base + " --input " + (dir / "x.safetensors"), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<uint8_t> good = read_bytes(dir / "y.safetensors");
  SafetensorsFile y(dir / "y.safetensors");
  const int32_t* ids = reinterpret_cast<const int32_t*>(y.get("topk_ids").data);
  const MoeWeights loaded = load_moe_layer(ModelDir(dir.path() + "/model"), 4);
  ASSERT_TRUE(loaded.config.hash_routed);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < 2; ++j) EXPECT_EQ(ids[t * 2 + j], loaded.router.tid2eid[size_t(tok[size_t(t)] * 2 + j)]);

  // Missing token_ids: non-zero exit, a message naming them, old output intact.
  r = run_cli(base + " --input " + (dir / "x_notok.safetensors"), dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("token_ids"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("hash-routed"), std::string::npos) << r.output;
  EXPECT_EQ(read_bytes(dir / "y.safetensors"), good);
  // Token id outside the vocabulary.
  tok[2] = 5000;
  SafetensorsWriter bad;
  bad.add("hidden_states", DType::F32, {T, H}, x.data());
  bad.add("token_ids", DType::I32, {T}, tok.data());
  bad.write(dir / "x_bad.safetensors");
  r = run_cli(base + " --input " + (dir / "x_bad.safetensors"), dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("token 2 has token id 5000"), std::string::npos) << r.output;
  EXPECT_EQ(read_bytes(dir / "y.safetensors"), good);
  // Wrong H; wrong dtype; missing option.
  std::vector<float> x2(static_cast<size_t>(T * 32));
  SafetensorsWriter wrong;
  wrong.add("hidden_states", DType::F32, {T, 32}, x2.data());
  wrong.write(dir / "x_h.safetensors");
  r = run_cli(base + " --input " + (dir / "x_h.safetensors"), dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("hidden_states has shape [6, 32]"), std::string::npos) << r.output;
  r = run_cli("run --model " + dir.path() + "/model --input " + (dir / "x.safetensors") + " --output " +
                  (dir / "y.safetensors"),
              dir);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--layer"), std::string::npos) << r.output;
  EXPECT_EQ(read_bytes(dir / "y.safetensors"), good);
}

TEST(CliRun, StaticInputScalesUseTheCheckpointsInputScale) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  ScratchDir dir;
  Layer l = write_layer(dir, seed, false);
  Rng rng(seed);
  const int64_t T = 9, H = l.c.hidden;
  const std::vector<float> x = random_normal(rng, T * H);
  SafetensorsWriter in;
  in.add("hidden_states", DType::F32, {T, H}, x.data());
  in.write(dir / "x.safetensors");
  const std::string base = "run --model " + dir.path() + "/model --layer 4 --input " + (dir / "x.safetensors");
  CliResult r = run_cli(base + " --static-input-scales --output " + (dir / "ys.safetensors"), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_cli(base + " --output " + (dir / "yd.safetensors"), dir);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<float> ys = read_f32(SafetensorsFile(dir / "ys.safetensors").get("output"));
  EXPECT_NE(ys, read_f32(SafetensorsFile(dir / "yd.safetensors").get("output")));
  LoadOptions lo;
  lo.static_l1_input = lo.static_l2_input = true;
  const MoeWeights loaded = load_moe_layer(ModelDir(dir.path() + "/model"), 4, lo);
  ASSERT_EQ(loaded.config.l1_input, InputScaleMode::Static);
  Moe moe(loaded, MoeOptions{});
  EXPECT_EQ(moe.forward_host({.x = x, .tokens = T}).y, ys);
  SafetensorsFile y(dir / "ys.safetensors");
  std::vector<int32_t> ids(static_cast<size_t>(T * 2));
  std::vector<float> wts(static_cast<size_t>(T * 2));
  std::memcpy(ids.data(), y.get("topk_ids").data, ids.size() * 4);
  std::memcpy(wts.data(), y.get("topk_weights").data, wts.size() * 4);
  EXPECT_LE(rel_l2(ys, reference_moe_f64(loaded, x, T, ids, wts)), 1e-2);
}

TEST(CliDemo, SmallModelRunsAndReports) {
  ScratchDir dir;
  const CliResult r = run_cli("demo --model small --tokens 8 --iters 1 --device cpu", dir);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* piece : {"H=1024", "experts hit", "tokens per expert min", "tokens/s", "relative L2 error"})
    EXPECT_NE(r.output.find(piece), std::string::npos) << "missing '" << piece << "' in:\n" << r.output;
  // The error against the unquantized layer is that of NVFP4 (~0.1), not garbage.
  const size_t at = r.output.find("unquantized layer");
  ASSERT_NE(at, std::string::npos);
  const double err = std::atof(r.output.substr(r.output.find("): ", at) + 3).c_str());
  EXPECT_GT(err, 0.01);
  EXPECT_LT(err, 0.3);
  const CliResult bad = run_cli("demo --model dsv4-ultra", dir);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("dsv4-ultra"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace nvfp4moe::test
