// make_tensor_map (see the header).
#include "cuda/layout/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <sstream>
#include <vector>

#include "cuda/cuda_check.hpp"

namespace nvfp4moe::cuda {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  // The driver's function pointer does not change in a process; looking it
  // up once per map would cost a driver call per launch.
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    NVFP4_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    NVFP4_CHECK(found == cudaDriverEntryPointSuccess && p != nullptr,
                "make_tensor_map: the driver has no cuTensorMapEncodeTiled (query result ", int(found), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

template <typename T>
std::string list(std::initializer_list<T> v) {
  std::ostringstream s;
  const char* sep = "{";
  for (const T& x : v) {
    s << sep << x;
    sep = ",";
  }
  s << "}";
  return s.str();
}

}  // namespace

CUtensorMap make_tensor_map(CUtensorMapDataType elem, const void* base, std::initializer_list<uint64_t> dims,
                            std::initializer_list<uint64_t> strides, std::initializer_list<uint32_t> box,
                            CUtensorMapSwizzle swizzle) {
  const uint32_t rank = uint32_t(dims.size());
  NVFP4_CHECK(rank >= 1 && rank <= 5 && box.size() == rank && strides.size() + 1 == rank,
              "make_tensor_map: rank ", rank, " with ", strides.size(), " strides and ", box.size(), " box sizes");
  const std::vector<cuuint64_t> d(dims.begin(), dims.end()), s(strides.begin(), strides.end());
  const std::vector<cuuint32_t> b(box.begin(), box.end()), unit(rank, 1);
  CUtensorMap map{};
  const CUresult r = encode_tiled()(&map, elem, rank, const_cast<void*>(base), d.data(), s.data(), b.data(),
                                    unit.data(), CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  NVFP4_CHECK(r == CUDA_SUCCESS, "make_tensor_map: cuTensorMapEncodeTiled failed (CUresult ", int(r), ") for base ",
              base, " dims ", list(dims), " strides ", list(strides), " box ", list(box), " swizzle ", int(swizzle));
  return map;
}

}  // namespace nvfp4moe::cuda
