// The host checks every MoE front end makes (docs/numerics.md §6), in one
// place: a layer's router and input scales when it is built, and each
// forward's tensors before any work is queued. Each error names the argument
// and the values.
#pragma once

#include <cstdint>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

// What a forward was given, once its tensors passed check_forward_args.
struct CheckedForward {
  int64_t tokens = 0;
  bool caller_routing = false;  // topk_ids/topk_weights given: the router is skipped
  bool want_ids = false, want_weights = false;
};

// Where a front end's tensors live and how many tokens one forward may hold.
struct ForwardSite {
  DeviceKind device = DeviceKind::Cpu;
  int device_index = 0;       // cuda: the ordinal every tensor must be on
  int64_t max_tokens = -1;    // -1: no capacity (the CPU paths)
  const char* who = "forward";  // the front end, for "T exceeds the capacity" errors
};

// x: [T, H] bf16|f32; routing.topk_ids [T, k] int32|int64 with topk_weights
// [T, k] f32 (both or neither); token_ids [T] int32|int64, required when the
// layer is hash-routed and no routing is given; out.y [T, H] bf16; optional
// out.topk_ids [T, k] int32 and out.topk_weights [T, k] f32. Every tensor
// contiguous, on the site's device. Throws on the first bad argument.
CheckedForward check_forward_args(const MoeConfig& cfg, const TensorView& x, const RoutingArgs& routing,
                                  const ForwardOutputs& out, const ForwardSite& site);

// A router for `cfg`: gate [E, H] and bias [E] sizes (either may be empty:
// the caller routes), finite values, tid2eid [vocab, k] with entries in
// [0, E) when hash-routed.
void validate_router(const MoeConfig& cfg, const RouterWeights& router);

// The static L1 input g (docs/numerics.md §8: the max over ALL experts of
// w13_input_scale, vLLM's convention) when cfg.l1_input is Static, else 0.
// Throws when static scales are asked for and the weights carry none; checks
// the same for the L2 input (w2_input_scale, one per expert).
float static_l1_input_scale(const MoeConfig& cfg, const ExpertWeights& experts);

}  // namespace nvfp4moe
