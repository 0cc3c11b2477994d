// sm90_nvfp4_decode_gemm: the decode (memory-bound) grouped NVFP4 GEMM.
//
// Same contract as grouped_gemm_ref (its GroupedGemmPlan: work list,
// activation rows, fused SwiGLU / routing-weight epilogues), different
// machinery, built to stream the weights at HBM speed when each expert sees
// few tokens:
//   * weights in the fragment layout (fragment_layout.hpp), loaded
//     straight from global memory into registers, 16 bytes per lane, one
//     stage (4 fragments per lane) in flight ahead of the math — no shared
//     memory on the weight path; a unit's last stage prefetches the next
//     unit's first, so the stream never drains between units; items of 2+
//     n8 token tiles fetch their activations a stage ahead as well (cp.async
//     into a per-lane shared-memory ring);
//   * dequantization in registers: 11 integer ops per 8 codes plus one BF16
//     multiply per 2 values (exact: value(q) * s fits BF16);
//   * mma.sync m16n8k16 with the weights as the 16-row A operand and 8
//     tokens as N ("swap AB"), kNTiles n8 tiles per item;
//   * a persistent grid over items (m-tile group, work tile; token groups
//     inside); the 4 warps of a CTA split K and reduce through shared memory,
//     so even one active expert spreads over every SM without atomics, and
//     the epilogue (SwiGLU / routing weight) is spread over the 4 warps.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <ostream>

#include "cuda/layout/fragment_layout.hpp"
#include "cuda/layout/grouped_gemm_plan.hpp"

namespace nvfp4moe::cuda {

struct Sm90DecodeGemmConfig {
  int n_tiles = 1;  // n8 token tiles per item (1, 2 or 4)
  int m_tiles = 1;  // m16 weight tiles per item sharing the activation loads (1 or 2)
  int grid = 0;     // persistent CTAs (0: sm_count x resident CTAs per SM)
};
std::ostream& operator<<(std::ostream& os, const Sm90DecodeGemmConfig& c);

// K (chunks) must split over 4 warps in whole stages: K % 1024 == 0.
bool sm90_nvfp4_decode_gemm_supports(const FragmentGeometry& g);

// Whether a layer can use the kernel: both projections' K split over 4 warps
// (H % 1024 == 0 and I % 1024 == 0).
bool sm90_nvfp4_decode_fits(const FragmentGeometry& gate_up, const FragmentGeometry& down);

// Heuristic: token tiles from the average tokens per local expert
// (pairs / local_experts), m-tiles per item from the same (activation reuse
// vs. enough items to fill every SM). NVFP4MOE_PRINT_CONFIG=1 prints it.
Sm90DecodeGemmConfig sm90_nvfp4_decode_gemm_config(int64_t pairs, int64_t local_experts);

// Queues the GEMM of `plan` (its weights/geometry fields are ignored; `w`
// is used instead). No host synchronisation; capturable in a CUDA graph.
void sm90_nvfp4_decode_gemm(const GroupedGemmPlan& plan, const FragmentWeights& w, const Sm90DecodeGemmConfig& cfg,
                         cudaStream_t stream);

}  // namespace nvfp4moe::cuda
