// One MXFP4 weight [N, K] to NVFP4 (docs/checkpoints.md, "convert"): the
// numerics of `nvfp4moe convert`, apart from the checkpoint plumbing.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace nvfp4moe {

struct Nvfp4Tensor {
  std::vector<uint8_t> codes;   // [N, K/2]
  std::vector<uint8_t> scales;  // [N, K/16] UE4M3
  float g = 1.0f;               // weight_scale_2
  int64_t blocks = 0, exact_blocks = 0;  // lossless cast: blocks kept exactly
};

// max |value| over the tensor (exact: the largest code magnitude times its scale).
float mxfp4_amax(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K);
// The largest k = b - 127 over the scale bytes b != 0 (ModelOpt's compute_k_stats:
// byte 0 marks an all-zero block); 0 when every byte is 0.
int mxfp4_kmax(const uint8_t* scales, int64_t n);

// quantize_to_nvfp4.py: dequantize to BF16 (exact), then NVFP4 with the given
// global scale g (docs/numerics.md §2, ModelOpt's NVFP4QTensor).
Nvfp4Tensor requantize_mxfp4(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K, float g);

// cast_mxfp4_to_nvfp4.py with g = 2^m: each 16-block of MX block j with
// delta = k_j - m in [-9, 8] keeps its codes and gets the E4M3 scale 2^delta
// (exact); the others are requantized from their exact values with §2's
// formula under g. Rows run on `threads` threads.
Nvfp4Tensor cast_mxfp4_lossless(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K, int m,
                                int threads);

struct Mxfp4WeightView;

// Where convert's numerics run: the functions above on the host
// (host_convert_numerics), or a GPU's with the same bytes
// (cuda/backend/device_quantizer.hpp). Each takes one checked MXFP4 weight.
struct ConvertNumerics {
  std::function<float(const Mxfp4WeightView&)> amax;              // mxfp4_amax
  std::function<int(const Mxfp4WeightView&)> kmax;                // mxfp4_kmax over its scale bytes
  std::function<Nvfp4Tensor(const Mxfp4WeightView&, float g)> requantize;
  std::function<Nvfp4Tensor(const Mxfp4WeightView&, int m)> cast_lossless;
};

ConvertNumerics host_convert_numerics(int threads);

}  // namespace nvfp4moe
