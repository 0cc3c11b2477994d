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
// bias, tid2eid of `vocab` rows when cfg.hash_routed), shared expert (BF16,
// or block-scaled FP8: make_random_fp8_shared_expert), and static input
// scales (w13: 8/2688, w2: 12/2688).
constexpr int64_t kRandomMoeVocab = 1024;
MoeWeights make_random_nvfp4_moe(const MoeConfig& cfg, uint64_t seed, int64_t first = 0, int64_t count = 0,
                                 int64_t vocab = kRandomMoeVocab,
                                 SharedExpertFormat shared_format = SharedExpertFormat::Bf16);

// A block-scaled FP8 shared expert of [Is, H] / [H, Is], as both DeepSeek-V4
// releases hold theirs: random E4M3 bytes (never the NaNs 0x7F / 0xFF) and
// one power-of-two factor per 128 x 128 tile (an F8_E8M0 `scale`), 2^-1 ..
// 2^1 times 2^fp8_shared_factor_exponent(K), so that an N(0, 1) input gives
// O(1) projections.
SharedExpertWeights make_random_fp8_shared_expert(int64_t hidden, int64_t shared_inter, uint64_t seed);

// The RMS of the values of uniformly random non-NaN E4M3 bytes (100.06), and
// the exponent e of 2^e ~ 1 / (that RMS x sqrt(K)): -round(log2(100.06 sqrt(K))).
constexpr double kE4m3ByteRms = 100.06;
int fp8_shared_factor_exponent(int64_t k);

}  // namespace nvfp4moe
