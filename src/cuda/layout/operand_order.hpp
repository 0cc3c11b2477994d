// Column order of a GEMM operand row (the BF16 activation rows the staging
// kernels write and the grouped GEMMs read).
//
// Logical order suits the decode kernel (a lane reads the 16 contiguous
// columns of its NVFP4 block) and the simple kernel. The wgmma kernel feeds
// its B operand from shared memory, where column j of a k16 step must hold
// the weight column the fragment layout put in mma k-slot j; with the
// operand already in that "k-slot order" in global memory, its producer
// copies whole 16-byte units. Which GEMM runs is known only on the device
// (run_expert_gemm), so the writer decides the same way: k-slot order iff
// *live_pairs > kslot_above.
#pragma once

#include <cstdint>
#include <limits>

#include "cuda/layout/fragment_layout.hpp"

namespace nvfp4moe::cuda {

// Inside each 64-column chunk, the column pair w = 8 t + 2 s + h (t: NVFP4
// block, s: mma k-step, h: which pair of the block's 4 columns at that step)
// moves to pair 8 s + 4 h + t: the k-slots 2 t (+1) + 8 h of step s, where
// the fragment layout (fragment_layout.hpp) put those weight columns.
// (Any integer type: kernels use 32-bit unsigned columns, whose division and
// remainder by the constants compile to shifts and masks.)
template <typename Int>
NVFP4_HD Int operand_kslot_column(Int col) {
  const Int chunk = col / kMmaChunkK, c = col % kMmaChunkK, w = c / 2;
  return chunk * kMmaChunkK + 2 * (8 * ((w % 8) / 2) + 4 * (w % 2) + w / 8) + c % 2;
}

struct OperandOrder {
  const int32_t* live_pairs = nullptr;  // device; null: decided by kslot_above alone
  int32_t kslot_above = std::numeric_limits<int32_t>::max();  // default: always logical

#ifdef __CUDACC__
  __device__ bool kslot() const { return live_pairs ? *live_pairs > kslot_above : kslot_above < 0; }
#endif
  // Host side: whether kslot() can be true on the device (what a writer must be ready for).
  bool may_be_kslot() const {
    return live_pairs ? kslot_above < std::numeric_limits<int32_t>::max() : kslot_above < 0;
  }
};

}  // namespace nvfp4moe::cuda
