// CUDA side of device_format.hpp. Quantization delegates to the CUDA
// backend's activation staging; dequantization and the layout conversions run
// one thread block per row, threads striding over the row.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/staging.hpp"
#include "device_format.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::py {

namespace {

using namespace fmt;
using cuda::DeviceGuard;
using cuda::round_up;

constexpr int kThreads = 256;

// docs/numerics.md §3: the byte of (row m, scale column c) in the 128x4 layout.
__device__ __forceinline__ int64_t swizzled_offset_dev(int64_t m, int64_t c, int64_t kp) {
  return ((m >> 7) * (kp / 4) + (c >> 2)) * 512 + (m & 31) * 16 + ((m >> 5) & 3) * 4 + (c & 3);
}

template <typename T>
__device__ __forceinline__ void store(T* out, int64_t i, float v);
template <>
__device__ __forceinline__ void store<float>(float* out, int64_t i, float v) { out[i] = v; }
template <>
__device__ __forceinline__ void store<__nv_bfloat16>(__nv_bfloat16* out, int64_t i, float v) {
  out[i] = __float2bfloat16_rn(v);
}

template <typename T>
__global__ void dequantize_rows_kernel(const uint8_t* codes, const uint8_t* scales, bool swizzled, int64_t kp,
                                       const float* g, int64_t g_stride, int64_t cols, T* out) {
  const int64_t r = blockIdx.x;
  const float gr = g[r * g_stride];
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const int64_t b = i / kBlock;
    const uint8_t s = scales[swizzled ? swizzled_offset_dev(r, b, kp) : r * (cols / kBlock) + b];
    const uint8_t q = (codes[r * (cols / 2) + i / 2] >> ((i & 1) * 4)) & 0xF;
    store(out, r * cols + i, e2m1_value(q) * e4m3_value(s) * gr);  // the host's order of products
  }
}

__global__ void scales_layout_kernel(const uint8_t* in, uint8_t* out, int64_t k, int64_t kp, bool to_swizzled) {
  const int64_t m = blockIdx.x;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
    const int64_t s = swizzled_offset_dev(m, c, kp);
    if (to_swizzled) out[s] = in[m * k + c];
    else out[m * k + c] = in[s];
  }
}


}  // namespace

void quantize_device(const DeviceQuantizeArgs& a) {
  DeviceGuard guard(a.device);
  cudaStream_t st = static_cast<cudaStream_t>(a.stream);
  cuda::QuantizeActArgs q;
  q.x = a.x;
  q.x_is_bf16 = a.x_is_bf16;
  q.rows = a.rows;
  q.cols = a.cols;
  q.scope = a.scope == ScaleScope::PerRow      ? cuda::ActScope::PerRow
            : a.scope == ScaleScope::PerTensor ? cuda::ActScope::PerTensor
                                               : cuda::ActScope::Static;
  q.static_g = a.static_g;
  q.amax_scratch = a.amax_scratch;
  // The staging writes one g per row; a per-tensor or static scope returns one.
  q.g_out = a.scope == ScaleScope::PerRow ? a.g_out : a.g_rows_scratch;
  q.codes = a.codes;
  (a.swizzled ? q.scales_swizzled : q.scales_linear) = a.scales;
  cuda::stage_activations(q, st);  // the fast kernel where it applies: the same bytes
  if (a.scope != ScaleScope::PerRow) {
    if (a.rows > 0) {
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(a.g_out, a.g_rows_scratch, sizeof(float), cudaMemcpyDeviceToDevice, st));
    } else {  // no rows: g of an empty scope (amax 0 -> 1, or the static g)
      const float g = a.scope == ScaleScope::Static ? a.static_g : 1.0f;
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(a.g_out, &g, sizeof(float), cudaMemcpyHostToDevice, st));
      NVFP4_CUDA_CHECK(cudaStreamSynchronize(st));  // `g` lives on this stack frame
    }
  }
}

void dequantize_device(const DeviceDequantizeArgs& a) {
  if (a.rows == 0) return;
  DeviceGuard guard(a.device);
  cudaStream_t st = static_cast<cudaStream_t>(a.stream);
  const int64_t kp = round_up(a.cols / kBlock, 4);
  if (a.out_is_bf16)
    dequantize_rows_kernel<<<unsigned(a.rows), kThreads, 0, st>>>(a.codes, a.scales, a.swizzled, kp, a.g, a.g_stride,
                                                                  a.cols, static_cast<__nv_bfloat16*>(a.out));
  else
    dequantize_rows_kernel<<<unsigned(a.rows), kThreads, 0, st>>>(a.codes, a.scales, a.swizzled, kp, a.g, a.g_stride,
                                                                  a.cols, static_cast<float*>(a.out));
  NVFP4_CUDA_CHECK_LAUNCH("dequantize_rows_kernel");
}

void scales_layout_device(const uint8_t* in, uint8_t* out, int64_t rows, int64_t k, bool to_swizzled, int device,
                          void* stream) {
  DeviceGuard guard(device);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (to_swizzled) NVFP4_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(swizzled_scale_bytes(rows, k)), st));
  if (rows == 0 || k == 0) return;
  scales_layout_kernel<<<unsigned(rows), 128, 0, st>>>(in, out, k, round_up(k, 4), to_swizzled);
  NVFP4_CUDA_CHECK_LAUNCH("scales_layout_kernel");
}

}  // namespace nvfp4moe::py
