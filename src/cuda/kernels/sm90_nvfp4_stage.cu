// sm90_nvfp4_stage kernels (see the header). Compiled WITHOUT fast-math, so
// the divisions of the fallbacks are IEEE divisions, as docs/numerics.md §2's
// order of operations requires.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/dependent_launch.hpp"
#include "cuda/kernels/block_scale.cuh"
#include "cuda/kernels/ref/staging_ref.hpp"
#include "cuda/kernels/staging.hpp"
#include "cuda/ptx/sm90_griddep.cuh"
#include "cuda/ptx/sm90_mbarrier.cuh"
#include "cuda/ptx/sm90_tma.cuh"
#include "cuda/ptx/sm90_wgmma.cuh"  // fence_proxy_async_shared
#include "format/mxfp4_codec.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe::cuda {

namespace {

using namespace nvfp4moe::fmt;

constexpr int kMaxBlocksPerRow = 512;  // one thread per 16-element block: K <= 8192 (larger K: quantize_activations_ref)

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
  ActivationMode mode = ActivationMode::Nvfp4;  // Bf16 / Fp8: the operand path only, g = 1
  // Launched to overlap the previous kernel (programmatic dependent launch):
  // both kernels wait for it before they read or write anything.
  bool overlap_previous = false;
  bool next_overlaps = false;  // the next kernel is launched to overlap this one (LaunchOverlap::ahead_of_overlap)
};

// The rows a launch stages: *num_rows (the live rows, on the device) capped
// by rows_max, or rows_max.
__device__ __forceinline__ int64_t live_rows(const StageRows& a, int64_t rows_max) {
  return a.num_rows ? (int64_t(*a.num_rows) < rows_max ? int64_t(*a.num_rows) : rows_max) : rows_max;
}

// g of a row without a per-row scale: its expert's static g, or the one static g.
__device__ __forceinline__ float static_row_g(const StageRows& a, int64_t row) {
  return a.static_g_per_expert ? a.static_g_per_expert[a.row_expert[row]] : a.static_g;
}

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
// Shared state is double-buffered by row parity: two barriers per row. One
// function (~90 lines) on purpose: the next row's loads live in registers
// across the current row's quantization, which is the kernel's pipeline.
template <bool kBf16>
__global__ void __launch_bounds__(kMaxBlocksPerRow, 2) stage_rows_kernel(const __grid_constant__ StageRows a,
                                                                       int64_t rows_max) {
  __shared__ float warp_amax[2][kMaxBlocksPerRow / 32];
  extern __shared__ uint32_t kslot_rows[];  // two rows of BF16 pairs in k-slot order (k-slot staging only)
  ptx::griddep_launch_dependents();  // the next kernel may start on the SMs this grid leaves
  ptx::griddep_wait();
  const int64_t rows = live_rows(a, rows_max);
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
      g = static_row_g(a, row);
    }
    if (b == 0) a.g_out[row] = g;
    const BlockScaleDivisor div = block_scale_divisor(g);

    uint32_t* kslot_row = kslot_rows + buf * (a.cols / 2);
    if (live) {
      // docs/numerics.md §2, in order: s = e4m3(clamp(amax_b / f32(6 g))), d = f32(s) * g, q = e2m1(x / d)
      // (block_scale and quantize_block_codes: the same bytes without a division per element).
      const BlockScale bs = block_scale(amax, div);
      const uint8_t s = bs.byte;
      const float sv = bs.value, d = bs.d;
      uint32_t o[8];  // the QDQ values value(q) * f32(s) as BF16 pairs: exact (docs/numerics.md §2)
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

// ---- The operand path (BF16 operand rows and g only: the routed path) ----

constexpr int kStages = 2;               // row buffers of a CTA: the row being quantized, the next one landing
// Most threads of a CTA when rows outnumber the SMs: 7-8 CTAs of 4 warps per
// SM at K=7168 (smem bound), a few rows in flight each. 256 and 448 (one
// block a thread) were slower (EP8 T=8192: 88 us at 128 threads, 97 at 256, 113 at 448).
constexpr int kOperandThreads = 128;

// The 16 values of block b of a row held in shared memory as loaded.
template <bool kBf16>
__device__ __forceinline__ void load_block_shared(const uint8_t* row, int b, float (&v)[kBlock]) {
  const uint4* p = reinterpret_cast<const uint4*>(row + size_t(b) * kBlock * (kBf16 ? 2 : 4));
  RawBlock<kBf16> r;
#pragma unroll
  for (int i = 0; i < (kBf16 ? 2 : 4); ++i) r.u[i] = p[i];
  unpack_block(r, v);
}

// max |x| of block b of a shared row (NaN-propagating, as abs_max_nan). BF16
// rows take it on packed pairs — one mask and one max.NaN.bf16x2 per two
// values instead of two unpacks and two FP32 maxima; the maximum of BF16
// values is a BF16 value, so widening it afterwards is exact. On the same
// pairs, BF16 rows also tell whether a value is outside quotient_rn's domain
// (`outside`; FP32 rows leave it false and check each value when quantizing).
template <bool kBf16>
__device__ __forceinline__ float block_abs_max_shared(const uint8_t* row, int b, bool& outside) {
  outside = false;
  if constexpr (kBf16) {
    const uint4* p = reinterpret_cast<const uint4*>(row + size_t(b) * kBlock * 2);
    const uint4 u[2] = {p[0], p[1]};
    __nv_bfloat162 m = __floats2bfloat162_rn(0.0f, 0.0f);
    uint32_t out_of_domain = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint32_t w[4] = {u[i].x, u[i].y, u[i].z, u[i].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t a = w[j] & 0x7fff7fffu;
        m = __hmax2_nan(m, *reinterpret_cast<const __nv_bfloat162*>(&a));
        out_of_domain |= bf16x2_outside_quotient_domain(a);
      }
    }
    outside = out_of_domain != 0;
    return abs_max_nan(__low2float(m), __high2float(m));
  } else {
    float v[kBlock];
    load_block_shared<false>(row, b, v);
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kBlock; ++j) amax = abs_max_nan(amax, v[j]);
    return amax;
  }
}

