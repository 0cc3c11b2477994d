// DeepSeek's MXFP4 release -> NVIDIA's NVFP4-expert checkpoint, as NVIDIA
// ModelOpt's examples/deepseek/deepseek_v4/quantize_to_nvfp4.py writes it
// (docs/checkpoints.md, "convert"). Streaming: one shard at a time, its
// expert tensors converted by the workers and each written at its offset as
// soon as it exists; everything else byte for byte.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/convert_expert.hpp"

namespace nvfp4moe {

struct ConvertOptions {
  // ModelOpt's closed-form cast (examples/deepseek/cast_mxfp4_to_nvfp4.py):
  // weight_scale_2 = 2^m, m = k_max - 8 (w1 and w3 of an expert: the larger
  // k_max), so every block whose 2^(k_j - m) is an E4M3 power of two keeps its
  // codes and values exactly; the others are requantized and reported.
  // Otherwise: MXFP4 -> BF16 -> NVFP4 with g = amax / 2688 (quantize_to_nvfp4.py).
  bool lossless = false;
  bool include_mtp = false;  // also the mtp.* experts (ModelOpt: --include_mtp_experts)
  // Calibration amaxes keyed as ModelOpt dumps them:
  // "<block>.ffn.experts.<e>.<w1|w2|w3>_{weight,input}_quantizer._amax".
  // A weight amax replaces the one taken from the weights; input amaxes make
  // `input_scale` = amax / 2688 (w1 and w3 fused by max; an expert without one
  // takes the max over the calibrated experts of its projection). None given:
  // no input_scale is written.
  std::map<std::string, float> amax;
  int threads = 0;
  // Where the amaxes, k_max and NVFP4 bytes are computed; unset: on the host
  // (host_convert_numerics(threads)). `nvfp4moe convert --device cuda` passes
  // the GPU's, which give the same bytes.
  std::optional<ConvertNumerics> numerics;
  // With make_numerics set, `workers` of them convert a shard's expert
  // weights at once, each with its own numerics (a GPU's: its own stream and
  // buffers, so that one worker's copies overlap another's kernels); the
  // bytes are the same as one worker's.
  std::function<ConvertNumerics()> make_numerics;
  int workers = 1;
  std::function<void(const std::string&)> progress;  // one line per shard
  // Once per expert weight written (calls never overlap, whichever worker
  // wrote it): `done` of the `total` expert weights the conversion writes,
  // and the file name of the shard being written.
  std::function<void(int64_t done, int64_t total, const std::string& shard)> weight_done;
};

struct ConvertReport {
  int64_t shards = 0, experts_converted = 0, tensors_passed = 0;
  int64_t blocks = 0, exact_blocks = 0;   // NVFP4 blocks; lossless: those kept exactly
  std::vector<std::string> inexact;       // lossless: "<weight>: n of m blocks requantized"
};

// in, out: model directories (out must not exist or be empty of a model).
ConvertReport convert_mxfp4_to_nvfp4(const std::string& in, const std::string& out, const ConvertOptions& options);

}  // namespace nvfp4moe
