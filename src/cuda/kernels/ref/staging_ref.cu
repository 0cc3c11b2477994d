// The reference activation staging kernels (kernels/staging.hpp has the
// contract). Every byte comes from the scalar codecs of
// src/format/nvfp4_codec.hpp in docs/numerics.md §2's order of operations
// (block_scale_byte, quantize_element); this file is compiled WITHOUT
// fast-math, so their divisions are IEEE divisions.
#include <cuda_bf16.h>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/ref/staging_ref.hpp"
#include "cuda/kernels/staging.hpp"
#include "format/mxfp4_codec.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe::cuda {

namespace {

using namespace nvfp4moe::fmt;

constexpr int kThreads = 256;

__device__ __forceinline__ float load_value(const void* x, bool bf16, int64_t i) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]) : static_cast<const float*>(x)[i];
}

// NaN-propagating max |x| over a block of threads; every thread gets the result.
__device__ float block_abs_max(float v) {
  __shared__ float part[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = abs_max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = 0.0f;
  for (int w = 0; w < int(blockDim.x >> 5); ++w) m = abs_max_nan(m, part[w]);
  __syncthreads();
  return m;
}

// One 16-element block under global scale g: writes its 8 code bytes, scale
// byte(s) and BF16 operand values as requested.
template <typename Load>
__device__ __forceinline__ void quantize_block16(Load load, int64_t row, int64_t b, int64_t cols, float g,
                                                 uint8_t* codes, uint8_t* scales_linear,
                                                 uint8_t* scales_swizzled, int64_t kp,
                                                 __nv_bfloat16* deq, int64_t deq_ld, bool kslot) {
  float v[kBlock];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kBlock; ++i) {
    v[i] = load(b * kBlock + i);
    amax = abs_max_nan(amax, v[i]);
  }
  const uint8_t s = block_scale_byte(amax, g);
  const float d = block_dequant_factor(s, g);
  const float sv = e4m3_value(s);
  uint8_t q[kBlock];
#pragma unroll
  for (int i = 0; i < kBlock; ++i) q[i] = quantize_element(v[i], d);
  if (codes) {
    uint2 packed;
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < kBlock; ++i) w[i / 8] |= uint32_t(q[i]) << (4 * (i % 8));
    packed.x = w[0];
    packed.y = w[1];
    *reinterpret_cast<uint2*>(codes + row * (cols / 2) + b * 8) = packed;
  }
  if (scales_linear) scales_linear[row * (cols / kBlock) + b] = s;
  if (scales_swizzled)
    scales_swizzled[swizzled_offset(row, b, kp)] = s;
  if (deq) {
    __nv_bfloat16* o = deq + row * deq_ld;
#pragma unroll
    for (int i = 0; i < kBlock; i += 2) {
      // value(q) * f32(s) is exact in FP32 and in BF16 (docs/numerics.md §2).
      __nv_bfloat162 pair = __floats2bfloat162_rn(e2m1_value(q[i]) * sv, e2m1_value(q[i + 1]) * sv);
      const int64_t col = b * kBlock + i;
      *reinterpret_cast<__nv_bfloat162*>(o + (kslot ? operand_kslot_column(col) : col)) = pair;
    }
  }
}

