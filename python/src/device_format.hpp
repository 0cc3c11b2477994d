// NVFP4 quantization, dequantization and scale-layout conversion of arrays in
// CUDA device memory, for the Python module (device_format.cu). Quantization
// is the CUDA backend's activation staging (src/cuda/kernels/staging.hpp);
// dequantization and the layout conversions are small kernels here. Every
// byte comes from the codecs of src/format/nvfp4_codec.hpp, so the results
// equal the host quantizer's (tests/python/test_torch.py checks it bit for
// bit on the GPU).
//
// All work is queued on `stream` (a cudaStream_t) with no host
// synchronisation, so the calls can be captured in a CUDA graph. Arguments are
// checked by the caller (bind_format.cpp); these functions only launch.
#pragma once

#include <cstdint>

#include "nvfp4moe/format.hpp"

namespace nvfp4moe::py {

struct DeviceQuantizeArgs {
  const void* x = nullptr;  // [rows, cols] row-major
  bool x_is_bf16 = false;   // else f32
  int64_t rows = 0, cols = 0;
  ScaleScope scope = ScaleScope::PerRow;
  float static_g = 1.0f;            // Static
  float* g_out = nullptr;           // [rows] (PerRow) or [1]
  float* g_rows_scratch = nullptr;  // [rows] device scratch (PerTensor, Static)
  uint32_t* amax_scratch = nullptr; // one word of device scratch (PerTensor)
  uint8_t* codes = nullptr;         // [rows, cols/2]
  uint8_t* scales = nullptr;        // linear [rows, cols/16] or swizzled bytes
  bool swizzled = false;
  int device = 0;
  void* stream = nullptr;
};
void quantize_device(const DeviceQuantizeArgs& a);

struct DeviceDequantizeArgs {
  const uint8_t* codes = nullptr;   // [rows, cols/2]
  const uint8_t* scales = nullptr;  // linear or swizzled
  bool swizzled = false;
  const float* g = nullptr;         // [rows] or [1] in device memory
  int64_t g_stride = 0;
  int64_t rows = 0, cols = 0;
  void* out = nullptr;              // [rows, cols]
  bool out_is_bf16 = false;
  int device = 0;
  void* stream = nullptr;
};
void dequantize_device(const DeviceDequantizeArgs& a);

// linear [rows, k] <-> swizzled 128x4 (swizzled_scale_bytes(rows, k) bytes,
// padding zeroed on the way in).
void scales_layout_device(const uint8_t* in, uint8_t* out, int64_t rows, int64_t k, bool to_swizzled,
                          int device, void* stream);

}  // namespace nvfp4moe::py
