// sm90_nvfp4_stage kernels (see the header). Compiled WITHOUT fast-math, so
// x / d is an IEEE division as the spec's order of operations requires.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/sm90_nvfp4_stage.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe::cuda {

namespace {

using namespace nvfp4moe::fmt;

constexpr int kMaxBlocksPerRow = 512;  // one thread per 16-element block: K <= 8192 (larger K: quantize_activations)

// Both entry points reduced to one description of the rows to stage.
struct StageRows {
  const void* x = nullptr;
  bool x_bf16 = false;
  int64_t ld_x = 0, cols = 0;
  const int32_t* num_rows = nullptr;  // device, or null: every row of the grid
  bool per_row = true;                // else static_g (or static_g_per_expert[row_expert[row]])
  float static_g = 1.0f;
  const float* static_g_per_expert = nullptr;
  const int32_t* row_expert = nullptr;
  float* g_out = nullptr;
  uint8_t* codes = nullptr;
  uint8_t* scales_linear = nullptr;
  uint8_t* scales_swizzled = nullptr;
  int64_t kp = 0;
  __nv_bfloat16* deq = nullptr;
  int64_t deq_ld = 0;
  OperandOrder deq_order;
};

__device__ __forceinline__ void bf16x8_to_float(const uint4& u, float* v) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// A thread's 16 input values as loaded: 32 bytes (BF16) or 64 bytes (FP32).
template <bool kBf16>
struct RawBlock {
  uint4 u[kBf16 ? 2 : 4];
};

template <bool kBf16>
__device__ __forceinline__ void load_block(const StageRows& a, int64_t row, int b, RawBlock<kBf16>& r) {
  if constexpr (kBf16) {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.x) + row * a.ld_x + b * kBlock);
    r.u[0] = __ldcs(p);  // read once
    r.u[1] = __ldcs(p + 1);
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(static_cast<const float*>(a.x) + row * a.ld_x + b * kBlock);
#pragma unroll
    for (int i = 0; i < 4; ++i) r.u[i] = __ldcs(p + i);
  }
}

template <bool kBf16>
__device__ __forceinline__ void unpack_block(const RawBlock<kBf16>& r, float (&v)[kBlock]) {
  if constexpr (kBf16) {
    bf16x8_to_float(r.u[0], v);
    bf16x8_to_float(r.u[1], v + 8);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[4 * i] = __uint_as_float(r.u[i].x);
      v[4 * i + 1] = __uint_as_float(r.u[i].y);
      v[4 * i + 2] = __uint_as_float(r.u[i].z);
      v[4 * i + 3] = __uint_as_float(r.u[i].w);
    }
  }
}

// Word w (a BF16 column pair) of 64-column chunk c sits in the shared row at
// c * 32 + (w ^ 4 * (c % 8)): the 4 threads of a chunk write the words
// 4 j + t of their step j, so without the XOR the 8 chunks of a warp would
// hit the same 4 banks; the XOR keeps each group of 4 words (one 16-byte
// store unit) together.
__device__ __forceinline__ int kslot_smem_word(int col_pair) {
  const uint32_t c = uint32_t(col_pair) / 32, w = uint32_t(col_pair) % 32;
  return int(c * 32 + (w ^ (4 * (c % 8))));
}

