// expand_nvfp4_rows: NVFP4 rows that are already quantized (packed codes,
// linear UE4M3 scales) -> the BF16 operand rows a grouped GEMM reads,
// value(q) * f32(s) (exact in BF16, docs/numerics.md §2), zero past `cols` up to
// `ld`, in the column order the GEMM asks for (layout/operand_order.hpp).
// The expert-parallel path stages each token once on its own rank and sends
// these bytes; the rank that owns the expert expands them here.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/layout/operand_order.hpp"

namespace nvfp4moe::cuda {

struct ExpandRowsArgs {
  const uint8_t* codes = nullptr;   // [rows_max, cols/2]
  const uint8_t* scales = nullptr;  // [rows_max, cols/16]
  int32_t rows_max = 0;             // the grid: rows this call can have
  const int32_t* live_rows = nullptr;  // device: rows that are live (<= rows_max)
  int32_t cols = 0;                 // a multiple of 16
  __nv_bfloat16* out = nullptr;     // [rows_max, ld]
  int32_t ld = 0;                   // a multiple of 8, >= cols
  OperandOrder order;
  bool next_overlaps = false;  // as QuantizeActArgs::next_overlaps (staging.hpp)
};

// Once per process before the first call outside any stream capture: the
// kernel's shared memory for rows of up to `cols` columns.
void expand_nvfp4_rows_prepare(int32_t cols);
void expand_nvfp4_rows(const ExpandRowsArgs& args, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
