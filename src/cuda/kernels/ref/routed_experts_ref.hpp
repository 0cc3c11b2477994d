// The scalar reference of the routed experts' two GEMMs (the *_ref twins of
// the grouped GEMMs, layout/grouped_gemm_plan.hpp): one thread per output
// element, FP32 sums, exact dequantization of weights in the LINEAR layout
// (ExpertWeights' bytes as they are, NVFP4 or MXFP4) and of the L1 input as NVFP4 rows.
//
//   gate/up: h[pos, i] = swiglu(g_x g_w1 (a . W1_e[i]), g_x g_w3 (a . W3_e[i]))
//   down:    y_pair[pair, n] = w_pair * g_h g_w2 (QDQ(h) . W2_e[n])
// where pos runs over the live positions (offsets[local]), a is the NVFP4 row
// pair_of_pos[pos] / top_k of the input, e = expert_of_pos[pos], and pair =
// pair_of_pos[pos]. Compiled without fast math: silu uses expf.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/layout/grouped_gemm_plan.hpp"

namespace nvfp4moe::cuda {

struct RoutedExpertsRefArgs {
  // The L1 input as NVFP4 rows: codes [rows, H/2], linear scales [rows, H/16], g [rows].
  const uint8_t* x_codes = nullptr;
  const uint8_t* x_scales = nullptr;
  const float* x_g = nullptr;
  // The grouping (kernels/grouping.hpp): positions and their pairs.
  const int32_t* pair_of_pos = nullptr;
  int top_k = 1;
  const int32_t* expert_of_pos = nullptr;
  const int32_t* live_positions = nullptr;  // device: offsets[local]
  int32_t positions_max = 0;                // the grid
  const float* pair_weights = nullptr;      // [pairs] routing weight w_j
  int64_t hidden = 0, inter = 0;
  bool has_limit = false;
  float limit = 0.0f;
  // The experts in the linear layout: NVFP4 (UE4M3 scales per 16, B = 16)
  // or MXFP4 (UE8M0 scales per 32, B = 32; its g_w are ones).
  bool mxfp4 = false;
  const uint8_t* w13_codes = nullptr;   // [E_local, 2I, H/2]: gate rows then up rows
  const uint8_t* w13_scales = nullptr;  // [E_local, 2I, H/B]
  const float* w13_global = nullptr;    // [E_local, 2]
  const uint8_t* w2_codes = nullptr;    // [E_local, H, I/2]
  const uint8_t* w2_scales = nullptr;   // [E_local, H, I/B]
  const float* w2_global = nullptr;     // [E_local]
};

// Once per process before the first call outside any stream capture.
void routed_experts_ref_prepare(int64_t hidden, int64_t inter);
// h [positions_max, I] f32.
void routed_gate_up_ref(const RoutedExpertsRefArgs& a, float* h, cudaStream_t stream);
// h_deq [positions_max, ld] the BF16 operand of QDQ(h) in logical order, h_g [positions_max] its g;
// y_pair: each pair's row of H values (PairOutput).
void routed_down_ref(const RoutedExpertsRefArgs& a, const __nv_bfloat16* h_deq, int64_t ld, const float* h_g,
                     const PairOutput& y_pair, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
