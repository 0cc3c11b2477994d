// Activation staging on the GPU: rows of BF16/F32 values -> NVFP4 bytes
// (spec section 2), bit-identical to src/format/quantize.cpp.
//
// Besides the public bytes (packed codes, linear and/or swizzled scales) the
// kernel can write the GEMM's operand: value(q) * f32(s) as BF16 — exact, since
// that product has at most 6 significant bits (spec section 2) — in rows of
// `deq_ld` elements whose tail past `cols` is zero (the GEMM reads K in steps
// of 64). The global scale g of each row goes to `g_out[row]`: the GEMM
// applies it in FP32 in its epilogue.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/operand_order.hpp"

namespace nvfp4moe::cuda {

enum class ActScope : uint8_t {
  PerRow,     // g = amax(row) / 2688, one per row (the default for tokens)
  PerTensor,  // g from the amax of all rows, reduced on the device
  Static,     // g = static_g for every row
};

struct QuantizeActArgs {
  const void* x = nullptr;      // [rows, cols] row-major, dense
  bool x_is_bf16 = false;       // else f32
  int64_t rows = 0, cols = 0;   // cols a multiple of 16
  ActScope scope = ActScope::PerRow;
  float static_g = 1.0f;        // ActScope::Static
  unsigned* amax_scratch = nullptr;  // ActScope::PerTensor: one word of device scratch

  float* g_out = nullptr;               // [rows] required
  uint8_t* codes = nullptr;             // [rows, cols/2] or null
  uint8_t* scales_linear = nullptr;     // [rows, cols/16] or null
  uint8_t* scales_swizzled = nullptr;   // swizzled_scale_bytes(rows, cols/16) or null
  __nv_bfloat16* deq = nullptr;         // [rows, deq_ld] value(q)*s, or null
  int64_t deq_ld = 0;                   // >= cols
  OperandOrder deq_order;               // column order of deq (default logical)
};

// Queues the staging on `stream` (memsets included); no host synchronisation.
void quantize_activations(const QuantizeActArgs& args, cudaStream_t stream);

// The L2 input: rows of h [rows_max, ld_h] f32, of which the first
// *num_rows (device) are live. Dynamic per-row g, or a static g per expert
// (static_g_per_expert[row_expert[row]]) when static_g_per_expert is set.
struct RequantRowsArgs {
  const float* h = nullptr;
  int64_t ld_h = 0, cols = 0, rows_max = 0;
  const int32_t* num_rows = nullptr;          // device
  const float* static_g_per_expert = nullptr; // device [E_local] or null
  const int32_t* row_expert = nullptr;        // device [rows_max], with static g
  float* g_out = nullptr;                     // [rows_max]
  __nv_bfloat16* deq = nullptr;               // [rows_max, deq_ld]
  int64_t deq_ld = 0;
  OperandOrder deq_order;                     // column order of deq (default logical)
};
void requantize_rows(const RequantRowsArgs& args, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
