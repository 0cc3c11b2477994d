// fp8_operand_rows (see the header).
#include "cuda/kernels/fp8_operand.hpp"

#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/layout/fp8_operand.hpp"
#include "cuda/ptx/sm90_ld_cvt.cuh"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

constexpr int kWarpsPerCta = 8;

__global__ void __launch_bounds__(32 * kWarpsPerCta) fp8_operand_rows_kernel(const Fp8OperandArgs a) {
  if (a.live_pairs && *a.live_pairs <= a.pairs_above) return;
  const int64_t rows = a.live_rows ? min(int64_t(*a.live_rows), a.rows_max) : a.rows_max;
  const int64_t blocks = a.cols / kFp8OperandBlock;
  const int lane = int(threadIdx.x % 32);
  const int64_t warp = int64_t(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerCta;
  for (int64_t job = warp; job < rows * blocks; job += warps) {
    const int64_t r = job / blocks, b = job % blocks;
    const int64_t col = b * kFp8OperandBlock + 4 * lane;
    const uint2 raw = *reinterpret_cast<const uint2*>(a.in + r * a.ld_in + col);
    const uint32_t half[4] = {raw.x & 0xffffu, raw.x >> 16, raw.y & 0xffffu, raw.y >> 16};
    float v[4], amax = 0.0f;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[i] = fmt::bits_to_float(half[i] << 16);
      nan = nan || !fmt::is_finite(v[i]);
      amax = fmaxf(amax, fabsf(v[i]));
    }
#pragma unroll
    for (int x = 16; x >= 1; x >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, x));
    nan = __any_sync(0xffffffffu, nan);
    const float s = nan ? fmt::bits_to_float(0x7fc00000u) : fp8_operand_scale(amax);
    // x / s is exact (s a power of two): the conversion's rounding never
    // acts on operands of the fp8 mode, and it is e4m3_from_float's (nearest
    // even, saturating at 448) for any other input. 1 / s is exact unless s
    // is an FP32 subnormal.
    const float inv = s >= 0x1p-126f ? 1.0f / s : 0.0f;
    uint32_t word = 0x7F7F7F7Fu;  // a block holding NaN: every byte NaN
    if (!nan) {
      float q[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) q[i] = inv != 0.0f ? v[i] * inv : v[i] / s;
      word = uint32_t(ptx::cvt_e4m3x2_from_f32_satfinite(q[1], q[0])) |
             uint32_t(ptx::cvt_e4m3x2_from_f32_satfinite(q[3], q[2])) << 16;
    }
    *reinterpret_cast<uint32_t*>(a.codes + r * a.ld_codes + fp8_operand_column(col)) = word;
    if (lane == 0) a.scales[r * blocks + b] = s;
  }
}

}  // namespace

void fp8_operand_rows(const Fp8OperandArgs& a, cudaStream_t stream) {
  NVFP4_CHECK(a.in && a.codes && a.scales, "fp8_operand_rows: in, codes and scales are required");
  NVFP4_CHECK(a.cols > 0 && a.cols % kFp8OperandBlock == 0 && a.ld_in >= a.cols && a.ld_in % 4 == 0 &&
                  a.ld_codes >= a.cols && a.ld_codes % 16 == 0,
              "fp8_operand_rows: ", a.cols, " columns (a positive multiple of ", kFp8OperandBlock,
              "), input stride ", a.ld_in, " (a multiple of 4), code stride ", a.ld_codes, " (a multiple of 16)");
  NVFP4_CHECK(aligned_to(a.in, 8) && aligned_to(a.codes, 16), "fp8_operand_rows: in must be 8-byte and codes 16-byte aligned");
  if (a.rows_max <= 0) return;
  const int64_t jobs = a.rows_max * (a.cols / kFp8OperandBlock);
  const int grid = int(std::min<int64_t>((jobs + kWarpsPerCta - 1) / kWarpsPerCta, int64_t(sm_count()) * 16));
  fp8_operand_rows_kernel<<<grid, 32 * kWarpsPerCta, 0, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("fp8_operand_rows_kernel");
}

}  // namespace nvfp4moe::cuda
