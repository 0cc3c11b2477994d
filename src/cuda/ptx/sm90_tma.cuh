// One-instruction PTX wrappers of the copy engine (TMA, sm_90): a 1-D bulk
// copy of contiguous bytes, and a tiled copy of a box of a tensor
// (CUtensorMap, built on the host by tensor_map.hpp), from global into shared
// memory, each completing on an mbarrier as transaction bytes (armed with
// mbarrier_arrive_expect_tx, sm90_mbarrier.cuh); the bulk prefetch into L2;
// and the L2 cache policy a copy may carry.
#pragma once

#include <cstdint>

namespace nvfp4moe::cuda::ptx {

// `bytes` (a multiple of 16; both ends 16-byte aligned) from `src` to `dst`:
// the 1-D bulk copy. Without a cluster launch the CTA's own shared window is
// its cluster window.
__device__ __forceinline__ void cp_async_bulk_shared_global(uint32_t dst, const void* src, uint32_t bytes,
                                                            uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// The same copy under an L2 cache policy (l2_policy_evict_first).
__device__ __forceinline__ void cp_async_bulk_shared_global(uint32_t dst, const void* src, uint32_t bytes,
                                                            uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// A cache policy under which L2 evicts a kernel's lines before any others:
// for bytes read once.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// The box of `map` at element coordinates (x, y) / (x, y, z) -> shared `dst`
// (128-byte aligned; 1024 for the 128-byte swizzle); completes `bytes` of
// `bar`'s transaction count. Elements outside the tensor read as zero and
// still count.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, uint32_t bar, int32_t x, int32_t y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(x), "r"(y)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, uint32_t bar, int32_t x, int32_t y,
                                            int32_t z) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(x), "r"(y), "r"(z)
      : "memory");
}

// `bytes` (a multiple of 16; both ends 16-byte aligned) from `src` into L2,
// with no destination and no completion to wait for: the bulk prefetch.
__device__ __forceinline__ void prefetch_bulk_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// Pulls a tensor map (a kernel parameter) into the TMA unit's cache ahead of
// its first use.
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

}  // namespace nvfp4moe::cuda::ptx
