// Tensor maps for TMA copies (ptx/sm90_tma.cuh): the driver's
// cuTensorMapEncodeTiled, reached through the runtime's driver entry point so
// that the library does not link libcuda itself.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <initializer_list>

namespace nvfp4moe::cuda {

// A tiled map of a row-major tensor of `elem` (CU_TENSOR_MAP_DATA_TYPE_*):
// dims innermost first, strides in bytes of every dimension but the first
// (multiples of 16), box in elements (each <= 256; box[0] * element size a
// multiple of 16, <= 128 under the 128-byte swizzle). Out-of-bounds elements
// read as zero. Throws with the offending values when the driver refuses.
CUtensorMap make_tensor_map(CUtensorMapDataType elem, const void* base, std::initializer_list<uint64_t> dims,
                            std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box,
                            CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_NONE);

}  // namespace nvfp4moe::cuda
