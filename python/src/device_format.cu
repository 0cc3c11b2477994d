// CUDA kernels behind device_format.hpp. One thread block per row; threads
// stride over the row's 16-element blocks. The per-row and per-tensor amax use
// an unsigned max over the bit patterns of |x|: for non-negative floats the
// bit order is the value order, and NaN (above +Inf) wins, which is the NaN
// propagation of fmt::abs_max_nan.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device_format.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::py {

namespace {

using namespace fmt;

constexpr int kThreads = 256;

#define NVFP4_CUDA_CHECK(call)                                                              \
  do {                                                                                      \
    cudaError_t _e = (call);                                                                \
    NVFP4_CHECK(_e == cudaSuccess, #call, " failed: ", cudaGetErrorName(_e), " (",          \
                cudaGetErrorString(_e), ")");                                               \
  } while (0)

// Makes `device` current for the scope of a launch and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    NVFP4_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) NVFP4_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

__device__ __forceinline__ float load_f32(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float load_f32(const __nv_bfloat16* x, int64_t i) { return __bfloat162float(x[i]); }

__device__ __forceinline__ uint32_t abs_bits(float v) { return float_to_bits(v) & 0x7fffffffu; }

// Spec section 3: the byte of (row m, scale column c) in the 128x4 layout.
__device__ __forceinline__ int64_t swizzled_offset_dev(int64_t m, int64_t c, int64_t kp) {
  return ((m >> 7) * (kp / 4) + (c >> 2)) * 512 + (m & 31) * 16 + ((m >> 5) & 3) * 4 + (c & 3);
}

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

template <typename T>
__global__ void tensor_amax_kernel(const T* x, int64_t n, uint32_t* amax_bits) {
  uint32_t m = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = max(m, abs_bits(load_f32(x, i)));
  atomicMax(amax_bits, m);
}

// g = amax / (6 * 448) in place: the buffer holds the amax's bit pattern,
// i.e. the amax itself read as a float.
__global__ void amax_to_global_scale_kernel(float* g) { g[0] = global_scale_from_amax(g[0]); }

template <typename T>
__global__ void quantize_rows_kernel(const T* x, int64_t cols, const float* g_in, bool row_amax, float* g_out,
                                     uint8_t* codes, uint8_t* scales, bool swizzled, int64_t kp) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * cols;
  float g;
  if (row_amax) {
    __shared__ uint32_t row_max;
    if (threadIdx.x == 0) row_max = 0;
    __syncthreads();
    uint32_t m = 0;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) m = max(m, abs_bits(load_f32(xr, i)));
    atomicMax(&row_max, m);
    __syncthreads();
    g = global_scale_from_amax(bits_to_float(row_max));
    if (threadIdx.x == 0) g_out[r] = g;
  } else {
    g = g_in[0];
  }
  const int64_t kb = cols / kBlock;
  for (int64_t b = threadIdx.x; b < kb; b += blockDim.x) {
    float v[kBlock];
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlock; ++i) {
      v[i] = load_f32(xr, b * kBlock + i);
      amax = abs_max_nan(amax, v[i]);
    }
    const uint8_t s = block_scale_byte(amax, g);
    const float d = block_dequant_factor(s, g);
    uint8_t* c = codes + r * (cols / 2) + b * (kBlock / 2);
#pragma unroll
    for (int i = 0; i < kBlock / 2; ++i)
      c[i] = uint8_t(quantize_element(v[2 * i], d) | (quantize_element(v[2 * i + 1], d) << 4));
    scales[swizzled ? swizzled_offset_dev(r, b, kp) : r * kb + b] = s;
  }
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

void check_launch(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  NVFP4_CHECK(e == cudaSuccess, kernel, " launch failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

template <typename T>
void quantize_typed(const DeviceQuantizeArgs& a, cudaStream_t st) {
  const T* x = static_cast<const T*>(a.x);
  const int64_t kp = round_up(a.cols / kBlock, 4);
  if (a.swizzled && a.rows > 0)
    NVFP4_CUDA_CHECK(cudaMemsetAsync(a.scales, 0, size_t(swizzled_scale_bytes(a.rows, a.cols / kBlock)), st));
  const float* g_in = a.g_out;
  switch (a.scope) {
    case ScaleScope::PerTensor: {
      NVFP4_CUDA_CHECK(cudaMemsetAsync(a.g_out, 0, sizeof(float), st));
      const int64_t n = a.rows * a.cols;
      const int blocks = int(std::min<int64_t>(1024, std::max<int64_t>(1, (n + kThreads - 1) / kThreads)));
      if (n > 0) {
        tensor_amax_kernel<T><<<blocks, kThreads, 0, st>>>(x, n, reinterpret_cast<uint32_t*>(a.g_out));
        check_launch("tensor_amax_kernel");
      }
      amax_to_global_scale_kernel<<<1, 1, 0, st>>>(a.g_out);
      check_launch("amax_to_global_scale_kernel");
      break;
    }
    case ScaleScope::Static:
      NVFP4_CUDA_CHECK(cudaMemcpyAsync(a.g_out, a.static_g, sizeof(float), cudaMemcpyDeviceToDevice, st));
      break;
    case ScaleScope::PerRow:
      break;
  }
  if (a.rows == 0) return;
  NVFP4_CHECK(a.rows <= int64_t(0x7fffffff), "quantize: too many rows for one launch: ", a.rows);
  quantize_rows_kernel<T><<<unsigned(a.rows), kThreads, 0, st>>>(x, a.cols, g_in, a.scope == ScaleScope::PerRow,
                                                                  a.g_out, a.codes, a.scales, a.swizzled, kp);
  check_launch("quantize_rows_kernel");
}

}  // namespace

void quantize_device(const DeviceQuantizeArgs& a) {
  DeviceGuard guard(a.device);
  cudaStream_t st = static_cast<cudaStream_t>(a.stream);
  if (a.x_is_bf16) quantize_typed<__nv_bfloat16>(a, st);
  else quantize_typed<float>(a, st);
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
  check_launch("dequantize_rows_kernel");
}

void scales_layout_device(const uint8_t* in, uint8_t* out, int64_t rows, int64_t k, bool to_swizzled, int device,
                          void* stream) {
  DeviceGuard guard(device);
  cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (to_swizzled) NVFP4_CUDA_CHECK(cudaMemsetAsync(out, 0, size_t(swizzled_scale_bytes(rows, k)), st));
  if (rows == 0 || k == 0) return;
  scales_layout_kernel<<<unsigned(rows), 128, 0, st>>>(in, out, k, round_up(k, 4), to_swizzled);
  check_launch("scales_layout_kernel");
}

}  // namespace nvfp4moe::py
