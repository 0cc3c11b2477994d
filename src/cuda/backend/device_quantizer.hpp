// DeviceQuantizer: NVFP4 quantization of host tensors on a GPU, for
// `nvfp4moe quantize --device cuda` and `nvfp4moe convert --device cuda`:
// a tensor is uploaded once (BF16 as it is, other float types as F32; an
// MXFP4 weight as its codes and UE8M0 bytes, decoded to BF16 on the device,
// exactly: kernels/mxfp4_decode.hpp), its amax and its codes and block
// scales under a given global scale come from the activation staging's
// kernels (kernels/staging.hpp), which give the host quantizer's bytes
// (docs/numerics.md §2). Every copy and kernel runs on the quantizer's own
// streams.
// Device buffers grow to the largest tensor seen.
//
// Single-tensor calls (convert's, and amax of a plain tensor): their copies
// go through two pinned halves of a few MB (staged copies below), not
// pageable memory, so the DMA runs at the link's rate next to the host: a
// tensor goes up in chunks, the host copying chunk i out of the (mapped)
// source into one half while chunk i-1's DMA reads the other, and its codes
// and scales come down the same way, chunk i+1's DMA running while the host
// appends chunk i to the result's vector (the one copy a std::vector result
// needs). A half is reused once the event after its last copy has passed.
//
// Groups in flight (quantize's pipeline, cli/quantize_pipeline.hpp): a group
// is one tensor or an expert's gate and up, and `slots` groups are in flight
// at once, each with pinned host staging and device buffers of its own, so
// the host fills one slot while the GPU works on another and a third is
// written out. A group's uploads, kernels and downloads run on three streams
// (copies in both directions next to the kernels), ordered by events; the
// group crosses PCIe once: its amaxes and its codes come from one upload.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/convert_expert.hpp"
#include "checkpoint/mxfp4_weights.hpp"
#include "cuda/cuda_check.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/types.hpp"

namespace nvfp4moe::cuda {

// Device time spent by a DeviceQuantizer since enable_timing(): milliseconds
// between CUDA events on its stream around the uploads, the kernels and the
// downloads of each call. A single-tensor call usually finds its stream
// idle (the calls before it waited for their results), so its upload span
// runs from the first host copy into pinned staging to the last chunk's
// arrival on the device, and its download span from the end of its kernels
// to the last byte appended to the result.
struct DeviceQuantizerTimes {
  double upload_ms = 0, kernel_ms = 0, download_ms = 0;
  int64_t uploads = 0;  // tensors sent to the device
  uint64_t upload_bytes = 0, download_bytes = 0;
};

class DeviceQuantizer {
 public:
  explicit DeviceQuantizer(int device = 0);
  ~DeviceQuantizer();

  // max |x| of a 2-D float tensor (BF16, F16, F32 or F64); NaN or Inf is an
  // error naming it (a gate or up whose partner lies in another shard; the
  // quantization itself goes through the groups below).
  float amax(const TensorInfo& t);

  // An MXFP4 weight as read by read_mxfp4_weight (its scale bytes checked):
  // the functions of checkpoint/convert_expert.hpp, the same results.
  float amax(const Mxfp4WeightView& w);               // mxfp4_amax
  int kmax(const Mxfp4WeightView& w);                 // mxfp4_kmax of its scale bytes
  Nvfp4Tensor requantize(const Mxfp4WeightView& w, float g);  // requantize_mxfp4
  Nvfp4Tensor cast_lossless(const Mxfp4WeightView& w, int m);  // cast_mxfp4_lossless

  // One tensor of a group: BF16 values as they are, other float types as F32.
  struct GroupTensor {
    std::string name;
    int64_t rows = 0, cols = 0;  // cols a multiple of 16
    bool bf16 = true;
  };
  struct GroupResult {
    const uint8_t* codes;   // [rows, cols/2]
    const uint8_t* scales;  // [rows, cols/16] linear UE4M3
  };
  // Sets the number of slots (>= 1; before the first group).
  void set_slots(int slots);
  // Reader thread: pinned host memory for each tensor of the group, of
  // rows * cols * (2 or 4) bytes, to be filled before group_amaxes(slot).
  std::vector<uint8_t*> stage_group(int slot, const std::vector<GroupTensor>& group);
  // Compute thread: uploads the slot's group and returns the amax of each
  // tensor (NaN or Inf an error naming it); waits for the amaxes only.
  std::vector<float> group_amaxes(int slot);
  // Compute thread: queues the quantization of the slot's group under g and
  // the download of its codes and scales into pinned memory.
  void quantize_group(int slot, float g);
  // Writer thread: waits for the download; tensor j's bytes, valid until the
  // slot is staged again.
  GroupResult group_result(int slot, size_t j);