// A block of 16 values in the Bf16 or Fp8 mode (staging.hpp) -> its BF16
// operand pairs. Fp8: the 128-column block's amax is the maximum over the 8
// lanes that hold its 16-column blocks (consecutive blocks of consecutive
// lanes, 8-aligned; every lane of the warp calls this, dead lanes with
// amax 0); rounding to BF16 is monotone, so the amax of the rounded values
// is the rounded amax.
__device__ __forceinline__ void unquantized_block_bf16(ActivationMode mode, const float (&v)[kBlock], float amax,
                                                       uint32_t (&o)[8]) {
  float s = 1.0f, inv = 1.0f;
  if (mode == ActivationMode::Fp8) {
    float m = __bfloat162float(__float2bfloat16_rn(amax));
#pragma unroll
    for (int x = 1; x < kFp8ActBlock / kBlock; x <<= 1) m = abs_max_nan(m, __shfl_xor_sync(0xffffffffu, m, x));
    s = fp8_act_block_scale(m);
    inv = fp8_act_inverse_scale(s);
  }
#pragma unroll
  for (int i = 0; i < kBlock; i += 2) {
    float a = __bfloat162float(__float2bfloat16_rn(v[i])), b = __bfloat162float(__float2bfloat16_rn(v[i + 1]));
    if (mode == ActivationMode::Fp8) {
      a = e4m3_value(fp8_act_code_by_inverse(a, inv)) * s;  // exact in BF16
      b = e4m3_value(fp8_act_code_by_inverse(b, inv)) * s;
    }
    const __nv_bfloat162 pair = __floats2bfloat162_rn(a, b);
    o[i / 2] = *reinterpret_cast<const uint32_t*>(&pair);
  }
}

