// MXFP4 decode and the lossless cast's exact blocks on the GPU (see
// mxfp4_decode.hpp). Every value and byte comes from the one codec,
// src/format/mxfp4_codec.hpp; simple grid-stride kernels, one thread per
// scale block, bound by memory.
#include "cuda/kernels/mxfp4_decode.hpp"

#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "format/mxfp4_codec.hpp"

namespace nvfp4moe::cuda {

namespace {

using namespace nvfp4moe::fmt;

constexpr int kThreads = 256;

// Grid of at most 4 waves of 1024 CTAs; surplus threads exit.
unsigned grid_for(int64_t items) { return unsigned(std::clamp<int64_t>(ceil_div(items, kThreads), 1, 4096)); }

// value(q) * 2^(b - 127) has at most 3 significant bits and no bits below
// FP32 bit 16 (down to 0.5 * 2^-127 = 2^-128, FP32 0x00200000): its BF16 is
// the FP32's high half, no rounding.
__device__ __forceinline__ uint32_t bf16_bits_of_pair(uint8_t byte, float s) {
  const uint32_t lo = float_to_bits(e2m1_value(uint8_t(byte & 15)) * s) >> 16;
  const uint32_t hi = float_to_bits(e2m1_value(uint8_t(byte >> 4)) * s) >> 16;
  return lo | (hi << 16);  // element 2i (low nibble) first in memory
}

// One thread per MX block of 32: 16 code bytes in, 64 bytes of BF16 out.
__global__ void mxfp4_decode_bf16_kernel(const uint8_t* codes, const uint8_t* scales, int64_t blocks,
                                         __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < blocks; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 c = reinterpret_cast<const uint4*>(codes)[i];
    const float s = ue8m0_value(scales[i]);
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
    uint4* o = reinterpret_cast<uint4*>(out) + i * 4;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint4 v;
      v.x = bf16_bits_of_pair(uint8_t(w[q]), s);
      v.y = bf16_bits_of_pair(uint8_t(w[q] >> 8), s);
      v.z = bf16_bits_of_pair(uint8_t(w[q] >> 16), s);
      v.w = bf16_bits_of_pair(uint8_t(w[q] >> 24), s);
      o[q] = v;
    }
  }
}

__global__ void mxfp4_max_scale_byte_kernel(const uint8_t* scales, int64_t n, unsigned* max_byte) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    m = max(m, unsigned(scales[i]));  // byte 0 (an all-zero block) never wins over a non-zero one
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0 && m != 0) atomicMax(max_byte, m);
}

// One thread per NVFP4 block of 16.
__global__ void mxfp4_keep_exact_blocks_kernel(const uint8_t* mx_codes, const uint8_t* mx_scales, int64_t blocks,
                                               int m, uint8_t* nv_codes, uint8_t* nv_scales,
                                               unsigned long long* exact_blocks) {
  unsigned kept = 0;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < blocks; j += int64_t(gridDim.x) * blockDim.x) {
    // Rows are dense and K/16 is even: NVFP4 block j of the tensor lies in MX block j / 2.
    uint8_t s = 0;
    if (!mx_block_scale_as_e4m3(mx_scales[j / 2], m, &s)) continue;
    reinterpret_cast<uint2*>(nv_codes)[j] = reinterpret_cast<const uint2*>(mx_codes)[j];
    nv_scales[j] = s;
    ++kept;
  }
  for (int o = 16; o > 0; o >>= 1) kept += __shfl_xor_sync(0xffffffffu, kept, o);
  if ((threadIdx.x & 31) == 0 && kept != 0) atomicAdd(exact_blocks, (unsigned long long)kept);
}

void check_geometry(int64_t rows, int64_t cols, const char* who) {
  NVFP4_CHECK(rows >= 0 && cols >= 0 && cols % kMxBlock == 0, who, ": [", rows, ", ", cols,
              "] is not an MXFP4 weight (K a multiple of 32)");
}

}  // namespace

void mxfp4_decode_bf16(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, __nv_bfloat16* out,
                       cudaStream_t stream) {
  check_geometry(rows, cols, "mxfp4_decode_bf16");
  NVFP4_CHECK(aligned_to(codes, 16) && aligned_to(out, 16), "mxfp4_decode_bf16: codes and out must be 16-byte "
              "aligned (device allocations are)");
  const int64_t blocks = rows * (cols / kMxBlock);
  if (blocks == 0) return;
  mxfp4_decode_bf16_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(codes, scales, blocks, out);
  NVFP4_CUDA_CHECK_LAUNCH("mxfp4_decode_bf16_kernel");
}

void mxfp4_max_scale_byte(const uint8_t* scales, int64_t n, unsigned* max_byte, cudaStream_t stream) {
  NVFP4_CUDA_CHECK(cudaMemsetAsync(max_byte, 0, sizeof(unsigned), stream));
  if (n == 0) return;
  mxfp4_max_scale_byte_kernel<<<grid_for(ceil_div(n, 8)), kThreads, 0, stream>>>(scales, n, max_byte);
  NVFP4_CUDA_CHECK_LAUNCH("mxfp4_max_scale_byte_kernel");
}

void mxfp4_keep_exact_blocks(const uint8_t* mx_codes, const uint8_t* mx_scales, int64_t rows, int64_t cols, int m,
                             uint8_t* nv_codes, uint8_t* nv_scales, unsigned long long* exact_blocks,
                             cudaStream_t stream) {
  check_geometry(rows, cols, "mxfp4_keep_exact_blocks");
  NVFP4_CHECK(aligned_to(mx_codes, 8) && aligned_to(nv_codes, 8), "mxfp4_keep_exact_blocks: code buffers must be "
              "8-byte aligned");
  NVFP4_CUDA_CHECK(cudaMemsetAsync(exact_blocks, 0, sizeof(unsigned long long), stream));
  const int64_t blocks = rows * (cols / kBlock);
  if (blocks == 0) return;
  mxfp4_keep_exact_blocks_kernel<<<grid_for(blocks), kThreads, 0, stream>>>(mx_codes, mx_scales, blocks, m, nv_codes,
                                                                            nv_scales, exact_blocks);
  NVFP4_CUDA_CHECK_LAUNCH("mxfp4_keep_exact_blocks_kernel");
}

}  // namespace nvfp4moe::cuda
