// Host-side checks of Moe::forward's arguments (spec section 6): shapes,
// dtypes, devices and strides, each error naming the argument and the values.
// Device-agnostic: a backend passes the device its tensors must live on.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

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

// x (bf16 or f32) as f32 values (bf16 widens exactly).
std::vector<float> values_f32(const TensorView& x);
// An int32 or int64 tensor's values.
std::vector<int32_t> values_i32(const TensorView& t);
std::vector<int64_t> values_i64(const TensorView& t);

// forward_host in terms of a forward on host views (shared by Moe's CPU
// backend and the expert-parallel emulation): builds the views, checks the
// vector sizes, returns y as floats.
using HostForward = std::function<void(const TensorView&, const RoutingArgs&, const ForwardOutputs&)>;
std::vector<float> forward_host_with(const MoeConfig& cfg, const HostForward& forward, const std::vector<float>& x,
                                     int64_t tokens, const std::vector<int32_t>* topk_ids,
                                     const std::vector<float>* topk_weights, const std::vector<int32_t>* token_ids,
                                     std::vector<int32_t>* topk_ids_out, std::vector<float>* topk_weights_out);

}  // namespace nvfp4moe::cpu
