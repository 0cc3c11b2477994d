// upload_fragment_weights: ExpertWeights' linear bytes -> the fragment layout of
// sm90_nvfp4_decode_gemm on the device (host packing in parallel batches of at
// most 1 GiB, so host memory stays bounded for 384 experts).
#include <algorithm>

#include "common/parallel.hpp"
#include "cuda/kernels/sm90_nvfp4_decode_gemm.hpp"

namespace nvfp4moe::cuda {

FragmentWeightsDevice upload_fragment_weights(Projection p, const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                                    int64_t count, int64_t hidden, int64_t inter) {
  FragmentWeightsDevice d;
  d.geometry = fragment_geometry(p, hidden, inter);
  const int64_t cper = d.geometry.code_bytes_per_expert(), sper = d.geometry.scale_bytes_per_expert();
  NVFP4_CHECK(count > 0 && int64_t(codes.size()) == count * cper && int64_t(scales.size()) == count * sper,
              "upload_fragment_weights: ", count, " experts need ", count * cper, " code and ", count * sper,
              " scale bytes, got ", codes.size(), " and ", scales.size());
  d.codes = DeviceBuffer<uint8_t>(size_t(count * cper));
  d.scales = DeviceBuffer<uint8_t>(size_t(count * sper));
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(count, (int64_t(1) << 30) / (cper + sper)));
  std::vector<uint8_t> hc(size_t(batch * cper)), hs(size_t(batch * sper));
  for (int64_t e0 = 0; e0 < count; e0 += batch) {
    const int64_t n = std::min(batch, count - e0);
    parallel_for(n, 1, [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i)
        pack_fragment_weights(p, codes.data() + (e0 + i) * cper, scales.data() + (e0 + i) * sper, hidden, inter,
                         hc.data() + i * cper, hs.data() + i * sper);
    });
    NVFP4_CUDA_CHECK(cudaMemcpy(d.codes.get() + e0 * cper, hc.data(), size_t(n * cper), cudaMemcpyHostToDevice));
    NVFP4_CUDA_CHECK(cudaMemcpy(d.scales.get() + e0 * sper, hs.data(), size_t(n * sper), cudaMemcpyHostToDevice));
  }
  return d;
}

}  // namespace nvfp4moe::cuda
