// The shared expert at few tokens (T <= 8): one pass over its BF16 weights
// per projection on the tensor cores, the SwiGLU fused into the gate/up pass.
//
//   gate/up: one CTA per 8 rows i: an m16 tile whose rows 0-7 are gate rows
//            i..i+7 and rows 8-15 the matching up rows, times the T tokens
//            as the n8 side (mma.sync m16n8k16, FP32 accumulation); a lane
//            then holds gate and up of the same (row, token) and writes
//            h = bf16(swiglu(gate, up)) directly;
//   down:    one CTA per 16 output rows, out f32.
// In both the 4 warps of a CTA split K by 32-column chunks (warp w: chunks
// w, w + 4, ...), each lane streaming 16 bytes of two weight rows and of its
// token's row per chunk, the next 4 chunks in flight while 4 are multiplied,
// and the partial sums meet in
// shared memory. The k order inside a chunk is permuted the same way for
// weights and tokens (lane quad t's 8 contiguous columns feed k-slots
// 2t, 2t+1, 2t+8, 2t+9 of two mma steps), so every load is 16 contiguous
// bytes. Same math as the cuBLAS path (BF16 x and h, FP32 sums, one BF16
// rounding of h), in another summation order.
#pragma once

#include <cuda_runtime.h>

#include "cuda/kernels/shared_expert.hpp"

namespace nvfp4moe::cuda {

constexpr int64_t kSharedGemvMaxTokens = 8;

// 1 <= T <= 8, H and Is multiples of 32, 16-byte aligned x, weights and h.
bool shared_expert_gemv_supports(const SharedExpertArgs& a);
void shared_expert_gemv(const SharedExpertArgs& a, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
