// nvfp4moe_bulk_copy_bench: how fast one CTA an SM streams global memory
// into shared memory with 1-D bulk copies (cp.async.bulk, the copies of the
// FP8 shared expert's wgmma form and of the decode GEMMs' weight rings),
// nothing consuming the bytes: the ceiling of a kernel that streams its
// weights this way, per copy size, copies in flight and grid.
//
// One thread a CTA keeps `slots` copies of `copy` bytes in flight over a
// ring of shared memory, from `streams` sequential regions of its own
// (like the m-tiles of a row block), round robin; each run reads the next
// window of a 1 GiB source, so none of it is in L2. Usage:
//   nvfp4moe_bulk_copy_bench
// Prints one markdown table: per row the median of 7 runs.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "cli/bench_ceilings.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/ptx/sm90_mbarrier.cuh"
#include "cuda/ptx/sm90_tma.cuh"

using namespace nvfp4moe::cuda;

namespace {

// Copy i of a CTA reads stream i % streams at offset (i / streams) * copy of
// that stream's region (stream_bytes long); slot i % slots receives it.
__global__ void bulk_copy_stream_kernel(const uint8_t* src, int64_t stream_bytes, int streams, int copy, int slots) {
  extern __shared__ __align__(1024) unsigned char ring[];
  const uint32_t base = ptx::smem_addr(ring), bars = base + uint32_t(slots * copy);
  if (threadIdx.x != 0) return;
  for (int s = 0; s < slots; ++s) ptx::mbarrier_init(bars + 8 * s, 1);
  ptx::fence_mbarrier_init();
  const int64_t copies = stream_bytes / copy * streams;
  for (int64_t i = 0; i < copies; ++i) {
    const int slot = int(i % slots);
    if (i >= slots) ptx::mbarrier_wait_parity(bars + 8 * slot, uint32_t((i / slots - 1) & 1));
    const int64_t stream = int64_t(blockIdx.x) * streams + i % streams;
    ptx::mbarrier_arrive_expect_tx(bars + 8 * slot, uint32_t(copy));
    ptx::cp_async_bulk_shared_global(base + uint32_t(slot * copy), src + stream * stream_bytes + (i / streams) * copy,
                                     uint32_t(copy), bars + 8 * slot);
  }
  for (int64_t i = copies > slots ? copies - slots : 0; i < copies; ++i)
    ptx::mbarrier_wait_parity(bars + 8 * (i % slots), uint32_t((i / slots) & 1));
}

struct Case {
  int64_t total;  // bytes over the whole grid
  int grid, streams, copy, slots;
};

}  // namespace

int main() {
  constexpr size_t kSource = size_t(1) << 30;
  constexpr size_t kMaxRing = 200 * 1024;
  DeviceBuffer<uint8_t> source(kSource);
  NVFP4_CUDA_CHECK(cudaMemset(source.get(), 1, kSource));
  NVFP4_CUDA_CHECK(cudaFuncSetAttribute(bulk_copy_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(kMaxRing + 1024)));
  const int sms = sm_count();
  std::vector<Case> cases;
  // 44 MB: the gate/up weights of DeepSeek-V4-Pro's FP8 shared expert, one
  // launch's worth (its ramp and tail included); 704 MB: the steady rate.
  for (const int64_t total : {int64_t(44) << 20, int64_t(704) << 20})
    for (const int grid : {96, sms})
      for (const auto& [copy, slots] :
           std::vector<std::pair<int, int>>{{2048, 48}, {8192, 8}, {8192, 24}, {16384, 12}, {32768, 6}})
        cases.push_back({total, grid, 4, copy, slots});
  for (const int grid : {sms, 2 * sms}) cases.push_back({int64_t(44) << 20, grid, 1, 8192, 12});

  std::printf("| MB | CTAs | streams a CTA | copy bytes | in flight KB | us | TB/s | GB/s a CTA |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Case& c : cases) {
    int64_t stream_bytes = c.total / (int64_t(c.grid) * c.streams);
    stream_bytes -= stream_bytes % c.copy;
    const size_t smem = size_t(c.slots) * size_t(c.copy) + 8 * size_t(c.slots);
    const size_t window = size_t(stream_bytes) * size_t(c.streams) * size_t(c.grid);
    const size_t windows = kSource / window;
    size_t run = 0;
    const double us = median_time_us(7, [&] {
      const uint8_t* src = source.get() + (run++ % windows) * window;
      bulk_copy_stream_kernel<<<c.grid, 32, smem>>>(src, stream_bytes, c.streams, c.copy, c.slots);
      NVFP4_CUDA_CHECK_LAUNCH("bulk_copy_stream_kernel");
    });
    const double s = us * 1e-6, bytes = double(window);
    std::printf("| %lld | %d | %d | %d | %d | %.1f | %.2f | %.1f |\n", static_cast<long long>(c.total >> 20), c.grid,
                c.streams, c.copy, c.slots * c.copy / 1024, us, bytes / s / 1e12, bytes / c.grid / s / 1e9);
  }
  return 0;
}