  void enable_timing();
  DeviceQuantizerTimes times();  // synchronises

 private:
  enum class Span { Upload, Kernels, Download };
  struct Slot;
  // Events around work queued by f on `stream`, when timing is on (called
  // from one thread at a time: the compute stage's).
  template <typename F>
  void timed(Span what, cudaStream_t stream, F&& f);
  // Uploads t unless it is the tensor uploaded last.
  void upload(const TensorInfo& t);
  // Uploads w's codes and scale bytes (unless uploaded last) and, when
  // decode, its BF16 values into x_.
  void upload(const Mxfp4WeightView& w, bool decode);
  // The amax of the tensor in x_ (numel values), refusing NaN / Inf.
  float uploaded_amax(const std::string& name, int64_t numel);
  // Queues the quantization of x_ [N, K] under g into codes_ / scales_.
  void quantize_uploaded(int64_t N, int64_t K, float g);
  // Queues the quantization of x [N, K] (BF16 or F32) under g on stream_
  // into codes [N, K/2] and linear scales [N, K/16]; g_rows_ holds N rows.
  void queue_quantization(const uint8_t* x, bool bf16, int64_t N, int64_t K, float g, uint8_t* codes,
                          uint8_t* scales);
  // Downloads codes_ / scales_ of x_ [N, K] into the vectors (replaced).
  void download(std::vector<uint8_t>& codes, std::vector<uint8_t>& scales, int64_t N, int64_t K);

  // Staged copies on stream_ (see the top of this file), in chunks of at
  // most kStagingChunk bytes through staging_'s two halves.
  static constexpr size_t kStagingChunk = size_t(4) << 20;
  struct ToDevice {
    const uint8_t* from;
    uint8_t* to;
    size_t bytes;
  };
  struct ToHost {
    const uint8_t* from;
    std::vector<uint8_t>* to;  // appended to
    size_t bytes;
  };
  // Returns once the last chunk is queued: the sources may then change.
  void upload_staged(const std::vector<ToDevice>& pieces);
  // Returns once every byte is in its vector.
  void download_staged(const std::vector<ToHost>& pieces);
  // Half i % 2 of staging_ (allocated on first use).
  uint8_t* staging_half(size_t i);
  // Waits for the last copy queued on half i % 2 (its event in half_done_).
  void wait_half(size_t i);

  int device_;
  CudaStream stream_;  // kernels (and the single-tensor calls' copies)
  CudaStream upload_stream_, download_stream_;  // groups' copies
  std::vector<std::unique_ptr<Slot>> slots_;
  DeviceBuffer<uint8_t> x_;  // the tensor: BF16 or F32
  bool x_bf16_ = false;
  std::string x_name_;
  const void* x_src_ = nullptr;
  std::optional<float> x_amax_;  // of the uploaded tensor, once taken
  DeviceBuffer<uint8_t> codes_, scales_;
  DeviceBuffer<float> g_rows_;
  DeviceBuffer<unsigned> amax_{1};
  // The MXFP4 weight whose codes and UE8M0 bytes were uploaded last (x_
  // holds its values when x_name_ / x_src_ name it).
  DeviceBuffer<uint8_t> mx_codes_, mx_scales_;
  std::string mx_codes_name_, mx_scales_name_;
  const void* mx_codes_src_ = nullptr;
  const void* mx_scales_src_ = nullptr;
  DeviceBuffer<unsigned> max_byte_{1};
  DeviceBuffer<unsigned long long> exact_{1};
  // The single-tensor calls' staging: two halves of kStagingChunk bytes,
  // each with an event recorded on stream_ after the last copy using it.
  PinnedBuffer staging_;
  CudaEvent half_done_[2] = {CudaEvent(cudaEventDisableTiming), CudaEvent(cudaEventDisableTiming)};

  bool timing_ = false;
  struct Timed {
    Span what;
    CudaEvent begin, end;
  };
  std::vector<Timed> spans_;
  DeviceQuantizerTimes times_;
};

// convert's numerics (checkpoint/convert.hpp) on a DeviceQuantizer.
ConvertNumerics device_convert_numerics(std::shared_ptr<DeviceQuantizer> q);

}  // namespace nvfp4moe::cuda
