#include "checkpoint/moe_names.hpp"

#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

const char* layout_name(CheckpointLayout layout) {
  return layout == CheckpointLayout::DeepSeek ? "deepseek" : "huggingface";
}

CheckpointLayout parse_layout(const std::string& s) {
  if (s == "deepseek") return CheckpointLayout::DeepSeek;
  if (s == "huggingface") return CheckpointLayout::HuggingFace;
  NVFP4_FAIL("unknown checkpoint layout \"", s, "\" (expected deepseek or huggingface)");
}

const char* proj_name(CheckpointLayout layout, Proj p) {
  if (layout == CheckpointLayout::DeepSeek) return p == Proj::Gate ? "w1" : p == Proj::Up ? "w3" : "w2";
  return p == Proj::Gate ? "gate_proj" : p == Proj::Up ? "up_proj" : "down_proj";
}

std::string block_label(MoeBlock b) {
  return (b.mtp ? "MTP block " : "layer ") + std::to_string(b.index);
}

MoeNames::MoeNames(CheckpointLayout layout, MoeBlock block) : layout_(layout), block_(block) {
  NVFP4_CHECK(block.index >= 0, "MoE block index must be >= 0, got ", block.index);
  if (layout == CheckpointLayout::DeepSeek) {
    block_name_ = (block.mtp ? "mtp." : "layers.") + std::to_string(block.index);
    ffn_ = block_name_ + ".ffn.";
  } else {
    NVFP4_CHECK(!block.mtp, "MTP block ", block.index,
                ": the Hugging Face layout has no MTP block names (transformers does not load the MTP "
                "blocks); MTP blocks are read from DeepSeek-layout checkpoints (mtp.{i}.ffn.*)");
    block_name_ = "model.layers." + std::to_string(block.index);
    ffn_ = block_name_ + ".mlp.";
  }
}

std::string MoeNames::experts_module() const { return ffn_ + "experts"; }

std::string MoeNames::expert(int64_t e, Proj p) const {
  return ffn_ + "experts." + std::to_string(e) + "." + proj_name(layout_, p);
}

std::string MoeNames::shared(Proj p) const { return ffn_ + "shared_experts." + proj_name(layout_, p); }

std::string MoeNames::router_bias() const {
  return ffn_ + (layout_ == CheckpointLayout::DeepSeek ? "gate.bias" : "gate.e_score_correction_bias");
}

namespace {

bool eat(std::string_view& s, std::string_view prefix) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// A decimal number followed by '.', consumed; -1 when there is none.
int64_t eat_index(std::string_view& s) {
  size_t n = 0;
  int64_t v = 0;
  while (n < s.size() && n < 10 && s[n] >= '0' && s[n] <= '9') v = v * 10 + (s[n++] - '0');
  if (n == 0 || n >= s.size() || s[n] != '.') return -1;
  s.remove_prefix(n + 1);
  return v;
}

std::optional<Proj> eat_proj(std::string_view& s, CheckpointLayout layout) {
  for (Proj p : kProjs) {
    const std::string name = std::string(proj_name(layout, p)) + ".";
    if (eat(s, name)) return p;
  }
  return std::nullopt;
}

}  // namespace

std::optional<CheckpointLayout> layout_of_name(std::string_view name) {
  if (name.substr(0, 13) == "model.layers.") return CheckpointLayout::HuggingFace;
  if (name.substr(0, 7) == "layers." || name.substr(0, 4) == "mtp.") return CheckpointLayout::DeepSeek;
  return std::nullopt;
}

std::optional<ParsedMoeName> parse_moe_name(std::string_view name) {
  ParsedMoeName r;
  std::string_view s = name;
  if (eat(s, "model.layers.")) {
    r.layout = CheckpointLayout::HuggingFace;
  } else if (eat(s, "layers.")) {
    r.layout = CheckpointLayout::DeepSeek;
  } else if (eat(s, "mtp.")) {
    r.layout = CheckpointLayout::DeepSeek;
    r.block.mtp = true;
  } else {
    return std::nullopt;
  }
  const int64_t index = eat_index(s);
  if (index < 0 || index > INT32_MAX) return std::nullopt;
  r.block.index = int(index);
  if (!eat(s, r.layout == CheckpointLayout::DeepSeek ? "ffn." : "mlp.")) return std::nullopt;
  if (eat(s, "experts.")) {
    r.expert = eat_index(s);
    const std::optional<Proj> p = r.expert >= 0 ? eat_proj(s, r.layout) : std::nullopt;
    if (p) {
      r.kind = ParsedMoeName::Kind::Expert;
      r.proj = *p;
    }
  } else if (eat(s, "shared_experts.")) {
    if (const std::optional<Proj> p = eat_proj(s, r.layout)) {
      r.kind = ParsedMoeName::Kind::SharedExpert;
      r.proj = *p;
    }
  } else if (eat(s, "gate.")) {
    r.kind = ParsedMoeName::Kind::Router;
  }
  r.suffix = std::string(s);
  return r;
}

}  // namespace nvfp4moe
