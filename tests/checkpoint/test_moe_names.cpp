// Tensor names and config numbers come from untrusted files: parse_moe_name
// and block_of_name on well-formed names, on names whose indices do not fit
// (huge digit runs, leading zeros), which are errors naming the tensor; and
// read_moe_config on geometry values out of range, errors naming the key.
#include <gtest/gtest.h>

#include <string>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

TEST(MoeNames, ParsesBothLayouts) {
  const auto e = parse_moe_name("model.layers.12.mlp.experts.255.down_proj.weight_scale_2");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->layout, CheckpointLayout::HuggingFace);
  EXPECT_EQ(e->block, (MoeBlock{12, false}));
  EXPECT_EQ(e->kind, ParsedMoeName::Kind::Expert);
  EXPECT_EQ(e->expert, 255);
  EXPECT_EQ(e->proj, Proj::Down);
  EXPECT_EQ(e->suffix, "weight_scale_2");
  const auto m = parse_moe_name("mtp.0.ffn.shared_experts.w3.scale");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->layout, CheckpointLayout::DeepSeek);
  EXPECT_EQ(m->block, (MoeBlock{0, true}));
  EXPECT_EQ(m->kind, ParsedMoeName::Kind::SharedExpert);
  EXPECT_EQ(m->proj, Proj::Up);
  const auto g = parse_moe_name("layers.2147483647.ffn.gate.bias");
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->block.index, 2147483647);
  EXPECT_EQ(g->kind, ParsedMoeName::Kind::Router);
  EXPECT_EQ(g->suffix, "bias");
  // Not under an MoE block: no index, an index not followed by '.', another module.
  for (const char* n : {"model.embed_tokens.weight", "layers.x.ffn.gate.weight", "layers.3a.ffn.gate.weight",
                        "model.layers.3.self_attn.q_proj.weight", "layers.", "model.layers.12"})
    EXPECT_FALSE(parse_moe_name(n).has_value()) << n;
  EXPECT_EQ(block_of_name("model.layers.3.self_attn.q_proj.weight"), (MoeBlock{3, false}));
  EXPECT_EQ(block_of_name("mtp.1.norm.weight"), (MoeBlock{1, true}));
  EXPECT_EQ(block_of_name("lm_head.weight"), std::nullopt);
}

TEST(MoeNames, IndicesThatDoNotFitAreErrorsNamingTheTensor) {
  const std::string big = "model.layers.99999999999999999999.mlp.gate.weight";
  EXPECT_ERROR_CONTAINS(parse_moe_name(big), "tensor name '" + big + "': layer index: 99999999999999999999 is out of range [0, 2147483647]");
  EXPECT_ERROR_CONTAINS(block_of_name(big), "layer index: 99999999999999999999 is out of range");
  EXPECT_ERROR_CONTAINS(parse_moe_name("layers.2147483648.ffn.gate.weight"), "layer index: 2147483648 is out of range");
  EXPECT_ERROR_CONTAINS(parse_moe_name("mtp.99999999999.ffn.gate.weight"), "MTP block index: 99999999999 is out of range");
  EXPECT_ERROR_CONTAINS(parse_moe_name("layers.07.ffn.gate.weight"), "layer index '07' has a leading zero");
  EXPECT_ERROR_CONTAINS(parse_moe_name("layers.1.ffn.experts.00.w1.weight"), "expert index '00' has a leading zero");
  // Digit runs of any length: one pass, an abbreviated message.
  const std::string layer_digits = "model.layers." + std::string(30000, '1') + ".mlp.experts.0.up_proj.weight";
  EXPECT_ERROR_CONTAINS(parse_moe_name(layer_digits), "layer index: 1111", "(30000 characters) is out of range");
  const std::string expert_digits = "model.layers.1.mlp.experts." + std::string(300000, '9') + ".up_proj.weight";
  EXPECT_ERROR_CONTAINS(parse_moe_name(expert_digits), "expert index: 9999", "(300000 characters) is out of range");
}

// A one-file model directory whose config.json is `config`.
void write_model(const test::ScratchDir& d, const std::string& config) {
  const std::vector<float> g(4 * 16, 0.5f);
  SafetensorsWriter w;
  w.add("model.layers.0.mlp.gate.weight", DType::F32, {4, 16}, g.data());
  w.write(d / "model.safetensors");
  test::write_text(d / "config.json", config);
}

TEST(MoeConfigNumbers, OutOfRangeGeometryIsAnErrorNamingTheKey) {
  const std::string rest = R"("moe_intermediate_size": 16, "num_experts_per_tok": 1, "mlp_layer_types": ["moe"])";
  struct Case {
    std::string keys;
    std::string message, detail;  // both in the message
  };
  const Case cases[] = {
      {R"("hidden_size": 1099511627776, "n_routed_experts": 4)",
       "key \"hidden_size\" is 1099511627776, out of range [1, 1048576]", "config.json"},
      {R"("hidden_size": -16, "n_routed_experts": 4)", "key \"hidden_size\" is -16, out of range [1, 1048576]", "config.json"},
      {R"("hidden_size": 16, "n_routed_experts": 4294967297)",
       "key \"n_routed_experts\" is 4294967297, out of range [1, 65536]", "config.json"},
      {R"("hidden_size": 1e30, "n_routed_experts": 4)", "key \"hidden_size\"", "expected an integer"},
      {R"("hidden_size": 99999999999999999999999, "n_routed_experts": 4)", "key \"hidden_size\"",
       "expected an integer, got 1e+23 (beyond the 64-bit integer range)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.keys);
    test::ScratchDir d;
    write_model(d, "{" + c.keys + ", " + rest + "}");
    const ModelDir dir(d.path());
    EXPECT_ERROR_CONTAINS(read_moe_config(dir, 0), c.message, c.detail);
  }
}

}  // namespace
}  // namespace nvfp4moe
