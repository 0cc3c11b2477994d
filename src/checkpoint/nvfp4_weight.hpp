// One ModelOpt NVFP4 linear weight of a checkpoint, found and validated by
// the one set of rules every reader applies (load_moe_layer, dequantize,
// inspect and its layer summary):
//
//   <prefix>.weight          U8       [N, K/2]   packed E2M1 codes, K a multiple of 16
//   <prefix>.weight_scale    F8_E4M3  [N, K/16]  UE4M3 block scales (format/nvfp4_validate.hpp)
//   <prefix>.weight_scale_2  F32      [] or [1]  the global scale, finite and > 0
//   <prefix>.input_scale     F32      [] or [1]  optional; finite and > 0 when present
//
// Any of the first three missing, when another is there, is an error naming
// it: a weight_scale_2 without its weight_scale is a malformed triple, not a
// tensor to pass through.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe {

// How much of the data is read: headers only (names, dtypes, shapes), also
// the scalar scales (4 bytes each), or also every block-scale byte.
enum class Nvfp4Read : uint8_t { Headers, Scalars, Everything };

struct Nvfp4Weight {
  const TensorInfo* codes = nullptr;   // .weight
  const TensorInfo* scales = nullptr;  // .weight_scale
  int64_t rows = 0, cols = 0;          // N, K (elements)
  float global_scale = 0.0f;           // .weight_scale_2; read unless Headers
  std::optional<float> input_scale;    // .input_scale when present; read unless Headers
};

// `find` gives a tensor by name, null when absent; `where` names the file or
// directory in "missing tensor" errors. `shape` {N, K}: the geometry the
// caller expects (a layer's), else taken from the codes.
using TensorLookup = std::function<const TensorInfo*(const std::string&)>;
Nvfp4Weight read_nvfp4_weight(const TensorLookup& find, const std::string& where, const std::string& prefix,
                              std::optional<std::pair<int64_t, int64_t>> shape, Nvfp4Read read);
Nvfp4Weight read_nvfp4_weight(const ModelDir& dir, const std::string& prefix,
                              std::optional<std::pair<int64_t, int64_t>> shape, Nvfp4Read read);
Nvfp4Weight read_nvfp4_weight(const SafetensorsFile& file, const std::string& prefix,
                              std::optional<std::pair<int64_t, int64_t>> shape, Nvfp4Read read);

}  // namespace nvfp4moe
