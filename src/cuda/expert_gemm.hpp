// run_expert_gemm: the one place that chooses which grouped GEMM kernel runs
// a projection of the routed experts, for the cuda backend and the
// expert-parallel path alike.
//
// The choice depends on how many (token, expert) pairs are live, which only
// the device knows (grouping runs on it). So every kernel that can be right
// for some count up to the host's bound is queued, each with a disjoint
// range of live pairs (GroupedGemmPlan::live_pairs); all but one exit at once.
// Ranges, in average tokens per local expert (measured on the H200,
// bench/NOTES.md):
//   <= 16: sm90_nvfp4_mma_gemm (decode; needs the fragment-layout weights)
//   <= 96: sm90_nvfp4_wgmma_gemm, 64 positions per tile
//   above: sm90_nvfp4_wgmma_gemm, 128 positions per tile
// NVFP4MOE_GEMM=simple|decode|wgmma forces one kernel (benchmarks, A/B);
// decode falls back to wgmma where the fragment copy is missing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/sm90_nvfp4_grouped_gemm.hpp"
#include "cuda/sm90_nvfp4_mma_gemm.hpp"

namespace nvfp4moe::cuda {

// The kernels queued for one projection, each with its range of live pairs
// (above, at_most]; the ranges are disjoint and cover [0, pairs_bound].
struct ExpertGemmCandidate {
  enum Kind { Simple, Decode, Wgmma64, Wgmma128 } kind;
  int64_t above, at_most;
};
struct ExpertGemmChoice {
  ExpertGemmCandidate candidates[3];
  int count = 0;
};
// forced: the value of NVFP4MOE_GEMM (null or empty: none).
ExpertGemmChoice choose_expert_gemm(int64_t local_experts, int64_t pairs_bound, bool has_decode_weights,
                                    const char* forced);

// Once per owner of weights, before the first run_expert_gemm and outside any
// stream capture: kernel attributes for up to `local_experts` experts.
void prepare_expert_gemm(int64_t local_experts);

// plan: tiles/num_tiles (decode, simple) and offsets/local_experts (wgmma)
// filled; decode_weights: the fragment-layout copy, or null; pairs_bound: the
// most live pairs this forward can have (T * k, or the receive capacity).
void run_expert_gemm(const GroupedGemmPlan& plan, const MmaWeights* decode_weights, int64_t pairs_bound,
                     cudaStream_t stream);

}  // namespace nvfp4moe::cuda
