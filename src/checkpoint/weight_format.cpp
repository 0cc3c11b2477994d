#include "checkpoint/weight_format.hpp"

namespace nvfp4moe {

namespace {

constexpr const char* kScaleSuffixes[] = {".weight_scale", ".scale", ".weight_scale_inv"};

bool packed_fp4(DType t) { return t == DType::U8 || t == DType::I8 || t == DType::F4; }

}  // namespace

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::Nvfp4: return "NVFP4";
    case WeightFormat::Mxfp4: return "MXFP4";
    case WeightFormat::Fp8Block: return "FP8";
    case WeightFormat::Bf16: return "BF16";
    case WeightFormat::Missing: return "missing";
    case WeightFormat::Unknown: break;
  }
  return "unknown";
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

WeightFormat classify_weight(const ModelDir& dir, const std::string& prefix) {
  if (!dir.has(prefix + ".weight")) return WeightFormat::Missing;
  const DType w = dir.get(prefix + ".weight").dtype;
  const std::string ws = prefix + ".weight_scale", sc = prefix + ".scale", inv = prefix + ".weight_scale_inv";
  // ModelOpt's names: NVFP4 unless the weight is FP8 (its per-tensor FP8 form);
  // the loader checks the dtypes and shapes of the triple.
  if (dir.has(ws)) return w == DType::F8E4M3 ? WeightFormat::Unknown : WeightFormat::Nvfp4;
  if (dir.has(sc)) {
    const DType s = dir.get(sc).dtype;
    if (w == DType::F8E4M3) return WeightFormat::Fp8Block;
    if (packed_fp4(w) && s == DType::F8E8M0) return WeightFormat::Mxfp4;
    return WeightFormat::Unknown;
  }
  if (dir.has(inv)) return w == DType::F8E4M3 ? WeightFormat::Fp8Block : WeightFormat::Unknown;
  if (w == DType::F8E4M3) return WeightFormat::Fp8Block;  // its scale is missing: the loader names it
  if (w == DType::BF16 || w == DType::F16 || w == DType::F32) return WeightFormat::Bf16;
  return WeightFormat::Unknown;
}

std::string describe_weight(const ModelDir& dir, const std::string& prefix) {
  if (!dir.has(prefix + ".weight")) return "no tensor \"" + prefix + ".weight\"";
  const TensorInfo& w = dir.get(prefix + ".weight");
  std::string r = w.name + " " + dtype_name(w.dtype) + " " + shape_text(w.shape);
  for (const char* suffix : kScaleSuffixes)
    if (dir.has(prefix + suffix)) {
      const TensorInfo& s = dir.get(prefix + suffix);
      r += std::string(" with ") + suffix + " " + dtype_name(s.dtype) + " " + shape_text(s.shape);
      break;
    }
  return r;
}

}  // namespace nvfp4moe
