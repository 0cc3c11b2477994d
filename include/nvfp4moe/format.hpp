// nvfp4moe — the NVFP4 format on the host: codecs, two-level quantization,
// dequantization and scale-factor layouts (docs/numerics.md §1-3).
//
// Bytes: codes are packed two per byte (element 2i low nibble), [rows, cols/2];
// block scales are UE4M3 bit patterns, one per 16 elements, [rows, cols/16]
// in the LINEAR layout unless a function says swizzled. Global scales g are
// FP32 in the dequantization direction: x_hat = value(q) * e4m3(s) * g.
//
// Every quantizer here is exact per docs/numerics.md §2 and bit-identical to the
// scalar `*_ref` versions (tests/format check it); the non-ref versions are
// vectorised and multithreaded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4moe/types.hpp"

namespace nvfp4moe {

constexpr int64_t kBlockSize = 16;

// ---- codecs (exact, scalar) -------------------------------------------------
uint8_t e2m1_encode(float v);      // nearest code, ties to even, sign iff v < 0
float e2m1_decode(uint8_t code);   // low 4 bits
uint8_t e4m3_encode(float v);      // RNE, saturates at 448, NaN/Inf -> 0x7F
float e4m3_decode(uint8_t byte);   // bit pattern -> value (0x3F -> 1.875)
float global_scale_for_amax(float amax);  // amax/(6*448), 1 when amax == 0

// ---- scopes of the global scale ---------------------------------------------
enum class ScaleScope : uint8_t {
  PerTensor,  // one g from the amax of the whole tensor
  PerRow,     // one g per row (per token), dynamic
  Static,     // one given g (a checkpoint's input_scale)
};
const char* scope_name(ScaleScope s);

// max |x| over n values; NaN if any is NaN.
float abs_max(const float* x, int64_t n);
float abs_max(const Bf16* x, int64_t n);

// ---- quantization -----------------------------------------------------------
// docs/numerics.md §2 (NVIDIA ModelOpt's NVFP4QTensor), for each block b of 16
// elements of a row with global scale g, in IEEE FP32:
//   s_b = e4m3(clamp(amax_b / f32(6 * g), 2^-9, 448)), 1.0 (0x38) for an all-zero block;
//   q_i = e2m1(x_i / (f32(s_b) * g)).
// A NaN/Inf g (a row holding NaN/Inf under a per-row scale) gives scale byte
// 0x7F and codes 0 in every block of its row; a NaN/Inf element under a
// given g, in its own block.
//
// Quantize rows of X [rows, cols] (row-major, row stride `ld` elements) with
// row r's global scale g[r * g_stride] (g_stride 0: one g for all rows).
// cols must be a multiple of 16. Writes codes [rows, cols/2] and linear scale
// bytes [rows, cols/16].
void quantize_rows(const float* x, int64_t rows, int64_t cols, int64_t ld, const float* g,
                   int64_t g_stride, uint8_t* codes, uint8_t* scales);
void quantize_rows(const Bf16* x, int64_t rows, int64_t cols, int64_t ld, const float* g,
                   int64_t g_stride, uint8_t* codes, uint8_t* scales);
// Scalar reference: docs/numerics.md §2 in code.
void quantize_rows_ref(const float* x, int64_t rows, int64_t cols, int64_t ld, const float* g,
                       int64_t g_stride, uint8_t* codes, uint8_t* scales);

// An owning quantized matrix (the linear layout).
struct Nvfp4Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;         // [rows, cols/2]
  std::vector<uint8_t> scales;        // [rows, cols/16], UE4M3 bit patterns
  std::vector<float> global_scale;    // 1 value (PerTensor/Static) or `rows`
  ScaleScope scope = ScaleScope::PerTensor;

  float g(int64_t row) const { return global_scale.size() == 1 ? global_scale[0] : global_scale[row]; }
};

// Quantize a whole matrix; `static_g` is used only with ScaleScope::Static.
// For weights pass check_finite=true: NaN/Inf is then an error naming `what`
// and the index (activations instead propagate NaN to their row).
Nvfp4Matrix quantize_matrix(const float* x, int64_t rows, int64_t cols, ScaleScope scope,
                            float static_g = 1.0f, bool check_finite = false,
                            const char* what = "tensor");
Nvfp4Matrix quantize_matrix(const Bf16* x, int64_t rows, int64_t cols, ScaleScope scope,
                            float static_g = 1.0f, bool check_finite = false,
                            const char* what = "tensor");

// ---- dequantization ----------------------------------------------------------
// out[r, i] = value(q) * e4m3(s) * g[r * g_stride], FP32 arithmetic.
void dequantize_rows(const uint8_t* codes, const uint8_t* scales, const float* g,
                     int64_t g_stride, int64_t rows, int64_t cols, float* out);
void dequantize_rows(const uint8_t* codes, const uint8_t* scales, const float* g,
                     int64_t g_stride, int64_t rows, int64_t cols, Bf16* out);
