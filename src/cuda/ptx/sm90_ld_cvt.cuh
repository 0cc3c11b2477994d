// One-instruction PTX wrappers of the register-direct decode GEMM
// (sm90_nvfp4_decode_gemm): streaming and read-only global loads, and the FP8
// pair conversion and the byte permute. (mma.sync and the BF16 multiply live in
// sm80_mma_cp_async.cuh.)
#pragma once

#include <cstdint>

namespace nvfp4moe::cuda::ptx {

// 16 bytes read once: skip L1, ask L2 for the whole 256-byte sector group.
__device__ __forceinline__ uint4 ld_global_stream_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ uint32_t ld_global_stream_u32(const void* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}

// 16 bytes of a read-only operand reused by other warps (kept in L1).
__device__ __forceinline__ uint4 ld_global_nc_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Byte permute (PRMT, default mode): byte i of the result is byte sel[4i+2..4i]
// of {b, a} (a = bytes 0-3), or with bit 4i+3 set that byte's sign bit
// repeated over all 8 bits.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Two UE4M3 bit patterns (low byte -> low half) -> two FP16 values, exact.
__device__ __forceinline__ uint32_t cvt_e4m3x2_to_f16x2(uint16_t pair) {
  uint32_t d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(d) : "h"(pair));
  return d;
}

// FP32 -> UE4M3 bit pattern, round to nearest even, finite values beyond 448
// saturating to 448 (0x7E). Infinities saturate too, so callers keep them
// away (e4m3_from_float maps them to NaN).
__device__ __forceinline__ uint8_t cvt_e4m3_from_f32_satfinite(float v) {
  uint16_t d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(d) : "f"(0.0f), "f"(v));  // v -> the low byte
  return uint8_t(d & 0xffu);
}

// Two FP32 values -> two UE4M3 bit patterns (hi in the upper byte), as
// cvt_e4m3_from_f32_satfinite each.
__device__ __forceinline__ uint16_t cvt_e4m3x2_from_f32_satfinite(float hi, float lo) {
  uint16_t d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(d) : "f"(hi), "f"(lo));
  return d;
}

// Two FP32 values -> BF16x2 (hi in the upper half), round to nearest even.
__device__ __forceinline__ uint32_t cvt_bf16x2_from_f32(float hi, float lo) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

}  // namespace nvfp4moe::cuda::ptx
