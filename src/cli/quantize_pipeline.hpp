// The work of `nvfp4moe quantize` on one input file, as a pipeline of three
// stages on three threads (common/stage_pipeline.hpp):
//   read     a group's input bytes made resident (GPU: pread into pinned
//            staging by several threads)
//   compute  its amaxes, the global scale, its codes and block scales
//            (GPU: upload, kernels and the download queued on streams)
//   write    its outputs written at their offsets in the output file, whose
//            header went first (SafetensorsWriter's deferred tensors)
// so the file is read, quantized and written at once. A group is one tensor,
// or an expert's gate and up when both are quantized and lie in the file:
// their shared global scale comes from amaxes taken while both are
// resident, so each input byte is read once. Tensors that stay as they are
// pass through the write stage (a copy from the mapping), in file order
// with the rest.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/pattern.hpp"
#include "common/stage_pipeline.hpp"
#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe::cli {

// Where quantize's arithmetic runs: the host's quantize_matrix, or a GPU
// (cuda/backend/device_quantizer.hpp) with the same bytes. The pipeline
// calls load from the read stage, amaxes / quantize / amax from the compute
// stage and result from the write stage; slot (in [0, slots())) is the
// buffer set of the group in flight (run_stages' slot).
class QuantizeEngine {
 public:
  struct Result {
    const uint8_t* codes;   // [N, K/2]
    const uint8_t* scales;  // [N, K/16] linear UE4M3
  };
  virtual ~QuantizeEngine() = default;
  virtual int slots() const = 0;
  // Makes the group's tensors (2-D, float) resident for `slot`.
  virtual void load(int slot, const SafetensorsFile& file, const std::vector<const TensorInfo*>& group) = 0;
  // max |x| of each tensor of the slot's group; NaN or Inf is an error naming it.
  virtual std::vector<float> amaxes(int slot) = 0;
  // Quantizes the slot's tensors under global scale g; may return before the
  // results exist.
  virtual void quantize(int slot, float g) = 0;
  // Tensor j of the slot's group, once quantized; valid until the slot is
  // loaded again.
  virtual Result result(int slot, size_t j) = 0;
  // max |x| of a tensor outside the groups (a gate or up whose partner lies
  // in another shard).
  virtual float amax(const TensorInfo& t) = 0;
  // The engine's own phases, lines of "timing: ..." ("" when it has none).
  virtual std::string timing() { return ""; }
};

// The float dtypes quantize reads (F32, BF16, F16, F64); whether a name ends
// in ".weight"; milliseconds since t0.
bool is_float_dtype(DType t);
bool ends_with_weight(const std::string& name);
double ms_since(std::chrono::steady_clock::time_point t0);

// "cpu" or "cuda" (refused without a CUDA build or device); `timing` turns
// on the device's event timing.
std::unique_ptr<QuantizeEngine> make_quantize_engine(const std::string& device, bool timing);

// Which tensors become NVFP4 and the global scale of each. An expert's gate
// and up (w1 / w3, gate_proj / up_proj) that are both quantized get one g
// from the larger of their amaxes, as both of ModelOpt's exports write them:
// the DeepSeek-V4 script fuses the w1 / w3 amaxes by max ("one fused GEMM1
// scale"), and the Hugging Face export's requantize_resmooth_fused_llm_layers
// gives linears that share an input (an expert's gate_proj and up_proj,
// experts.N matched by name too) the max weight amax in
// preprocess_linear_fusion. Every other weight gets its own g. Pairs are
// found across shards.
class QuantizePlan {
 public:
  QuantizePlan(const ModelDir& md, const Pattern& include) : md_(md), include_(include) {}

  bool quantized(const TensorInfo& t) const;
  // The name of t's gate/up partner when the model has it and it is
  // quantized too (t quantized), else nullopt.
  std::optional<std::string> partner(const TensorInfo& t) const;
  const TensorInfo& tensor(const std::string& name) const { return md_.get(name); }
  // The amax of a tensor, kept by name: a partner in another shard is
  // measured once for its pair, and remembered when its own shard comes.
  float amax(const TensorInfo& t, QuantizeEngine& engine);
  void remember_amax(const std::string& name, float amax) { amax_[name] = amax; }

  // The manifest's module of a quantized tensor: an expert's "<ffn>experts"
  // (as ModelOpt keys quantized_layers), else the tensor's own module.
  static std::string module_of(const std::string& name);

 private:
  const ModelDir& md_;
  const Pattern& include_;
  std::map<std::string, float> amax_;
};

// Where the time of the pipelines went, summed over the files.
struct QuantizeTimes {
  StageTimes read, compute, write;
  double write_io_ms = 0;  // of write.busy_ms: in SafetensorsStream::write
  double pipeline_ms = 0;  // wall time of the pipelines
  uint64_t bytes_in = 0, bytes_out = 0;
  int64_t groups = 0;
};

// The groups of a file in the order the pipeline takes them (by offset in
// the file): indices into file.tensors(); a group is one tensor or a
// gate/up pair (plan.partner in the same file).
std::vector<std::vector<size_t>> quantize_groups(const SafetensorsFile& file, const QuantizePlan& plan);

// Declares the output tensors of `file` in `w` (every tensor in the file's
// order: a quantized one as weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
// weight_scale_2 F32 [], the others as they are) and sets w's filler to the
// pipeline that computes and writes them. `tick` runs once per input tensor
// written (the write stage's thread). Every reference must outlive w.write().
void add_quantized_file(const SafetensorsFile& file, SafetensorsWriter& w, QuantizePlan& plan,
                        QuantizeEngine& engine, std::function<void()> tick, QuantizeTimes& times);

}  // namespace nvfp4moe::cli
