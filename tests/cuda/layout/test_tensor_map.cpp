// make_tensor_map: its own argument check (host only) and the driver's
// refusal of a bad map, reported with the offending values (GPU machine).
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/layout/tensor_map.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

TEST(TensorMap, RejectsMismatchedRanksBeforeAnyDriverCall) {
  alignas(16) static uint8_t bytes[256] = {};
  EXPECT_ERROR_CONTAINS(make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT32, bytes, {16, 4}, {}, {16, 4}),
                        "rank 2 with 0 strides and 2 box sizes");
  EXPECT_ERROR_CONTAINS(make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT32, bytes, {16, 4}, {64}, {16}),
                        "rank 2 with 1 strides and 1 box sizes");
}

TEST(TensorMap, DriverRefusalNamesTheMap) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer<uint32_t> buf(64 * 64);
  // A valid 2-D map: 64 x 64 words, rows 256 bytes apart, boxes of 16 x 8.
  EXPECT_NO_THROW(make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT32, buf.get(), {64, 64}, {256}, {16, 8}));
  // Row stride 100 bytes: not a multiple of 16, which the driver refuses.
  EXPECT_ERROR_CONTAINS(make_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT32, buf.get(), {25, 64}, {100}, {16, 8}),
                        "cuTensorMapEncodeTiled failed", "strides {100}", "box {16,8}");
}

}  // namespace
}  // namespace nvfp4moe::cuda
