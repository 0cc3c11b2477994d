// A small MXFP4 release as DeepSeek publishes it, for the tests of
// `nvfp4moe convert`: official names, two shards and an index (the main
// layer's experts and an FP8 attention weight in the first, the MTP block's
// experts in the second), config.json with DeepSeek's FP8
// quantization_config, an inference/ folder and a tokenizer file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {

struct Mxfp4Release {
  int64_t hidden = 128, intermediate = 64, experts = 2;
  std::map<std::string, Mxfp4Matrix> weights;  // "<block>.ffn.experts.<e>.<wN>" -> its MXFP4 weight
  std::vector<uint8_t> attn = std::vector<uint8_t>(size_t(128 * 128), 0x3A);  // FP8 [128, H]
  std::vector<uint8_t> attn_scale = {120};
};

// Codes random; scale bytes in [base, base + spread).
Mxfp4Matrix random_mxfp4(Rng& rng, int64_t N, int64_t K, int base, int spread);

// Experts 0..E-1 of layers.0 and mtp.0, w1 / w3 [I, H], w2 [H, I], scale
// bytes in [118, 118 + spread).
Mxfp4Release make_mxfp4_release(Rng& rng, int spread, int64_t H = 128, int64_t I = 64, int64_t E = 2);

void write_mxfp4_release(const Mxfp4Release& r, const std::string& dir);

}  // namespace nvfp4moe::test
