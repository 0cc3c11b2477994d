// The inputs of `nvfp4moe run` (one GPU or CPU, or each rank of --ep): the
// tensors of an input safetensors file, checked against the layer, as the
// host values a forward_host takes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cli {

struct RunInputs {
  int64_t tokens = 0;
  std::vector<float> x;               // hidden_states [T, H], bf16 widened exactly
  bool has_token_ids = false, caller_routing = false;  // which optional tensors the file holds
  std::vector<int32_t> token_ids;     // [T] when has_token_ids
  std::vector<int32_t> topk_ids;      // [T, k] when caller_routing
  std::vector<float> topk_weights;    // [T, k] when caller_routing

  // Rows [begin, end) of every tensor: an expert-parallel rank's chunk.
  RunInputs rows(int64_t begin, int64_t end, int64_t hidden, int64_t k) const;
  // The batch of these inputs (views into this object).
  HostBatch batch() const;
};

// hidden_states [T, H] bf16|f32 (required); token_ids [T] int32|int64,
// required by a hash-routed layer unless routing is given; topk_ids [T, k]
// int32|int64 with topk_weights [T, k] f32. Errors name the file, the
// tensor and what was expected; an int64 id outside int32 is an error.
RunInputs read_run_inputs(const std::string& path, const MoeConfig& cfg, int layer);

}  // namespace nvfp4moe::cli