// Where 16-byte unit u (0..7) of 64-column chunk c goes while a chunk's
// operand words are regrouped in shared memory: 4 * (u ^ swizzle(c % 8)).
// NOTES: the 8 chunks of a warp store word t of unit u at once (8 distinct
// units per u: conflict-free), and a quarter warp (chunks 2q, 2q + 1) reads
// units t and t + 4 back, which land in the two halves {q ^ 0..3} and
// {4 + q ^ 0..3} of the chunk's 8 units: conflict-free too.
__device__ __forceinline__ int kslot_unit_swizzle(int chunk) { return ((chunk >> 1) & 3) | ((chunk & 1) << 2); }

// Persistent: CTA c stages rows c, c + grid, ... one at a time. Each row
// arrives in shared memory by one bulk copy, issued one row ahead into the
// other stage, so a CTA's loads cost it no registers and no issue slots.
// Thread i owns blocks i, i + blockDim, ...: their maxima (kept in shared
// memory for the same thread), then, after the CTA's one barrier per row
// (the row's maximum), their quantization from the shared row again. Many
// CTAs of different rows share an SM (128 threads: 7 per SM at K=7168; 96 at
// K=3072 FP32, 2 blocks each), so one CTA's barrier leaves the SM other
// work. k-slot rows are regrouped in place: the 4 blocks of a chunk belong to
// 4 lanes of one warp, which write their BF16 pairs over the chunk's input
// and read back whole 16-byte units (__syncwarp only). The body (~100
// lines) reads top to bottom as that pipeline: setup, then per row wait,
// maxima, barrier, quantize and store, issue the next copy.
template <bool kBf16>
__global__ void __launch_bounds__(kMaxBlocksPerRow, 2)
    stage_operand_rows_kernel(const __grid_constant__ StageRows a, int64_t rows_max) {
  static_assert(kMmaChunkK == 4 * kBlock, "a k-slot chunk is the 4 blocks of 4 neighbouring lanes");
  constexpr int kElem = kBf16 ? 2 : 4;

  // Shared memory: kStages input rows (dynamic), one barrier per stage, the warp maxima of a row per stage.
  extern __shared__ __align__(128) uint8_t stage_rows[];
  __shared__ uint64_t full_[kStages];
  __shared__ float warp_amax[kStages][kMaxBlocksPerRow / 32];
  __shared__ float block_amax[kMaxBlocksPerRow];  // a thread's own blocks: written in step 1, read in step 2
  __shared__ bool block_outside[kMaxBlocksPerRow];  // and whether one of its values is outside quotient_rn's domain
  ptx::griddep_launch_dependents();  // the next kernel may start on the SMs this grid leaves
  ptx::griddep_wait();

  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32, kb = int(a.cols / kBlock);
  const uint32_t row_bytes = uint32_t(a.cols) * kElem;
  const int64_t rows = live_rows(a, rows_max);
  const bool kslot = a.deq_order.kslot();

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(ptx::smem_addr(&full_[s]), 1);
    ptx::fence_mbarrier_init();
  }
  __syncthreads();

  // Thread 0: the CTA's it-th row into stage it % kStages.
  auto load_row = [&](uint32_t it) {
    const int64_t row = blockIdx.x + int64_t(it) * gridDim.x;
    if (row >= rows) return;
    const uint32_t bar = ptx::smem_addr(&full_[it % kStages]);
    ptx::mbarrier_arrive_expect_tx(bar, row_bytes);
    ptx::cp_async_bulk_shared_global(ptx::smem_addr(stage_rows + (it % kStages) * row_bytes),
                                     static_cast<const uint8_t*>(a.x) + row * a.ld_x * kElem, row_bytes, bar);
  };
  if (tid == 0)
    for (uint32_t it = 0; it + 1 < kStages; ++it) load_row(it);

  uint32_t it = 0;  // the CTA's rows so far
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x, ++it) {
    const uint32_t s = it % kStages;
    uint8_t* in = stage_rows + s * row_bytes;
    float g = a.per_row ? 0.0f : static_row_g(a, row);  // per row: set from the row's maximum below
    ptx::mbarrier_wait_parity(ptx::smem_addr(&full_[s]), (it / kStages) & 1u);

    // 1. The maxima of this thread's blocks and of the row (NaN-propagating).
    float m = 0.0f;
    for (int b = tid; b < kb; b += int(blockDim.x)) {
      bool outside;
      const float amax = block_abs_max_shared<kBf16>(in, b, outside);
      block_amax[b] = amax;
      block_outside[b] = outside;
      m = abs_max_nan(m, amax);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = abs_max_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) warp_amax[s][warp] = m;
    __syncthreads();  // the row's maxima are in, and every thread is done with the CTA's previous row
    if (tid == 0) load_row(it + kStages - 1);  // into the stage that row used
    const bool nvfp4 = a.mode == ActivationMode::Nvfp4;
    if (!nvfp4) {
      g = 1.0f;
    } else if (a.per_row) {
      float r = 0.0f;
      for (int w = 0; w < int(blockDim.x / 32); ++w) r = abs_max_nan(r, warp_amax[s][w]);
      g = global_scale_from_amax(r);
    }
    if (tid == 0) a.g_out[row] = g;
    const BlockScaleDivisor div = block_scale_divisor(g);

    // 2. Each block: docs/numerics.md §2 in order (s_b, d_b, then the QDQ values), as BF16 pairs.
    __nv_bfloat16* out = a.deq + row * a.deq_ld;
    for (int b0 = 0; b0 < kb; b0 += int(blockDim.x)) {  // the same trips for the whole CTA (__syncwarp below)
      const int b = b0 + tid;
      const bool live = b < kb;
      uint32_t o[8];
      if (nvfp4) {
        if (live) {
          float v[kBlock];
          load_block_shared<kBf16>(in, b, v);
          const bool in_domain = kBf16 ? !block_outside[b] : block_in_quotient_domain(v);
          qdq_block_bf16(v, in_domain, block_amax[b], div, o);
        }
      } else {  // every lane: the Fp8 amax is a warp shuffle
        float v[kBlock] = {};
        if (live) load_block_shared<kBf16>(in, b, v);
        unquantized_block_bf16(a.mode, v, live ? block_amax[b] : 0.0f, o);
      }
      if (!kslot) {
        if (live) {
          uint4* dst = reinterpret_cast<uint4*>(out + b * kBlock);
          dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
          dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
        }
        continue;
      }
      // k-slot order: pair j of block t (= b % 4) is word t of the chunk's unit j.
      const int c = b / 4, t = b % 4, sw = kslot_unit_swizzle(c % 8);
      uint32_t* chunk = reinterpret_cast<uint32_t*>(in + size_t(c) * kMmaChunkK * kElem);
      __syncwarp();  // the chunk's 4 lanes have read their blocks
      if (live) {
#pragma unroll
        for (int j = 0; j < 8; ++j) chunk[4 * (j ^ sw) + t] = o[j];
      }
      __syncwarp();
      if (live) {
        uint4* dst = reinterpret_cast<uint4*>(out + c * kMmaChunkK);
        dst[t] = *reinterpret_cast<const uint4*>(chunk + 4 * (t ^ sw));
        dst[t + 4] = *reinterpret_cast<const uint4*>(chunk + 4 * ((t + 4) ^ sw));
      }
    }
    // The stage's next bulk copy follows the CTA barrier of the next row; k-slot rows wrote it.
    if (kslot) ptx::fence_proxy_async_shared();

    // 3. The operand row's zero tail.
    for (int64_t col = a.cols + 8 * tid; col < a.deq_ld; col += 8 * int64_t(blockDim.x))
      *reinterpret_cast<uint4*>(out + col) = make_uint4(0, 0, 0, 0);
  }
}