// Persistent: CTA c stages rows c, c + grid, ... with one thread per 16-value
// block; the next row's loads are issued before the current row is
// quantized, so a CTA always has a row in flight (one row per CTA lifetime
// was latency bound: load, reduce, barrier, quantize, store in series).
// Shared state is double-buffered by row parity: two barriers per row.
template <bool kBf16>
__global__ void __launch_bounds__(kMaxBlocksPerRow, 2) stage_rows_kernel(const __grid_constant__ StageRows a,
                                                                       int64_t rows_max) {
  __shared__ float warp_amax[2][kMaxBlocksPerRow / 32];
  extern __shared__ uint32_t kslot_rows[];  // two rows of BF16 pairs in k-slot order (k-slot staging only)
  const int64_t rows = a.num_rows ? (int64_t(*a.num_rows) < rows_max ? int64_t(*a.num_rows) : rows_max) : rows_max;
  const int kb = int(a.cols / kBlock), b = int(threadIdx.x), lane = b % 32, warp = b / 32;
  const bool live = b < kb;
  const bool kslot = a.deq && a.deq_order.kslot();

  RawBlock<kBf16> next;
  if (live && int64_t(blockIdx.x) < rows) load_block(a, blockIdx.x, b, next);
  for (int64_t row = blockIdx.x, it = 0; row < rows; row += gridDim.x, ++it) {
    const int buf = int(it & 1);
    float v[kBlock];
    float amax = 0.0f;
    if (live) {
      unpack_block(next, v);
      if (row + gridDim.x < rows) load_block(a, row + gridDim.x, b, next);
#pragma unroll
      for (int i = 0; i < kBlock; ++i) amax = abs_max_nan(amax, v[i]);
    }

    // Row amax (NaN-propagating) -> the row's global scale.
    float m = amax;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = abs_max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) warp_amax[buf][warp] = m;
    __syncthreads();
    float g;
    if (a.per_row) {
      float r = 0.0f;
      for (int w = 0; w < int(blockDim.x / 32); ++w) r = abs_max_nan(r, warp_amax[buf][w]);
      g = global_scale_from_amax(r);
    } else {
      g = a.static_g_per_expert ? a.static_g_per_expert[a.row_expert[row]] : a.static_g;
    }
    if (b == 0) a.g_out[row] = g;

    uint32_t* kslot_row = kslot_rows + buf * (a.cols / 2);
    if (live) {
      // Spec section 2, in order: s = e4m3((amax_b / 6) / g), d = f32(s) * g, q = e2m1(x / d)
      // (quantize_block_codes: the same bytes without a division per element).
      const uint8_t s = block_scale_byte(amax, g);
      const float d = block_dequant_factor(s, g);
      const float sv = e4m3_value(s);
      uint32_t o[8];  // the QDQ values value(q) * f32(s) as BF16 pairs: exact (spec section 2)
      if (a.codes) {
        uint32_t w[2];
        quantize_block_codes(v, amax, d, w);
        *reinterpret_cast<uint2*>(a.codes + row * (a.cols / 2) + b * 8) = make_uint2(w[0], w[1]);
#pragma unroll
        for (int i = 0; i < kBlock; i += 2) {
          const uint32_t q = w[i / 8] >> (4 * (i % 8));  // codes i (low nibble) and i + 1
          const __nv_bfloat162 pair =
              __floats2bfloat162_rn(e2m1_value(uint8_t(q)) * sv, e2m1_value(uint8_t(q >> 4)) * sv);
          o[i / 2] = *reinterpret_cast<const uint32_t*>(&pair);
        }
      } else if (a.deq) {  // the GEMM operand only (the routed path): no codes formed
        float val[kBlock];
        quantize_block_values(v, amax, d, sv, val);
#pragma unroll
        for (int i = 0; i < kBlock; i += 2) {
          const __nv_bfloat162 pair = __floats2bfloat162_rn(val[i], val[i + 1]);
          o[i / 2] = *reinterpret_cast<const uint32_t*>(&pair);
        }
      }
      if (a.scales_linear) a.scales_linear[row * kb + b] = s;
      if (a.scales_swizzled)
        a.scales_swizzled[swizzled_offset(row, b, a.kp)] = s;
      if (a.deq) {
        if (kslot) {  // the block's 8 column pairs, 4 pairs apart in its chunk's k-slot order
#pragma unroll
          for (int j = 0; j < 8; ++j)
            kslot_row[kslot_smem_word(int(operand_kslot_column(uint32_t(b * kBlock + 2 * j)) / 2))] = o[j];
        } else {
          uint4* dst = reinterpret_cast<uint4*>(a.deq + row * a.deq_ld + b * kBlock);
          dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
          dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
        }
      }
    }
    if (kslot) {  // the shared row out in 16-byte units (4 pairs of one k-slot step)
      __syncthreads();
      uint4* dst = reinterpret_cast<uint4*>(a.deq + row * a.deq_ld);
      for (int u = b; u < int(a.cols / 8); u += int(blockDim.x))
        dst[u] = *reinterpret_cast<const uint4*>(&kslot_row[kslot_smem_word(4 * u)]);
    }
    if (a.deq)
      for (int64_t i = a.cols + b; i < a.deq_ld; i += blockDim.x) a.deq[row * a.deq_ld + i] = __float2bfloat16_rn(0.0f);
  }
}


void launch(const StageRows& s, int64_t rows, cudaStream_t stream) {
  const int kb = int(s.cols / kBlock);
  const int threads = int(round_up(kb, 32));
  // k-slot order goes through shared memory (the order is decided on the
  // device, so the bytes are reserved whenever the order may be k-slot).
  const bool may_kslot = s.deq && s.deq_order.may_be_kslot();
  NVFP4_CHECK(!may_kslot || s.cols % kMmaChunkK == 0, "sm90_nvfp4_stage: k-slot order needs K a multiple of ",
              kMmaChunkK, ", got K=", s.cols);
  const size_t smem = may_kslot ? size_t(s.cols) * 2 * 2 : 0;  // two rows of BF16
  auto kernel = s.x_bf16 ? stage_rows_kernel<true> : stage_rows_kernel<false>;
  const int64_t grid = std::max<int64_t>(1, std::min(rows, resident_ctas(kernel, threads, smem)));
  kernel<<<unsigned(grid), unsigned(threads), smem, stream>>>(s, rows);
  NVFP4_CUDA_CHECK_LAUNCH("stage_rows_kernel");
}

}  // namespace

