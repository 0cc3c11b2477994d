// DeviceQuantizer: NVFP4 quantization of host tensors on a GPU, for
// `nvfp4moe quantize --device cuda`: a tensor is uploaded once (BF16 as it
// is, other float types as F32), its amax and its codes and block scales
// under a given global scale come from the activation staging's kernels
// (kernels/staging.hpp), which give the host quantizer's bytes
// (docs/numerics.md §2). Every copy and kernel runs on its own stream. Device buffers grow to the largest tensor seen.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "cuda/cuda_check.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/types.hpp"

namespace nvfp4moe::cuda {

class DeviceQuantizer {
 public:
  explicit DeviceQuantizer(int device = 0);

  // max |x| of a 2-D float tensor (BF16, F16, F32 or F64); NaN or Inf is an
  // error naming it.
  float amax(const TensorInfo& t);
  // Its codes [N, K/2] and linear UE4M3 scales [N, K/16] under g
  // (global_scale holds g); K a multiple of 16, NaN or Inf an error.
  Nvfp4Matrix quantize(const TensorInfo& t, float g);

 private:
  // Uploads t unless it is the tensor uploaded last.
  void upload(const TensorInfo& t);

  int device_;
  CudaStream stream_;
  DeviceBuffer<uint8_t> x_;  // the tensor: BF16 or F32
  bool x_bf16_ = false;
  std::string x_name_;
  const void* x_src_ = nullptr;
  std::optional<float> x_amax_;  // of the uploaded tensor, once taken
  DeviceBuffer<uint8_t> codes_, scales_;
  DeviceBuffer<float> g_rows_;
  DeviceBuffer<unsigned> amax_{1};
};

}  // namespace nvfp4moe::cuda
