// expand_nvfp4_rows (see expand_rows.hpp).
#include "cuda/kernels/expand_rows.hpp"

#include "cuda/cuda_check.hpp"
#include "cuda/dependent_launch.hpp"
#include "format/nvfp4_codec.hpp"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 256;  // cols / 16 blocks of a row, then cols / 8 stores

// grid (rows_max); dynamic smem: cols / 2 words. A thread takes whole
// 16-value blocks (8 code bytes and their scale, one round trip) and leaves
// their 8 BF16 pairs in shared memory; after one barrier the row is written
// as 16-byte units, gathered from shared memory in the order asked for
// (k-slot: unit (chunk, s, h) = pair 2 s + h of the chunk's 4 blocks). Scalar
// 2-byte stores made this kernel ~25x slower than its bytes at 64 tokens.
__global__ void expand_nvfp4_rows_kernel(ExpandRowsArgs a) {
  extern __shared__ uint32_t pairs[];  // [cols / 2] BF16 pairs of the row, logical order
  const int32_t p = blockIdx.x;
  if (p >= *a.live_rows) return;
  const uint32_t blocks = uint32_t(a.cols) / 16u;
  for (uint32_t b = threadIdx.x; b < blocks; b += blockDim.x) {
    const uint2 codes = reinterpret_cast<const uint2*>(a.codes + int64_t(p) * (a.cols / 2))[b];
    const float s = fmt::e4m3_value(a.scales[int64_t(p) * (a.cols / 16) + b]);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t byte = ((j < 4 ? codes.x : codes.y) >> (8 * (j % 4))) & 0xFFu;
      const __nv_bfloat162 v =
          __floats2bfloat162_rn(fmt::e2m1_value(uint8_t(byte & 15u)) * s, fmt::e2m1_value(uint8_t(byte >> 4)) * s);
      pairs[8 * b + j] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
  __syncthreads();
  const bool kslot = a.order.kslot();
  uint4* row = reinterpret_cast<uint4*>(a.out + int64_t(p) * a.ld);
  // Units of 4 pairs; pairs of blocks past cols are the zero padding (a
  // partial last 64-column chunk spreads them over all of its k-slot units).
  auto pair_of_block = [&](uint32_t b, uint32_t j) { return b < blocks ? pairs[8u * b + j] : 0u; };
  for (uint32_t u = threadIdx.x; u < uint32_t(a.ld) / 8u; u += blockDim.x) {
    uint4 v;
    if (kslot) {  // unit 8 c + 2 s + h <- pair 2 s + h of blocks 4 c + t, t = 0..3
      const uint32_t b0 = 4u * (u / 8u), j = u % 8u;
      v = make_uint4(pair_of_block(b0, j), pair_of_block(b0 + 1u, j), pair_of_block(b0 + 2u, j),
                     pair_of_block(b0 + 3u, j));
    } else {  // unit u <- pairs 4 u .. 4 u + 3, i.e. pairs 4 (u % 2) .. of block u / 2
      const uint32_t b = u / 2u, j = 4u * (u % 2u);
      v = make_uint4(pair_of_block(b, j), pair_of_block(b, j + 1u), pair_of_block(b, j + 2u), pair_of_block(b, j + 3u));
    }
    row[u] = v;
  }
}

}  // namespace

void expand_nvfp4_rows_prepare(int32_t cols) { allow_smem_at_least(expand_nvfp4_rows_kernel, size_t(cols) * 2); }

void expand_nvfp4_rows(const ExpandRowsArgs& a, cudaStream_t stream) {
  NVFP4_CHECK(a.cols > 0 && a.cols % 16 == 0 && a.ld % 8 == 0 && a.ld >= a.cols, "expand_nvfp4_rows: cols=", a.cols,
              " must be a positive multiple of 16 and ld=", a.ld, " a multiple of 8 >= cols");
  if (a.rows_max <= 0) return;
  launch_dependent(expand_nvfp4_rows_kernel, dim3(unsigned(a.rows_max)), dim3(kThreads), size_t(a.cols) * 2, stream,
                   LaunchOverlap::ahead_of_overlap(false, a.next_overlaps, a.rows_max), a);
}

}  // namespace nvfp4moe::cuda