// The operand path: one thread per block when the rows are no more than the
// SMs (a row's latency), else at most kOperandThreads (many rows per SM),
// as few as give every thread the same number of blocks.
void launch_operand_rows(const StageRows& s, int64_t rows, cudaStream_t stream) {
  const int kb = int(s.cols / kBlock);
  const int threads =
      int(round_up(rows <= sm_count() ? kb : ceil_div(kb, ceil_div(kb, kOperandThreads)), 32));  // equal trips
  const size_t smem = size_t(kStages) * size_t(s.cols) * (s.x_bf16 ? 2 : 4);
  auto kernel = s.x_bf16 ? stage_operand_rows_kernel<true> : stage_operand_rows_kernel<false>;
  allow_smem_at_least(kernel, smem);
  const int64_t grid = std::max<int64_t>(1, std::min(rows, resident_ctas(kernel, threads, smem)));
  launch_dependent(kernel, dim3(unsigned(grid)), dim3(unsigned(threads)), smem, stream,
                   LaunchOverlap::ahead_of_overlap(s.overlap_previous, s.next_overlaps, grid), s, rows);
}

void launch(const StageRows& s, int64_t rows, cudaStream_t stream) {
  const int kb = int(s.cols / kBlock);
  // k-slot order regroups whole 64-column chunks (the order is decided on the
  // device, so this holds whenever the order may be k-slot).
  const bool may_kslot = s.deq && s.deq_order.may_be_kslot();
  NVFP4_CHECK(!may_kslot || s.cols % kMmaChunkK == 0, "sm90_nvfp4_stage: k-slot order needs K a multiple of ",
              kMmaChunkK, ", got K=", s.cols);
  const bool operand_only = s.deq && !s.codes && !s.scales_linear && !s.scales_swizzled;
  NVFP4_CHECK(operand_only || s.mode == ActivationMode::Nvfp4, "sm90_nvfp4_stage: activation mode ",
              activation_mode_name(s.mode), " writes the BF16 operand only (no NVFP4 codes or scales)");
  if (operand_only) return launch_operand_rows(s, rows, stream);
  const int threads = int(round_up(kb, 32));
  const size_t smem = may_kslot ? size_t(s.cols) * 2 * 2 : 0;  // two rows of BF16 (k-slot regrouping)
  auto kernel = s.x_bf16 ? stage_rows_kernel<true> : stage_rows_kernel<false>;
  const int64_t grid = std::max<int64_t>(1, std::min(rows, resident_ctas(kernel, threads, smem)));
  launch_dependent(kernel, dim3(unsigned(grid)), dim3(unsigned(threads)), smem, stream,
                   LaunchOverlap::ahead_of_overlap(s.overlap_previous, s.next_overlaps, grid), s, rows);
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
              ", scope per-tensor or unaligned rows); use quantize_activations_ref");
  NVFP4_CHECK(a.g_out != nullptr, "sm90_nvfp4_stage: g_out is required");
  NVFP4_CHECK(!a.deq || a.deq_ld >= a.cols, "sm90_nvfp4_stage: deq_ld ", a.deq_ld, " < K=", a.cols);
  NVFP4_CHECK(a.mode != ActivationMode::Nvfp4 || a.scope != ActScope::Static ||
                  (is_finite(a.static_g) && a.static_g > 0.0f),
              "sm90_nvfp4_stage: static global scale must be finite and > 0, got ", a.static_g);
  if (a.rows == 0) return;
  StageRows s;
  s.next_overlaps = a.next_overlaps;
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
  s.mode = a.mode;
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
              a.ld_h, " deq_ld=", a.deq_ld, " (or unaligned rows); use requantize_rows_ref");
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
  s.mode = a.mode;
  s.overlap_previous = true;  // its launch overlaps the gate/up GEMM's last CTAs; it waits before any access
  launch(s, a.rows_max, stream);
}

void stage_activations(const QuantizeActArgs& a, cudaStream_t stream) {
  if (sm90_nvfp4_stage_supports(a)) {
    sm90_nvfp4_stage(a, stream);
  } else {
    quantize_activations_ref(a, stream);
  }
}

void stage_requantized_rows(const RequantRowsArgs& a, cudaStream_t stream) {
  if (sm90_nvfp4_requant_supports(a)) {
    sm90_nvfp4_requant(a, stream);
  } else {
    requantize_rows_ref(a, stream);
  }
}

}  // namespace nvfp4moe::cuda
