// The routed experts' weights as the benchmarks see them (`nvfp4moe bench`
// and the programs in bench/): the weight formats and activation modes they
// are asked for by name, the bytes a weight of each format that their
// rooflines count, and random MXFP4 experts made directly as bytes.
//
// Bytes a weight. A format's checkpoint holds NVFP4 as a 4-bit code and one
// UE4M3 byte per 16 weights (4.5 bits; the FP32 global scales are
// negligible) and MXFP4 as a 4-bit code and one UE8M0 byte per 32 (4.25
// bits). The CUDA kernels read both through multiplier bytes
// (cuda/layout/scale_multiplier.hpp), one per 16 weights for NVFP4 and one
// per 32 for MXFP4 (cuda/layout/fragment_layout.hpp): the device reads the
// checkpoint's bits a weight.
#pragma once

#include <cstdint>
#include <string>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

// Bits a weight of the format's checkpoint: 4.5 (NVFP4), 4.25 (MXFP4); the
// CUDA kernels read as many (cuda/layout/fragment_layout.hpp: MXFP4 keeps
// one multiplier byte per 32 weights).
constexpr double checkpoint_bits_per_weight(ExpertFormat f) { return f == ExpertFormat::Mxfp4 ? 4.25 : 4.5; }

// The name of a weight format on a benchmark's command line: "nvfp4" | "mxfp4".
const char* format_option_name(ExpertFormat f);
// The inverse; throws naming the value and the names accepted.
ExpertFormat parse_format_option(const std::string& s);
// A shared expert's weights on a benchmark's command line (--shared): "bf16"
// | "fp8" (block-scaled, as both DeepSeek-V4 releases hold it); throws as above.
SharedExpertFormat parse_shared_format_option(const std::string& s);

// The UE8M0 scale bytes of make_random_mxfp4_experts, inclusive: 2^-8 ..
// 2^-4, the block scales of weights of about N(0, 1/H) size at DeepSeek-V4's
// H (a block's amax / 6 is ~2^-8 .. 2^-6 there). Five binades: every row
// group lies well inside the 31 the CUDA kernels hold exactly, so their
// upload takes every expert.
constexpr uint8_t kRandomMxfp4ScaleLo = 127 - 8, kRandomMxfp4ScaleHi = 127 - 4;

// Experts [first, first + count) of `cfg` (global ids) as MXFP4 in
// ExpertWeights' layout: random code bytes (every E2M1 code in both nibbles)
// and scale bytes drawn about uniformly from [kRandomMxfp4ScaleLo,
// kRandomMxfp4ScaleHi]; no global or input scales. Deterministic in (seed,
// expert, tensor), so an expert has the same bytes whichever range asks for
// it; multithreaded. Throws if the range lies outside [0, cfg.experts).
ExpertWeights make_random_mxfp4_experts(const MoeConfig& cfg, uint64_t seed, int64_t first, int64_t count);

}  // namespace nvfp4moe
