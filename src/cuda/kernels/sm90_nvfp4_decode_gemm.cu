// sm90_nvfp4_decode_gemm: launcher and heuristic (kernel in the .cuh).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "cuda/cuda_check.hpp"
#include "cuda/dependent_launch.hpp"
#include "cuda/kernels/sm90_nvfp4_decode_gemm.cuh"

namespace nvfp4moe::cuda {

namespace {

using mma_gemm::kThreads;
using mma_gemm::kWarps;

// Resident CTAs per SM each instantiation is compiled for (register budget).
template <int kNTiles, int kMTiles>
constexpr int min_blocks() {
  return kNTiles * kMTiles >= 8 ? 2 : (kNTiles * kMTiles >= 4 ? 3 : 4);
}

template <Projection P, int kNTiles, int kMTiles>
void launch(const Sm90DecodeGemmParams& params, int grid_hint, cudaStream_t stream) {
  auto kernel = sm90_nvfp4_decode_gemm_kernel<P, kNTiles, kMTiles, min_blocks<kNTiles, kMTiles>()>;
  constexpr size_t smem = act_ring_bytes<kNTiles, kMTiles>();
  allow_smem_at_least(kernel, smem);  // past 48 KB for the wider items
  const int64_t items_max = (params.w.geometry.m_tiles / kMTiles) * params.plan.max_tiles;
  int64_t grid = grid_hint > 0 ? grid_hint : resident_ctas(kernel, kThreads, smem);
  grid = std::max<int64_t>(1, std::min(grid, items_max));
  launch_dependent(kernel, dim3(unsigned(grid)), dim3(kThreads), smem, stream, params.plan.overlap_previous, params);
}

template <Projection P>
void dispatch(const Sm90DecodeGemmParams& params, const Sm90DecodeGemmConfig& cfg, cudaStream_t stream) {
  if (cfg.n_tiles == 1 && cfg.m_tiles == 1) return launch<P, 1, 1>(params, cfg.grid, stream);
  if (cfg.n_tiles == 2 && cfg.m_tiles == 1) return launch<P, 2, 1>(params, cfg.grid, stream);
  if (cfg.n_tiles == 4 && cfg.m_tiles == 1) return launch<P, 4, 1>(params, cfg.grid, stream);
  if (cfg.n_tiles == 1 && cfg.m_tiles == 2) return launch<P, 1, 2>(params, cfg.grid, stream);
  if (cfg.n_tiles == 2 && cfg.m_tiles == 2) return launch<P, 2, 2>(params, cfg.grid, stream);
  if (cfg.n_tiles == 4 && cfg.m_tiles == 2) return launch<P, 4, 2>(params, cfg.grid, stream);
  NVFP4_FAIL("sm90_nvfp4_decode_gemm: no kernel for n_tiles=", cfg.n_tiles, " m_tiles=", cfg.m_tiles,
             " (have n x m in 1x1, 2x1, 4x1, 1x2, 2x2, 4x2)");
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Sm90DecodeGemmConfig& c) {
  return os << "Sm90DecodeGemmConfig{n_tiles=" << c.n_tiles << ", m_tiles=" << c.m_tiles << ", grid=" << c.grid << "}";
}

bool sm90_nvfp4_decode_gemm_supports(const FragmentGeometry& g) {
  return g.m_tiles > 0 && g.k_chunks > 0 && g.k_chunks % (kWarps * 4) == 0;
}

bool sm90_nvfp4_decode_fits(const FragmentGeometry& gate_up, const FragmentGeometry& down) {
  return sm90_nvfp4_decode_gemm_supports(gate_up) && sm90_nvfp4_decode_gemm_supports(down);
}

Sm90DecodeGemmConfig sm90_nvfp4_decode_gemm_config(int64_t pairs, int64_t local_experts) {
  const double per_expert = double(pairs) / double(std::max<int64_t>(1, local_experts));
  Sm90DecodeGemmConfig c;
  // NOTES (measured on the H200): well under one token per expert wants the
  // smallest item (most items to spread over 132 SMs); from about 0.75, two
  // m-tiles per item halve the per-item overhead (EP1 T=64, 1.0 per expert:
  // 1x2 13 % faster than 1x1; EP8 T=8, also 1.0: a tie); from ~8 two m-tiles
  // share every activation load, which beats wider token groups.
  if (per_expert <= 0.75) {
    c.n_tiles = 1;
  } else if (per_expert <= 3) {
    c.n_tiles = 1;
    c.m_tiles = 2;
  } else if (per_expert <= 16) {
    c.n_tiles = 2;
    c.m_tiles = 2;
  } else {
    c.n_tiles = 4;
    c.m_tiles = 2;
  }
  if (const char* e = std::getenv("NVFP4MOE_PRINT_CONFIG"); e && *e == '1') {
    std::ostringstream os;
    os << c;
    std::fprintf(stderr, "sm90_nvfp4_decode_gemm: pairs=%lld experts=%lld -> %s\n", (long long)pairs,
                 (long long)local_experts, os.str().c_str());
  }
  return c;
}

void sm90_nvfp4_decode_gemm(const GroupedGemmPlan& p, const FragmentWeights& w, const Sm90DecodeGemmConfig& cfg,
                         cudaStream_t stream) {
  const FragmentGeometry& g = w.geometry;
  NVFP4_CHECK(w.codes && w.scales, "sm90_nvfp4_decode_gemm: weights (codes, scales) are null");
  NVFP4_CHECK(sm90_nvfp4_decode_gemm_supports(g), "sm90_nvfp4_decode_gemm: K must be a multiple of ",
              kWarps * 4 * kMmaChunkK, ", got K=", g.k_chunks * kMmaChunkK);
  NVFP4_CHECK(g.m_tiles % cfg.m_tiles == 0, "sm90_nvfp4_decode_gemm: ", g.m_tiles, " m-tiles do not split into items of ",
              cfg.m_tiles);
  const int64_t rows = p.projection == Projection::GateUp ? g.m_tiles * 8 : g.m_tiles * kMmaTileRows;
  NVFP4_CHECK(rows == p.n_valid, "sm90_nvfp4_decode_gemm: weights hold ", rows, " output rows, plan wants n_valid=",
              p.n_valid);
  NVFP4_CHECK(p.act && p.act_g && p.pair_of_pos && p.tiles && p.num_tiles && p.w_global,
              "sm90_nvfp4_decode_gemm: plan is missing an operand (act, act_g, pair_of_pos, tiles, num_tiles, w_global)");
  NVFP4_CHECK(p.ld_act >= g.k_chunks * kMmaChunkK && p.ld_act % 8 == 0, "sm90_nvfp4_decode_gemm: operand row stride ",
              p.ld_act, " must be a multiple of 8 and >= K=", g.k_chunks * kMmaChunkK);
  if (p.max_tiles == 0) return;
  const Sm90DecodeGemmParams params{p, w};
  if (p.projection == Projection::GateUp) {
    NVFP4_CHECK(p.h_out && p.ld_h >= p.n_valid, "sm90_nvfp4_decode_gemm (gate/up): h output missing or ld_h ", p.ld_h,
                " < I=", p.n_valid);
    NVFP4_CHECK(p.top_k > 0, "sm90_nvfp4_decode_gemm (gate/up): top_k must be positive, got ", p.top_k);
    dispatch<Projection::GateUp>(params, cfg, stream);
  } else {
    NVFP4_CHECK(p.y_pair.given() && p.topk_weights, "sm90_nvfp4_decode_gemm (down): y_pair and topk_weights are required");
    dispatch<Projection::Down>(params, cfg, stream);
  }
}

}  // namespace nvfp4moe::cuda
