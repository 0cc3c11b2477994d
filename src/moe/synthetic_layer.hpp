// What make_synthetic_moe and make_synthetic_moe_cuda share: the layer with
// its config, router, shared expert and static input scales, and the routed
// experts' arrays sized but not filled (codes, scales, global scales).
#pragma once

#include <cstdint>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

MoeWeights synthetic_layer_shell(const MoeConfig& cfg, uint64_t seed);

}  // namespace nvfp4moe