bool sm90_nvfp4_stage_supports(const QuantizeActArgs& a) {
  const int elem = a.x_is_bf16 ? 2 : 4;
  return a.cols > 0 && a.cols % kBlock == 0 && a.cols / kBlock <= kMaxBlocksPerRow && a.scope != ActScope::PerTensor &&
         aligned_to(a.x, 16) && (a.cols * elem) % 16 == 0 && (!a.deq || (aligned_to(a.deq, 16) && a.deq_ld % 8 == 0)) &&
         (reinterpret_cast<uintptr_t>(a.codes) & 7u) == 0;
}

void sm90_nvfp4_stage(const QuantizeActArgs& a, cudaStream_t stream) {
  NVFP4_CHECK(sm90_nvfp4_stage_supports(a), "sm90_nvfp4_stage: unsupported staging (K=", a.cols,
              ", scope per-tensor or unaligned rows); use quantize_activations");
  NVFP4_CHECK(a.g_out != nullptr, "sm90_nvfp4_stage: g_out is required");
  NVFP4_CHECK(!a.deq || a.deq_ld >= a.cols, "sm90_nvfp4_stage: deq_ld ", a.deq_ld, " < K=", a.cols);
  NVFP4_CHECK(a.scope != ActScope::Static || (is_finite(a.static_g) && a.static_g > 0.0f),
              "sm90_nvfp4_stage: static global scale must be finite and > 0, got ", a.static_g);
  if (a.rows == 0) return;
  StageRows s;
  s.x = a.x;
  s.x_bf16 = a.x_is_bf16;
  s.ld_x = a.cols;
  s.cols = a.cols;
  s.per_row = a.scope == ActScope::PerRow;
  s.static_g = a.static_g;
  s.g_out = a.g_out;
  s.codes = a.codes;
  s.scales_linear = a.scales_linear;
  s.scales_swizzled = a.scales_swizzled;
  s.kp = round_up(a.cols / kBlock, 4);
  s.deq = a.deq;
  s.deq_ld = a.deq_ld;
  s.deq_order = a.deq_order;
  if (a.scales_swizzled)
    NVFP4_CUDA_CHECK(cudaMemsetAsync(a.scales_swizzled, 0, size_t(round_up(a.rows, 128) * s.kp), stream));
  launch(s, a.rows, stream);
}

bool sm90_nvfp4_requant_supports(const RequantRowsArgs& a) {
  return a.cols > 0 && a.cols % kBlock == 0 && a.cols / kBlock <= kMaxBlocksPerRow && aligned_to(a.h, 16) &&
         a.ld_h % 4 == 0 && aligned_to(a.deq, 16) && a.deq_ld % 8 == 0;
}

void sm90_nvfp4_requant(const RequantRowsArgs& a, cudaStream_t stream) {
  NVFP4_CHECK(sm90_nvfp4_requant_supports(a), "sm90_nvfp4_requant: unsupported geometry cols=", a.cols, " ld_h=",
              a.ld_h, " deq_ld=", a.deq_ld, " (or unaligned rows); use requantize_rows");
  NVFP4_CHECK(a.deq_ld >= a.cols && a.ld_h >= a.cols, "sm90_nvfp4_requant: bad geometry cols=", a.cols, " ld_h=",
              a.ld_h, " deq_ld=", a.deq_ld);
  if (a.rows_max == 0) return;
  StageRows s;
  s.x = a.h;
  s.ld_x = a.ld_h;
  s.cols = a.cols;
  s.num_rows = a.num_rows;
  s.per_row = a.static_g_per_expert == nullptr;
  s.static_g_per_expert = a.static_g_per_expert;
  s.row_expert = a.row_expert;
  s.g_out = a.g_out;
  s.deq = a.deq;
  s.deq_ld = a.deq_ld;
  s.deq_order = a.deq_order;
  launch(s, a.rows_max, stream);
}

void stage_activations(const QuantizeActArgs& a, cudaStream_t stream) {
  if (sm90_nvfp4_stage_supports(a)) {
    sm90_nvfp4_stage(a, stream);
  } else {
    quantize_activations(a, stream);
  }
}

void stage_requantized_rows(const RequantRowsArgs& a, cudaStream_t stream) {
  if (sm90_nvfp4_requant_supports(a)) {
    sm90_nvfp4_requant(a, stream);
  } else {
    requantize_rows(a, stream);
  }
}

}  // namespace nvfp4moe::cuda
