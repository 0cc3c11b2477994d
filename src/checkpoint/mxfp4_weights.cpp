// The official MXFP4 weight layout, read and checked (docs/checkpoints.md).
#include "checkpoint/mxfp4_weights.hpp"

#include "checkpoint/weight_format.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

Mxfp4WeightView read_mxfp4_weight(const ModelDir& dir, const std::string& prefix, int64_t N, int64_t K) {
  Mxfp4WeightView v;
  v.weight = &dir.get(prefix + ".weight");
  v.scale = &dir.get(prefix + ".scale");
  const TensorInfo &w = *v.weight, &s = *v.scale;
  const bool packed = w.dtype == DType::I8 || w.dtype == DType::U8;
  NVFP4_CHECK(packed || w.dtype == DType::F4, "tensor \"", w.name, "\": dtype ", dtype_name(w.dtype),
              ", expected I8 or U8 (packed E2M1, two codes a byte) or F4 (an MXFP4 weight)");
  NVFP4_CHECK(w.shape.size() == 2, "tensor \"", w.name, "\": shape ", shape_text(w.shape), ", expected 2-D");
  v.rows = w.shape[0];
  v.cols = packed ? 2 * w.shape[1] : w.shape[1];
  if (N >= 0 && K >= 0) {
    const std::vector<int64_t> want = packed ? std::vector<int64_t>{N, K / 2} : std::vector<int64_t>{N, K};
    NVFP4_CHECK(w.shape == want, "tensor \"", w.name, "\": shape ", shape_text(w.shape), ", expected ",
                shape_text(want));
  }
  NVFP4_CHECK(v.cols % kMxfp4BlockSize == 0, "tensor \"", w.name, "\": ", v.cols,
              " columns, not a multiple of 32 (the MXFP4 block)");
  NVFP4_CHECK(s.dtype == DType::F8E8M0, "tensor \"", s.name, "\": dtype ", dtype_name(s.dtype),
              ", expected F8_E8M0 (UE8M0 block scales of an MXFP4 weight)");
  const std::vector<int64_t> want_s = {v.rows, v.cols / kMxfp4BlockSize};
  NVFP4_CHECK(s.shape == want_s, "tensor \"", s.name, "\": shape ", shape_text(s.shape), ", expected ",
              shape_text(want_s), " (one scale per 32 elements of ", w.name, ")");
  check_mxfp4_scales(s.data, v.rows, v.cols, ("tensor \"" + s.name + "\"").c_str());
  return v;
}

}  // namespace nvfp4moe
