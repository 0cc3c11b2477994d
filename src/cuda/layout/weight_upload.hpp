// Routed-expert weights on the device in a kernel layout, made from
// ExpertWeights' linear bytes (w13 [count, 2I, H/2] codes and [count, 2I, H/B]
// scales, or w2 [count, H, I/2] and [count, H, I/B]; B = 16 for NVFP4, 32 for
// MXFP4) by encoding the scales as multiplier bytes (scale_multiplier.hpp) and packing on the host in
// parallel batches of at most 1 GiB, so that host memory stays bounded for
// 384 experts, and uploading each batch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/layout/fragment_layout.hpp"
#include "cuda/layout/scale_multiplier.hpp"
#include "cuda/layout/tile_layout.hpp"

namespace nvfp4moe::cuda {

// One projection of all local experts in ExpertWeights' linear layout.
struct LinearExperts {
  ExpertFormat format = ExpertFormat::Nvfp4;
  Projection projection = Projection::GateUp;
  const std::vector<uint8_t>* codes = nullptr;   // [count, N, K/2]
  const std::vector<uint8_t>* scales = nullptr;  // [count, N, K/16] UE4M3 or [count, N, K/32] UE8M0
  int64_t count = 0, first_expert = 0, hidden = 0, inter = 0;
  // Expert e (local) as encode_weight_scales takes it.
  LinearExpertProjection expert(int64_t e) const;
};

// One expert: encode_weight_scales, then the layout's byte permutation
// (mx_factors: the MXFP4 row groups' factors, GateUp 2, Down 1; untouched
// for NVFP4). Upload and tests go through these.
void pack_fragment_expert(const LinearExpertProjection& w, uint8_t* out_codes, uint8_t* out_scales,
                          float* mx_factors);
void pack_tile_expert(const LinearExpertProjection& w, uint8_t* out, float* mx_factors);

// One projection of all local experts in the fragment layout (the decode
// and prefill kernels); MXFP4: the row groups' factors ([count, 2] or
// [count]) into *mx_factors.
// With fp8_rows asked for, also the FP8 form's row exponents of every expert
// (fp8_operand.hpp's fp8_weight_rows), or, when some expert has none, no
// exponents and the reason in fp8_refusal.
struct FragmentWeightsDevice {
  DeviceBuffer<uint8_t> codes, scales;
  DeviceBuffer<int8_t> fp8_rows;  // [count][m_tiles * 16], or empty
  std::string fp8_refusal;
  FragmentGeometry geometry;
  FragmentWeights view() const {
    return FragmentWeights{codes.get(), scales.get(), geometry, fp8_rows.size() ? fp8_rows.get() : nullptr};
  }
};
FragmentWeightsDevice upload_fragment_weights(const LinearExperts& w, std::vector<float>* mx_factors,
                                              bool fp8_rows = false);

// One projection of all local experts in the tile layout (the reference
// grouped GEMM): count x packed_geometry(p, H, I).bytes_per_expert() bytes.
DeviceBuffer<uint8_t> upload_tile_weights(const LinearExperts& w, std::vector<float>* mx_factors);

}  // namespace nvfp4moe::cuda
