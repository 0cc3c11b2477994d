// Small DeepSeek-V4 model directories for tests, in both checkpoint layouts,
// generated into a scratch directory. Tensors are written one by one with
// SafetensorsWriter under names spelled here from the documented facts
// (docs/checkpoints.md), not through save_moe_layer, so the loader is checked
// against the facts rather than against the project's own writer.
//
// The model: H = 256, I = 160, E = 8, k = 2, one shared expert (Is = 160, so
// its FP8 weights span 2 x 2 tiles of 128, the last ones partial), rho 1.5,
// SwiGLU limit 10; main layers 0 (hash-routed: tid2eid, no bias), 1 and 2
// (scored, with bias); MTP block 0 with the official MXFP4 routed experts.
// Routed experts are NVFP4 as ModelOpt's DeepSeek-V4 export writes them (w1
// and w3 of an expert quantized with one shared weight_scale_2, input scales
// fused the same way); shared experts FP8 E4M3 with F8_E8M0 tile scales.
//
// DeepSeek layout: three shards and an index (layer 1 split across two
// shards), config.json with DeepSeek's keys and ModelOpt's quantization_config,
// inference/config.json with DeepSeek's inference keys, hf_quant_config.json
// MIXED_PRECISION. Hugging Face layout: the same main layers under
// transformers' names (shared tile scales as F32 weight_scale_inv of equal
// values), two shards, mlp_layer_types, hf_quant_config.json NVFP4.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::test {

struct FixtureModel {
  static constexpr int kLayers = 3;       // main MoE layers 0..2
  static constexpr int kHashLayers = 1;   // layer 0 routes by tid2eid
  static constexpr int64_t kVocab = 64;   // rows of tid2eid
  MoeConfig config;                       // the geometry (hash_routed false)
  std::vector<MoeWeights> layers;         // what loading main layer L must give
  struct Mxfp4Proj {
    std::vector<uint8_t> codes;   // I8 [N, K/2], element 2i in the low nibble
    std::vector<uint8_t> scales;  // F8_E8M0 [N, K/32]
  };
  std::vector<std::array<Mxfp4Proj, 3>> mtp_experts;  // MTP block 0, [E][gate, up, down]
  MoeWeights mtp;                                      // its router and shared expert
};

FixtureModel make_fixture_model(uint64_t seed);

void write_deepseek_layout(const FixtureModel& m, const std::string& dir);
void write_huggingface_layout(const FixtureModel& m, const std::string& dir);

// Rewrites the shard of `dir` that holds `name` with that tensor replaced by
// (dtype, shape, bytes), or removed when `bytes` is empty; the index follows.
void replace_in_model(const std::string& dir, const std::string& name, DType dtype, std::vector<int64_t> shape,
                      std::vector<uint8_t> bytes);

// Every field of a loaded layer against the weights it was written from
// (gtest expectations; the shared expert must be FP8).
void expect_same_layer(const MoeWeights& got, const MoeWeights& want);

// A test with a fresh model (fresh seed) written in both layouts: dir_/a
// (DeepSeek) and dir_/b (Hugging Face).
class ModelDirsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = fresh_seed();
    model_ = make_fixture_model(seed_);
    write_deepseek_layout(model_, dir_ / "a");
    write_huggingface_layout(model_, dir_ / "b");
  }
  std::string a() const { return dir_ / "a"; }
  std::string b() const { return dir_ / "b"; }
  uint64_t seed_ = 0;
  FixtureModel model_;
  ScratchDir dir_;
};

// Exit status, stdout and stderr of the nvfp4moe tool run with `args`.
struct ToolRun {
  int code = -1;
  std::string out, err;
};
ToolRun run_tool(const std::string& args);

// An input file of `nvfp4moe run`: hidden_states F32 [T, H] and token_ids
// I32 [T] of fresh random values (x normal, ids below kVocab), returned too.
struct RunInput {
  std::vector<float> x;
  std::vector<int32_t> tokens;
};
RunInput write_run_input(uint64_t seed, int64_t T, int64_t H, const std::string& path);

}  // namespace nvfp4moe::test
