// RoutedExperts: the routed experts of a layer (or of an expert-parallel
// rank's slice) on the GPU, and the one place their pipeline is wired:
//
//   L1 input -> BF16 operand rows -> gate/up GEMM + SwiGLU -> h
//            -> requantize h (QDQ per docs/numerics.md §2; or the bf16 / fp8
//               activation mode of §7) -> down GEMM x w_j -> y_pair
//
// It owns the weights in kernel layout (the fragment layout of the decode
// and prefill kernels wherever the shape has it, else the tile layout of the
// reference GEMM; with RoutedKernels::Reference the linear layout of the
// scalar reference kernels), the GEMM choice (backend/expert_gemm.hpp) and
// the operand order it implies, and the buffers between the stages. The
// single-GPU backend, each expert-parallel rank and the benchmark run it.
//
// The L1 input comes in one of two forms: activation rows x, which run()
// stages itself (per row, or with the layer's static g), or rows already in
// NVFP4 (an expert-parallel rank's receive area), which it expands. The
// grouping (kernels/grouping.hpp, or the expert-parallel placement) says
// which input row and expert each position is, and where to write its result.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "cuda/backend/expert_gemm.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels/expand_rows.hpp"
#include "cuda/kernels/fp8_operand.hpp"
#include "cuda/kernels/staging.hpp"
#include "cuda/layout/weight_upload.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cuda {

// Which kernels run the experts: the fast ones (decode / prefill, chosen on
// the device), or the scalar references (tests compare the two).
enum class RoutedKernels : uint8_t { Fast, Reference };

// The weights of `count` local experts in the layout their kernels read.
struct RoutedWeightsDevice {
  ExpertFormat format = ExpertFormat::Nvfp4;
  int64_t count = 0, hidden = 0, inter = 0;
  FragmentWeightsDevice w13_frag, w2_frag;            // fragment layout: decode and prefill kernels
  DeviceBuffer<uint8_t> w13_tiles, w2_tiles;          // tile layout: shapes without the fragment layout
  DeviceBuffer<uint8_t> w13_codes, w13_scales, w2_codes, w2_scales;  // linear layout: the references
  DeviceBuffer<float> w13_global, w2_global;          // [count, 2] (gate, up), [count]: g_w (NVFP4), the
                                                      // row groups' factors (MXFP4 in a kernel layout), 1 (MXFP4 linear)
  DeviceBuffer<float> w2_static_g;                    // [count] static g of h (L2 input), or empty
  // The prefill GEMM's tensor-core form, chosen here: FP8 when both
  // projections have the FP8 form's row exponents (fp8_operand.hpp), else BF16,
  // with the reason when FP8 was asked for.
  bool fp8_prefill() const { return w13_frag.fp8_rows.size() > 0 && w2_frag.fp8_rows.size() > 0; }
  std::string fp8_refusal;
};
// ExpertWeights -> the layout `kernels` reads; w2_static_g when the config's
// L2 input is static. fp8_mma: use the FP8 form of the prefill GEMM where the
// activation mode is fp8 and every expert's weight rows are E4M3 values
// times a power of two (docs/numerics.md §8).
RoutedWeightsDevice upload_routed_weights(const ExpertWeights& w, const MoeConfig& config, RoutedKernels kernels,
                                          bool fp8_mma = false);
// "fp8", "bf16", or "bf16 (<why not fp8>)": the prefill GEMM's form, for messages and the bench.
std::string prefill_mma_name(const RoutedWeightsDevice& w, const MoeConfig& config);

// The L1 input of one forward: activation rows x, or NVFP4 rows.
struct RoutedInput {
  const void* x = nullptr;           // [rows, H] bf16 or f32, staged by run()
  bool x_is_bf16 = false;
  const uint8_t* codes = nullptr;    // or: [rows, H/2] packed E2M1 codes,
  const uint8_t* scales = nullptr;   //     [rows, H/16] linear UE4M3 scales,
  const float* g = nullptr;          //     [rows] global scales
  int64_t rows = 0;                  // rows given (the launches' bound)
  const int32_t* live_rows = nullptr;  // NVFP4 rows: device count of live rows
};

