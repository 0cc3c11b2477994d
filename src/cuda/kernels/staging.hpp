// Activation staging on the GPU: rows of BF16/F32 values -> NVFP4 bytes
// (docs/numerics.md §2), bit-identical to src/format/quantize.cpp.
//
// Besides the public bytes (packed codes, linear and/or swizzled scales) the
// kernel can write the GEMM's operand: value(q) * f32(s) as BF16 — exact, since
// that product has at most 6 significant bits (docs/numerics.md §2) — in rows of
// `deq_ld` elements whose tail past `cols` is zero (the GEMM reads K in steps
// of 64). The global scale g of each row goes to `g_out[row]`: the GEMM
// applies it in FP32 in its epilogue.
//
// sm90_nvfp4_stage is the fast path of activation staging — the same
// contract and the same bytes as quantize_activations_ref /
// requantize_rows_ref (kernels/ref/staging_ref.hpp), built for bandwidth and
// for one-token latency. Two kernels, chosen on the host by what is asked for:
//   * the operand path (only the BF16 operand and g: the routed path's
//     staging and every requantization; BF16 or FP32 input, logical or
//     k-slot order): persistent CTAs, one row at a time each; a row arrives
//     in shared memory by one bulk copy (cp.async.bulk on an mbarrier),
//     issued one row ahead into a two-stage ring; thread i owns blocks i,
//     i + blockDim, ...: block maxima, one CTA barrier for the row maximum,
//     then each block quantized from shared memory and stored as 16-byte
//     units (k-slot rows regrouped in place by the 4 lanes of a chunk, with
//     __syncwarp only). 128-thread CTAs (7-8 per SM) when the rows outnumber
//     the SMs, else one thread per block (a single row's latency);
//   * the codes path (packed codes and/or linear / swizzled scales asked
//     for): one thread per 16-element block keeping its values in registers,
//     the next row's loads in flight while the current one is quantized,
//     two CTA barriers per row.
// Every byte comes from src/format/nvfp4_codec.hpp in docs/numerics.md §2's
// order of operations (tests compare with the CPU quantizer and the simple
// kernels); max is order-free and NaN propagates as in the codecs.
//
// The other activation modes of the routed experts (docs/numerics.md §7),
// `mode` below, write the operand only (no codes or scales may be asked
// for) and g = 1 for every row:
//   * Bf16: each value rounded to BF16 (nearest even);
//   * Fp8: rounded to BF16, then DeepSeek's act_quant per 128 consecutive
//     columns (the last block of a row shorter when K % 128 != 0):
//     s = fp8_act_block_scale(amax), the operand e4m3(q) * s, exact in BF16
//     (at most 4 significant bits times a power of two). Bit for bit the
//     values of the CPU backend's stage_activation_rows.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/layout/operand_order.hpp"
#include "nvfp4moe/moe.hpp"

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
  ActivationMode mode = ActivationMode::Nvfp4;  // Bf16 / Fp8: deq and g_out only; scope ignored
  // The kernel after this one is launched to overlap it (programmatic
  // dependent launch): its SMs keep the largest L1 (dependent_launch.hpp).
  bool next_overlaps = false;
};


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
  ActivationMode mode = ActivationMode::Nvfp4;  // Bf16 / Fp8: static g ignored, g = 1
};

// Rows up to 16 * 1024 columns, PerRow or Static scope, 16-byte aligned rows.
bool sm90_nvfp4_stage_supports(const QuantizeActArgs& a);
void sm90_nvfp4_stage(const QuantizeActArgs& a, cudaStream_t stream);

bool sm90_nvfp4_requant_supports(const RequantRowsArgs& a);
void sm90_nvfp4_requant(const RequantRowsArgs& a, cudaStream_t stream);

// What callers that only want the bytes use: the fast kernel where it
// applies, else quantize_activations_ref / requantize_rows_ref (the same bytes).
void stage_activations(const QuantizeActArgs& a, cudaStream_t stream);

// max |x| of n values (bf16 or f32) as FP32 bits into *amax_bits (device):
// NaN wins over every number (the per-tensor scope's amax).
void tensor_abs_max(const void* x, bool x_is_bf16, int64_t n, unsigned* amax_bits, cudaStream_t stream);
void stage_requantized_rows(const RequantRowsArgs& a, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
