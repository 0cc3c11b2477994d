// Random NVFP4 MoE weights made directly as bytes — random code bytes and
// sane scale bytes — for benchmarks and GPU tests at full DeepSeek-V4 size
// (384 Pro experts are 14 GB of NVFP4: quantizing 25 G dense values would
// take far longer than the work being measured). Global scales are chosen so
// that an N(0, 1) input gives O(1) gate/up/down outputs.
//
// Deterministic in (seed, tensor, chunk), multithreaded.
#pragma once

#include <cstdint>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

// Experts [first, first + count) of `cfg` (count 0: all E), router (gate,
// bias, tid2eid of `vocab` rows when cfg.hash_routed), shared expert, and
// static input scales (w13: 8/2688, w2: 12/2688).
MoeWeights make_random_nvfp4_moe(const MoeConfig& cfg, uint64_t seed, int64_t first = 0, int64_t count = 0,
                                 int64_t vocab = 1024);

}  // namespace nvfp4moe
