// Host-side checks of Moe::forward's arguments (spec section 6): shapes,
// dtypes, devices and strides, each error naming the argument and the values.
// Device-agnostic: a backend passes the device its tensors must live on.
#pragma once

#include <cstdint>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cpu {

struct CheckedForward {
  int64_t tokens = 0;
  bool caller_routing = false;  // topk_ids/topk_weights given: skip the router
  bool want_ids = false, want_weights = false;
};

// Throws nvfp4moe::Error on the first bad argument. x: [T, H] bf16|f32;
// routing.topk_ids [T, k] int32|int64 with topk_weights [T, k] f32 (both or
// neither); token_ids [T] int32|int64, required when the layer is hash-routed
// and no routing is given; out.y [T, H] bf16; optional out.topk_ids [T, k]
// int32 and out.topk_weights [T, k] f32. Every tensor contiguous, on `device`.
CheckedForward check_forward_args(const MoeConfig& cfg, const TensorView& x, const RoutingArgs& routing,
                                  const ForwardOutputs& out, DeviceKind device);

}  // namespace nvfp4moe::cpu