// One forward's grouping: positions of the local experts' groups.
struct RoutedPairs {
  const int32_t* pair_of_pos = nullptr;    // position -> pair; its input row is pair / top_k
  int top_k = 1;
  const int32_t* expert_of_pos = nullptr;  // position -> local expert
  const int32_t* offsets = nullptr;        // device [local + 1]: group starts; [local] = live positions
  const GemmTile* tiles = nullptr;         // the work list of the grouping
  const int32_t* num_tiles = nullptr;      // device
  const float* pair_weights = nullptr;     // [pairs] routing weight w_j
  int64_t pairs_bound = 0;                 // host: the most live positions this forward can have
  int64_t pairs_planned = -1;              // host: the live positions expected (planned_pairs); -1: the bound
};

class RoutedExperts {
 public:
  // The most rows of an L1 input and the most live positions of a forward.
  struct Capacity {
    int64_t input_rows = 0, pairs = 0;
  };
  // l1_static_g: the static g of x (0: per row); used when run() stages x.
  RoutedExperts(RoutedWeightsDevice weights, const MoeConfig& config, Capacity capacity, RoutedKernels kernels,
                float l1_static_g);

  int64_t local_experts() const { return w_.count; }
  bool fp8_prefill() const { return fp8_; }
  const std::string& prefill_mma() const { return prefill_mma_; }  // prefill_mma_name at construction
  RoutedKernels kernels() const { return kernels_; }

  // y_pair's row of each live position's pair = w_pair * o_e (every other row untouched).
  void run(const RoutedInput& input, const RoutedPairs& pairs, const PairOutput& y_pair, cudaStream_t stream);

  // The launches of one forward of the fast kernels, made on the host; run()
  // queues stage, gate_up, requantize, down. The benchmark times them one by
  // one and runs other configurations on the same plans.
  struct Plan {
    ExpertGemmChoice gemm;
    bool expand = false;          // NVFP4 input rows: expand (else stage x)
    QuantizeActArgs stage_x;
    ExpandRowsArgs expand_rows;
    GroupedGemmPlan gate_up, down;
    RequantRowsArgs requant;
    // The FP8 form: the E4M3 operand rows of x and of h, made from the BF16 ones.
    bool fp8 = false;
    Fp8OperandArgs x_fp8, h_fp8;
  };
  Plan plan(const RoutedInput& input, const RoutedPairs& pairs, const PairOutput& y_pair);
  void stage(const Plan& p, cudaStream_t stream) const;
  void gate_up(const Plan& p, cudaStream_t stream) const;
  void requantize(const Plan& p, cudaStream_t stream) const;
  void down(const Plan& p, cudaStream_t stream) const;
  // The fragment-layout weights of a projection (null where the shape has none).
  const FragmentWeights* fragments(Projection p) const;

 private:
  void check(const RoutedInput& input, const RoutedPairs& pairs, const PairOutput& y_pair) const;
  void run_ref(const RoutedInput& input, const RoutedPairs& pairs, const PairOutput& y_pair, cudaStream_t stream);
  QuantizeActArgs stage_x_args(const RoutedInput& input) const;
  RequantRowsArgs requant_args(const RoutedPairs& pairs, OperandOrder order);

  RoutedWeightsDevice w_;
  Capacity cap_;
  RoutedKernels kernels_;
  ActivationMode activation_ = ActivationMode::Nvfp4;  // how x and h become operand rows
  float l1_static_g_ = 0.0f;
  std::optional<float> limit_;
  FragmentWeights frag13_, frag2_;
  PackedGeometry geo13_, geo2_;
  int64_t ld_act_ = 0, ld_h_ = 0;  // operand rows: H and I rounded up to 64
  DeviceBuffer<__nv_bfloat16> act_;  // [input_rows, ld_act] value(q)*s of the L1 input
  DeviceBuffer<float> act_g_;        // [input_rows] its g (staged x)
  DeviceBuffer<float> h_, h_g_;      // [pairs, I], [pairs]
  DeviceBuffer<__nv_bfloat16> h_deq_;  // [pairs, ld_h] value(q)*s of QDQ(h)
  DeviceBuffer<uint8_t> x_codes_, x_scales_;  // Reference: staged x as NVFP4 rows
  bool fp8_ = false;                          // the prefill GEMM in its FP8 form
  std::string prefill_mma_;
  DeviceBuffer<uint8_t> act8_, h8_;           // [input_rows, ld_act], [pairs, ld_h] E4M3 operand rows
  DeviceBuffer<float> act8_scale_, h8_scale_;  // their scales per 128 columns
};

}  // namespace nvfp4moe::cuda
