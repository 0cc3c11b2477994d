// run_expert_gemm: the one place that chooses which grouped GEMM kernel runs
// a projection of the routed experts, for the cuda backend and the
// expert-parallel path alike.
//
// Weights: the fragment layout (fragment_layout.hpp) wherever its
// geometry allows (K % 128 == 0, I % 8 == 0) — one copy serves the decode and
// the wgmma kernel; the tile layout and the correctness-first
// grouped_gemm_ref only for shapes it does not allow.
//
// The choice depends on how many (token, expert) pairs are live, which only
// the device knows (grouping runs on it). So every kernel that can be right
// for some count up to the host's bound is queued, each with a disjoint
// range of live pairs (GroupedGemmPlan::live_pairs); all but one exit at once.
// Ranges, in average tokens per local expert (the decode range measured on
// the H200, its end in touched experts and the narrow range's end on an
// H100; docs/performance.md):
//   <= 3, and at most as many pairs as uniform routing needs to touch 80
//         experts (89 of 384, 95 of 256; no bound up to 84 local experts):
//         sm90_nvfp4_decode_gemm (decode; K % 1024 == 0)
//  <= 16: sm90_nvfp4_prefill_gemm 32 positions wide over every block (one
//         launch, TokenBlocks::All)
//   above: sm90_nvfp4_prefill_gemm, 128 positions per tile, an expert's last
//          block at 32, 64 or 96 when its rows fit (four launches, TokenBlocks::Split)
// NVFP4MOE_GEMM=decode|narrow|wgmma forces one kernel (benchmarks, A/B);
// decode falls back to wgmma (the Split launches) where it does not support
// the shape. The prefill kernel's form (BF16 or FP8 operands) is not chosen
// here: it follows the plan (act_fp8 set when RoutedExperts took the FP8
// form at load).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>


#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"
#include "cuda/layout/grouped_gemm_plan.hpp"
#include "cuda/layout/operand_order.hpp"

namespace nvfp4moe::cuda {

// The kernels queued for one projection, each with its range of live pairs
// (above, at_most]; the ranges are disjoint and cover [0, pairs_bound].
struct ExpertGemmCandidate {
  // Narrow: the prefill kernel 32 wide over every block, one launch; Wgmma:
  // its Split launches.
  enum Kind { Simple, Decode, Narrow, Wgmma } kind;
  int64_t above, at_most;
  // Whether the kind is the prefill kernel (its operand rows in k-slot order).
  static constexpr bool prefill(Kind k) { return k == Narrow || k == Wgmma; }
};
struct ExpertGemmChoice {
  ExpertGemmCandidate candidates[3];
  int count = 0;
  // The live pairs the decode kernel's items are sized for
  // (sm90_nvfp4_decode_gemm_config): the planned count, at most the decode
  // candidate's bound. Any count runs correctly in any configuration.
  int64_t decode_sized_for = 0;
  // The order its operand rows must be written in (operand_order.hpp), decided on the device alike.
  OperandOrder operand_order(const int32_t* live_pairs) const;
  // Host mirror (tests): the kind that runs when `live` pairs are live.
  ExpertGemmCandidate::Kind kind_for(int64_t live) const;
};
// has_fragment: weights in the fragment layout (else: tile layout, the simple
// kernel); decode_supported: the decode kernel takes their K. forced: the
// value of NVFP4MOE_GEMM (null or empty: none). pairs_planned: the live pairs
// the forward is expected to have (planned_pairs; negative: pairs_bound),
// which sizes the decode kernel's items; the candidates follow the bound.
ExpertGemmChoice choose_expert_gemm(int64_t local_experts, int64_t pairs_bound, int64_t pairs_planned,
                                    bool has_fragment, bool decode_supported, const char* forced);

// The most pairs for which uniform routing over `experts` is expected to
// touch at most `touched` of them (the largest p with E (1 - (1 - 1/E)^p) <=
// touched); no bound (INT64_MAX) when touched >= experts.
int64_t pairs_touching_at_most(int64_t experts, int64_t touched);

// The live pairs to plan a forward for when `slots` (token, slot) pairs can
// reach `local_experts` of `experts`: 1.5 times their share under uniform
// routing, at most all of them. A rank of an expert-parallel layer, or a Moe
// holding a slice of the experts, sees a bound R times (E / local times) the
// pairs it usually gets; a decode configuration sized for the bound is slower
// for the usual count (an EP8 rank at T = 4 gets 0.5 pairs an expert, where
// 1x1 items are 2-9 % faster than the 1x2 / 2x2 of the bound's 3-4;
// docs/performance.md).
int64_t planned_pairs(int64_t slots, int64_t local_experts, int64_t experts);

// Once per owner of weights, before the first run_expert_gemm and outside any
// stream capture: kernel attributes for up to `local_experts` experts.
void prepare_expert_gemm(int64_t local_experts);

// The choice for a forward, made once for both projections (the operand
// order must agree): gate_up / down the fragment-layout weights or null,
// pairs_bound the most live pairs it can have (T * k, or the receive
// capacity), pairs_planned as in choose_expert_gemm; reads NVFP4MOE_GEMM.
ExpertGemmChoice expert_gemm_choice(int64_t local_experts, int64_t pairs_bound, int64_t pairs_planned,
                                    const FragmentWeights* gate_up, const FragmentWeights* down);

// Queues the candidates of `choice`. plan: tiles/num_tiles and
// offsets/local_experts filled, plan.weights the tile layout when `fragment`
// is null; its operand rows written in choice.operand_order(offsets + local).
void run_expert_gemm(const GroupedGemmPlan& plan, const FragmentWeights* fragment, const ExpertGemmChoice& choice,
                     cudaStream_t stream);

}  // namespace nvfp4moe::cuda
