// Routed-expert weights on the device in a kernel layout, made from
// ExpertWeights' linear bytes (w13 [count, 2I, H/2] codes and [count, 2I, H/16]
// scales, or w2 [count, H, I/2] and [count, H, I/16]) by packing on the host in
// parallel batches of at most 1 GiB, so that host memory stays bounded for
// 384 experts, and uploading each batch.
#pragma once

#include <cstdint>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/layout/fragment_layout.hpp"
#include "cuda/layout/tile_layout.hpp"

namespace nvfp4moe::cuda {

// One projection of all local experts in the fragment layout (the decode and
// prefill kernels).
struct FragmentWeightsDevice {
  DeviceBuffer<uint8_t> codes, scales;
  FragmentGeometry geometry;
  FragmentWeights view() const { return FragmentWeights{codes.get(), scales.get(), geometry}; }
};
FragmentWeightsDevice upload_fragment_weights(Projection p, const std::vector<uint8_t>& codes,
                                              const std::vector<uint8_t>& scales, int64_t count, int64_t hidden,
                                              int64_t intermediate);

// One projection of all local experts in the tile layout (the reference
// grouped GEMM): count x packed_geometry(p, H, I).bytes_per_expert() bytes.
DeviceBuffer<uint8_t> upload_tile_weights(Projection p, const std::vector<uint8_t>& codes,
                                          const std::vector<uint8_t>& scales, int64_t count, int64_t hidden,
                                          int64_t intermediate);

}  // namespace nvfp4moe::cuda