std::vector<float> dequantize(const Nvfp4Matrix& m);

// ---- rows as E4M3 values times a power of two (docs/numerics.md §8) ----------
// An FP8 tensor-core path (E4M3 x E4M3 products, FP32 sums) reproduces a
// projection exactly when every row's dequantized weights are E4M3 values
// times one power of two 2^r of that row. That holds when every block factor
// that multiplies a nonzero code is a power of two (each MXFP4 scale; NVFP4
// when e4m3(s) * g is, as ModelOpt's lossless MXFP4 cast makes both) and the row's nonzero magnitudes m * 2^e (m = 1 or 1.5) span at most
// 17 binades: r = e_max - 8 puts the largest at 2^8 or 1.5 * 2^8 <= 448 and
// keeps the smallest at least 2^-9 (m = 1) or 1.5 * 2^-8 (m = 1.5), the
// smallest E4M3 multiples of those.
struct E4m3RowShifts {
  bool exact = true;
  std::vector<int16_t> shift;  // r per row while exact (0 for an all-zero row)
  int64_t row = -1;            // the first row that is not
  std::string why;             // what breaks it there
};
// codes [rows, cols/2]; scales [rows, cols/block]: block 16 is NVFP4 (UE4M3
// bytes, factor e4m3(s) * g[r * g_stride]), block 32 MXFP4 (UE8M0 bytes, g
// unused). Stops at the first row that is not exact.
E4m3RowShifts e4m3_row_shifts(const uint8_t* codes, const uint8_t* scales, int block, const float* g,
                              int64_t g_stride, int64_t rows, int64_t cols);
// Scalar reference: dequantizes each row in FP32 and round-trips every
// nonzero value / 2^r through E4M3.
E4m3RowShifts e4m3_row_shifts_ref(const uint8_t* codes, const uint8_t* scales, int block, const float* g,
                                  int64_t g_stride, int64_t rows, int64_t cols);

// ---- scale-factor layouts (docs/numerics.md §3) ------------------------------
// Swizzled 128x4 (CUTLASS / vLLM scaled_fp4_quant / FlashInfer): rows padded to
// a multiple of 128, scale columns k = cols/16 to a multiple of 4, zero bytes.
int64_t swizzled_scale_bytes(int64_t rows, int64_t k);
// Byte offset of (row m, scale column c) in the swizzled buffer, kp = padded k.
// constexpr: the CUDA staging kernels call it too (--expt-relaxed-constexpr).
constexpr int64_t swizzled_offset(int64_t m, int64_t c, int64_t kp) {
  return ((m >> 7) * (kp / 4) + (c >> 2)) * 512 + (m & 31) * 16 + ((m >> 5) & 3) * 4 + (c & 3);
}
// linear [rows, k] -> swizzled (swizzled_scale_bytes(rows, k) bytes, padding zeroed).
void scales_linear_to_swizzled(const uint8_t* linear, int64_t rows, int64_t k, uint8_t* swizzled);
// swizzled -> linear [rows, k] (padding ignored).
void scales_swizzled_to_linear(const uint8_t* swizzled, int64_t rows, int64_t k, uint8_t* linear);

// ---- MXFP4 (docs/numerics.md §7) ----------------------------------------------
// DeepSeek's official routed experts: E2M1 codes packed as above ([rows,
// cols/2], element 2i in the low nibble) with one UE8M0 scale byte per 32
// elements ([rows, cols/32]): x_hat = value(q) * 2^(byte - 127), exact in FP32
// and BF16. No global scale.
constexpr int64_t kMxfp4BlockSize = 32;

float ue8m0_decode(uint8_t byte);  // 2^(byte - 127); 0xFF is NaN; 0x00 is 2^-127

// Throws naming `what`, the row and the block of the first NaN byte (0xFF),
// or of a byte above 0xFC, whose block's values 6 * 2^(byte - 127) would not
// all be finite in FP32 and BF16 (6 * 2^126 overflows). scales [rows, cols/32].
void check_mxfp4_scales(const uint8_t* scales, int64_t rows, int64_t cols, const char* what);

// out[r, i] = value(q) * 2^(s - 127), FP32 (exact). cols a multiple of 32.
void dequantize_mxfp4_rows(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, float* out);
void dequantize_mxfp4_rows(const uint8_t* codes, const uint8_t* scales, int64_t rows, int64_t cols, Bf16* out);

// An owning MXFP4 matrix.
struct Mxfp4Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;   // [rows, cols/2]
  std::vector<uint8_t> scales;  // [rows, cols/32], UE8M0 bit patterns
};
std::vector<float> dequantize(const Mxfp4Matrix& m);

// Throws naming `what` and the first index holding NaN/Inf.
void check_finite(const float* x, int64_t n, const char* what);
void check_finite(const Bf16* x, int64_t n, const char* what);

}  // namespace nvfp4moe