// A row in the Bf16 or Fp8 mode (staging.hpp): one thread per 128-column
// block, in docs/numerics.md §7's order: round to BF16, the block's amax and
// scale (Fp8), then each operand value.
template <typename Load>
__device__ void stage_row_unquantized(Load load, ActivationMode mode, int64_t cols, __nv_bfloat16* out,
                                      bool kslot) {
  for (int64_t b0 = int64_t(threadIdx.x) * kFp8ActBlock; b0 < cols; b0 += int64_t(blockDim.x) * kFp8ActBlock) {
    const int64_t len = cols - b0 < kFp8ActBlock ? cols - b0 : kFp8ActBlock;
    float s = 1.0f;
    if (mode == ActivationMode::Fp8) {
      float amax = 0.0f;
      for (int64_t i = 0; i < len; ++i) amax = abs_max_nan(amax, __bfloat162float(__float2bfloat16_rn(load(b0 + i))));
      s = fp8_act_block_scale(amax);
    }
    for (int64_t i = 0; i < len; ++i) {
      float v = __bfloat162float(__float2bfloat16_rn(load(b0 + i)));
      if (mode == ActivationMode::Fp8) v = e4m3_value(fp8_act_code(v, s)) * s;  // exact in BF16
      const int64_t col = b0 + i;
      out[kslot ? operand_kslot_column(col) : col] = __float2bfloat16_rn(v);
    }
  }
}

// |x| bits as an unsigned: order-preserving for non-negative floats, and NaN
// (0x7fc00000) above Inf, so atomicMax propagates NaN.
__global__ void abs_max_kernel(const void* x, bool bf16, int64_t n, unsigned* out) {
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = abs_max_nan(m, load_value(x, bf16, i));
  m = block_abs_max(m);
  if (threadIdx.x == 0) atomicMax(out, __float_as_uint(m) & 0x7fffffffu);
}

// Columns [cols, ld) of one dequantized operand row read as zero (the block's threads).
__device__ void zero_row_padding(__nv_bfloat16* deq_row, int64_t cols, int64_t ld) {
  for (int64_t i = cols + threadIdx.x; i < ld; i += blockDim.x) deq_row[i] = __float2bfloat16_rn(0.0f);
}

__global__ void quantize_act_ref_kernel(QuantizeActArgs a, int64_t kp) {
  const int64_t row = blockIdx.x;
  const int64_t kb = a.cols / kBlock;
  auto load = [&](int64_t i) { return load_value(a.x, a.x_is_bf16, row * a.cols + i); };
  if (a.mode != ActivationMode::Nvfp4) {
    if (threadIdx.x == 0) a.g_out[row] = 1.0f;
    stage_row_unquantized(load, a.mode, a.cols, a.deq + row * a.deq_ld, a.deq_order.kslot());
    zero_row_padding(a.deq + row * a.deq_ld, a.cols, a.deq_ld);
    return;
  }
  float g;
  if (a.scope == ActScope::PerRow) {
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) m = abs_max_nan(m, load(i));
    g = global_scale_from_amax(block_abs_max(m));
  } else if (a.scope == ActScope::PerTensor) {
    g = global_scale_from_amax(__uint_as_float(*a.amax_scratch));
  } else {
    g = a.static_g;
  }
  if (threadIdx.x == 0) a.g_out[row] = g;
  const bool kslot = a.deq_order.kslot();
  for (int64_t b = threadIdx.x; b < kb; b += blockDim.x)
    quantize_block16(load, row, b, a.cols, g, a.codes, a.scales_linear, a.scales_swizzled, kp, a.deq, a.deq_ld, kslot);
  if (a.deq)
    zero_row_padding(a.deq + row * a.deq_ld, a.cols, a.deq_ld);
}

__global__ void requantize_rows_ref_kernel(RequantRowsArgs a) {
  const int64_t row = blockIdx.x;
  if (row >= *a.num_rows) return;
  const float* h = a.h + row * a.ld_h;
  auto load = [&](int64_t i) { return h[i]; };
  if (a.mode != ActivationMode::Nvfp4) {
    if (threadIdx.x == 0) a.g_out[row] = 1.0f;
    stage_row_unquantized(load, a.mode, a.cols, a.deq + row * a.deq_ld, a.deq_order.kslot());
    zero_row_padding(a.deq + row * a.deq_ld, a.cols, a.deq_ld);
    return;
  }
  float g;
  if (a.static_g_per_expert) {
    g = a.static_g_per_expert[a.row_expert[row]];
  } else {
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < a.cols; i += blockDim.x) m = abs_max_nan(m, h[i]);
    g = global_scale_from_amax(block_abs_max(m));
  }
  if (threadIdx.x == 0) a.g_out[row] = g;
  const bool kslot = a.deq_order.kslot();
  for (int64_t b = threadIdx.x; b < a.cols / kBlock; b += blockDim.x)
    quantize_block16(load, row, b, a.cols, g, nullptr, nullptr, nullptr, 0, a.deq, a.deq_ld, kslot);
  zero_row_padding(a.deq + row * a.deq_ld, a.cols, a.deq_ld);
}

}  // namespace

