// Tensor names of a DeepSeek-V4 MoE block in either checkpoint layout, one
// place for the loader, the writer and inspect. Facts and sources:
// docs/checkpoints.md.
//
//                  DeepSeek (official, ModelOpt export)   HuggingFace (transformers)
//   block          layers.{L}  /  mtp.{i}                 model.layers.{L}
//   ffn prefix     <block>.ffn.                           <block>.mlp.
//   expert proj    experts.{e}.w1 / w3 / w2               experts.{e}.gate_proj / up_proj / down_proj
//   router         gate.weight, gate.bias, gate.tid2eid   gate.weight, gate.e_score_correction_bias, gate.tid2eid
//   shared proj    shared_experts.w1 / w3 / w2            shared_experts.gate_proj / up_proj / down_proj
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe {

enum class Proj : uint8_t { Gate, Up, Down };
constexpr Proj kProjs[] = {Proj::Gate, Proj::Up, Proj::Down};

// "w1" / "w3" / "w2" (DeepSeek) or "gate_proj" / "up_proj" / "down_proj".
const char* proj_name(CheckpointLayout layout, Proj p);

// Which MoE block of a model: main layer `index`, or MTP block `index`.
struct MoeBlock {
  int index = 0;
  bool mtp = false;
  bool operator<(const MoeBlock& o) const { return mtp != o.mtp ? !mtp : index < o.index; }
  bool operator==(const MoeBlock& o) const { return mtp == o.mtp && index == o.index; }
};

// "layer 3" / "MTP block 0", for messages.
std::string block_label(MoeBlock b);

class MoeNames {
 public:
  // Throws for an MTP block in the HuggingFace layout (it has no MTP names).
  MoeNames(CheckpointLayout layout, MoeBlock block);
  CheckpointLayout layout() const { return layout_; }
  MoeBlock block() const { return block_; }
  const std::string& block_name() const { return block_name_; }  // "layers.3", "model.layers.3", "mtp.0"
  std::string experts_module() const;                            // "<ffn>experts", as manifests name it
  std::string expert(int64_t e, Proj p) const;                   // "<ffn>experts.{e}.w1" (no suffix)
  std::string shared(Proj p) const;                              // "<ffn>shared_experts.w1"
  std::string router_weight() const { return ffn_ + "gate.weight"; }
  std::string router_bias() const;
  std::string tid2eid() const { return ffn_ + "gate.tid2eid"; }
  // "layers.3 (layer 3)", for messages.
  std::string label() const { return block_name_ + " (" + block_label(block_) + ")"; }

 private:
  CheckpointLayout layout_;
  MoeBlock block_;
  std::string block_name_, ffn_;
};

// A tensor name under an MoE block, parsed: which block, and the part after
// the ffn prefix split into expert id, projection and suffix where it is one.
struct ParsedMoeName {
  CheckpointLayout layout = CheckpointLayout::HuggingFace;
  MoeBlock block;
  enum class Kind : uint8_t { Expert, SharedExpert, Router, Other } kind = Kind::Other;
  int64_t expert = -1;       // Kind::Expert
  Proj proj = Proj::Gate;    // Kind::Expert, Kind::SharedExpert
  std::string suffix;        // after the projection ("weight", "weight_scale", ...) or after "gate."
};
// nullopt for names outside an MoE block's ffn / mlp prefix (attention,
// norms, embeddings, ...). Names come from untrusted files: parsing is one
// pass without recursion, and a block or expert index that is out of range
// [0, 2^31) or has a leading zero ("layers.07.") throws naming the tensor.
std::optional<ParsedMoeName> parse_moe_name(std::string_view name);

// The block any tensor name lies under ("layers.3.*", "model.layers.3.*",
// "mtp.0.*"), or nullopt; the same index checks as parse_moe_name.
std::optional<MoeBlock> block_of_name(std::string_view name);

// The layout a tensor name belongs to, or nullopt when it says nothing
// (names outside layers.* / mtp.* / model.layers.*).
std::optional<CheckpointLayout> layout_of_name(std::string_view name);

}  // namespace nvfp4moe
