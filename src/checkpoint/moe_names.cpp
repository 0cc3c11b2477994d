#include "checkpoint/moe_names.hpp"

#include "common/parse_int.hpp"
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

// A decimal index followed by '.', consumed; nullopt (nothing consumed) when
// s does not start with digits and a '.'. Digits that do are an index of
// `name`, which must be canonical and fit an int: anything else is a
// malformed name, an error naming it (`what`: "layer", "expert").
std::optional<int64_t> eat_index(std::string_view& s, std::string_view name, const char* what) {
  size_t n = 0;
  while (n < s.size() && s[n] >= '0' && s[n] <= '9') ++n;
  if (n == 0 || n >= s.size() || s[n] != '.') return std::nullopt;
  const std::string where = "tensor name '" + abbreviate(name) + "': " + what + " index";
  NVFP4_CHECK(n == 1 || s[0] != '0', where, " '", abbreviate(s.substr(0, n)), "' has a leading zero");
  const int64_t v = parse_int(s.substr(0, n), 0, INT32_MAX, where);
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

namespace {

// The block prefix of `name` consumed from `s` (== name on entry).
std::optional<MoeBlock> eat_block(std::string_view& s, std::string_view name, CheckpointLayout& layout) {
  MoeBlock b;
  if (eat(s, "model.layers.")) {
    layout = CheckpointLayout::HuggingFace;
  } else if (eat(s, "layers.")) {
    layout = CheckpointLayout::DeepSeek;
  } else if (eat(s, "mtp.")) {
    layout = CheckpointLayout::DeepSeek;
    b.mtp = true;
  } else {
    return std::nullopt;
  }
  const std::optional<int64_t> index = eat_index(s, name, b.mtp ? "MTP block" : "layer");
  if (!index) return std::nullopt;
  b.index = int(*index);
  return b;
}

}  // namespace

std::optional<MoeBlock> block_of_name(std::string_view name) {
  std::string_view s = name;
  CheckpointLayout layout;
  return eat_block(s, name, layout);
}

std::optional<ParsedMoeName> parse_moe_name(std::string_view name) {
  ParsedMoeName r;
  std::string_view s = name;
  const std::optional<MoeBlock> block = eat_block(s, name, r.layout);
  if (!block) return std::nullopt;
  r.block = *block;
  if (!eat(s, r.layout == CheckpointLayout::DeepSeek ? "ffn." : "mlp.")) return std::nullopt;
  if (eat(s, "experts.")) {
    r.expert = eat_index(s, name, "expert").value_or(-1);
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