void quantize_activations_ref(const QuantizeActArgs& a, cudaStream_t stream) {
  NVFP4_CHECK(a.cols % kBlock == 0, "quantize_activations_ref: K must be a multiple of 16, got K=", a.cols);
  NVFP4_CHECK(a.rows >= 0, "quantize_activations_ref: negative row count ", a.rows);
  NVFP4_CHECK(a.g_out != nullptr, "quantize_activations_ref: g_out is required");
  NVFP4_CHECK(!a.deq || a.deq_ld >= a.cols, "quantize_activations_ref: deq_ld ", a.deq_ld, " < K=", a.cols);
  NVFP4_CHECK(a.mode == ActivationMode::Nvfp4 || (a.deq && !a.codes && !a.scales_linear && !a.scales_swizzled),
              "quantize_activations_ref: activation mode ", activation_mode_name(a.mode),
              " writes the BF16 operand only (no NVFP4 codes or scales)");
  NVFP4_CHECK(a.scope != ActScope::PerTensor || a.amax_scratch || a.mode != ActivationMode::Nvfp4,
              "quantize_activations_ref: per-tensor scope needs amax scratch");
  NVFP4_CHECK(a.mode != ActivationMode::Nvfp4 || a.scope != ActScope::Static ||
                  (is_finite(a.static_g) && a.static_g > 0.0f),
              "quantize_activations_ref: static global scale must be finite and > 0, got ", a.static_g);
  if (a.rows == 0) return;
  const int64_t k = a.cols / kBlock, kp = round_up(k, 4);
  if (a.scales_swizzled)
    NVFP4_CUDA_CHECK(cudaMemsetAsync(a.scales_swizzled, 0, size_t(round_up(a.rows, 128) * kp), stream));
  if (a.scope == ActScope::PerTensor && a.mode == ActivationMode::Nvfp4) tensor_abs_max(a.x, a.x_is_bf16, a.rows * a.cols, a.amax_scratch, stream);
  quantize_act_ref_kernel<<<unsigned(a.rows), kThreads, 0, stream>>>(a, kp);
  NVFP4_CUDA_CHECK_LAUNCH("quantize_act_ref_kernel");
}

void tensor_abs_max(const void* x, bool x_is_bf16, int64_t n, unsigned* amax_bits, cudaStream_t stream) {
  NVFP4_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, sizeof(unsigned), stream));
  if (n == 0) return;
  const int blocks = int(std::min<int64_t>(1024, ceil_div(n, kThreads * 8)));
  abs_max_kernel<<<blocks, kThreads, 0, stream>>>(x, x_is_bf16, n, amax_bits);
  NVFP4_CUDA_CHECK_LAUNCH("abs_max_kernel");
}

void requantize_rows_ref(const RequantRowsArgs& a, cudaStream_t stream) {
  NVFP4_CHECK(a.cols % kBlock == 0 && a.deq_ld >= a.cols && a.ld_h >= a.cols,
              "requantize_rows_ref: bad geometry cols=", a.cols, " ld_h=", a.ld_h, " deq_ld=", a.deq_ld);
  if (a.rows_max == 0) return;
  requantize_rows_ref_kernel<<<unsigned(a.rows_max), kThreads, 0, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("requantize_rows_ref_kernel");
}

}  // namespace nvfp4moe::cuda
