// fp8_operand_rows: the activation operand of the FP8 prefill GEMM
// (layout/fp8_operand.hpp) from the BF16 operand rows of the `fp8`
// activation mode: per row and 128 columns, the power-of-two scale
// fp8_operand_scale(max |x|) and each x / s as E4M3, exact, in the FP8
// k-slot order. Bit for bit fp8_operand_rows_ref. One warp per 128-column
// block (each lane's 4 columns land in 4 consecutive bytes); memory bound.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nvfp4moe::cuda {

struct Fp8OperandArgs {
  const __nv_bfloat16* in = nullptr;  // [rows_max, ld_in], logical column order
  int64_t ld_in = 0;
  int64_t rows_max = 0;
  const int32_t* live_rows = nullptr;  // device count of live rows (<= rows_max), or null: rows_max
  int64_t cols = 0;                    // a multiple of 128
  uint8_t* codes = nullptr;            // [rows_max, ld_codes], operand order
  int64_t ld_codes = 0;                // a multiple of 16, >= cols
  float* scales = nullptr;             // [rows_max, cols / 128]
  // With live_pairs set the kernel works only when *live_pairs > pairs_above
  // (the FP8 GEMM's range of the device-side choice, expert_gemm.hpp).
  const int32_t* live_pairs = nullptr;
  int32_t pairs_above = -1;
};

void fp8_operand_rows(const Fp8OperandArgs& a, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
