// One-instruction PTX wrapper of the 1-D bulk copy (cp.async.bulk, the copy
// engine of sm_90): contiguous bytes from global to shared memory, counted on
// an mbarrier as transaction bytes (arm it with mbarrier_arrive_expect_tx).
// Addresses are 32-bit shared-window addresses (smem_addr()).
#pragma once

#include <cstdint>

namespace nvfp4moe::cuda::ptx {

// `bytes` (a multiple of 16; both ends 16-byte aligned) from `src` to `dst`.
// Without a cluster launch the CTA's own shared window is its cluster window.
__device__ __forceinline__ void cp_async_bulk_shared_global(uint32_t dst, const void* src, uint32_t bytes,
                                                            uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

}  // namespace nvfp4moe::cuda::ptx
