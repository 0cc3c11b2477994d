// upload_fragment_weights and upload_tile_weights (see weight_upload.hpp).
#include "cuda/layout/weight_upload.hpp"

#include <algorithm>

#include "common/parallel.hpp"

namespace nvfp4moe::cuda {

namespace {

// Packs `count` experts into dst (per_expert[i] bytes for output i) in
// batches of at most 1 GiB of host memory: pack(e, out[i]) writes expert e's
// bytes of output i.
template <size_t N, typename Pack>
void upload_batched(int64_t count, const int64_t (&per_expert)[N], uint8_t* const (&dst)[N], Pack&& pack) {
  int64_t per = 0;
  for (int64_t p : per_expert) per += p;
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(count, (int64_t(1) << 30) / std::max<int64_t>(1, per)));
  std::vector<uint8_t> host[N];
  for (size_t i = 0; i < N; ++i) host[i].resize(size_t(batch * per_expert[i]));
  for (int64_t e0 = 0; e0 < count; e0 += batch) {
    const int64_t n = std::min(batch, count - e0);
    parallel_for(n, 1, [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) {
        uint8_t* out[N];
        for (size_t j = 0; j < N; ++j) out[j] = host[j].data() + i * per_expert[j];
        pack(e0 + i, out);
      }
    });
    for (size_t j = 0; j < N; ++j)
      NVFP4_CUDA_CHECK(cudaMemcpy(dst[j] + e0 * per_expert[j], host[j].data(), size_t(n * per_expert[j]),
                                  cudaMemcpyHostToDevice));
  }
}

// Linear bytes per expert of one projection: codes, scales.
struct LinearSizes {
  int64_t codes, scales;
};
LinearSizes linear_sizes(Projection p, int64_t hidden, int64_t inter) {
  const int64_t n = p == Projection::GateUp ? 2 * inter : hidden, k = p == Projection::GateUp ? hidden : inter;
  return {n * k / 2, n * k / 16};
}

void check_linear(const char* who, Projection p, const std::vector<uint8_t>& codes, const std::vector<uint8_t>& scales,
                  int64_t count, int64_t hidden, int64_t inter) {
  const LinearSizes l = linear_sizes(p, hidden, inter);
  NVFP4_CHECK(count > 0 && int64_t(codes.size()) == count * l.codes && int64_t(scales.size()) == count * l.scales,
              who, ": ", count, " experts (", p == Projection::GateUp ? "gate/up" : "down", ", H=", hidden, " I=",
              inter, ") need ", count * l.codes, " code and ", count * l.scales, " scale bytes, got ", codes.size(),
              " and ", scales.size());
}

}  // namespace

FragmentWeightsDevice upload_fragment_weights(Projection p, const std::vector<uint8_t>& codes,
                                              const std::vector<uint8_t>& scales, int64_t count, int64_t hidden,
                                              int64_t inter) {
  check_linear("upload_fragment_weights", p, codes, scales, count, hidden, inter);
  const LinearSizes l = linear_sizes(p, hidden, inter);
  FragmentWeightsDevice d;
  d.geometry = fragment_geometry(p, hidden, inter);
  const int64_t per[2] = {d.geometry.code_bytes_per_expert(), d.geometry.scale_bytes_per_expert()};
  d.codes = DeviceBuffer<uint8_t>(size_t(count * per[0]));
  d.scales = DeviceBuffer<uint8_t>(size_t(count * per[1]));
  uint8_t* const dst[2] = {d.codes.get(), d.scales.get()};
  upload_batched(count, per, dst, [&](int64_t e, uint8_t* const (&out)[2]) {
    pack_fragment_weights(p, codes.data() + e * l.codes, scales.data() + e * l.scales, hidden, inter, out[0], out[1]);
  });
  return d;
}

DeviceBuffer<uint8_t> upload_tile_weights(Projection p, const std::vector<uint8_t>& codes,
                                          const std::vector<uint8_t>& scales, int64_t count, int64_t hidden,
                                          int64_t inter) {
  check_linear("upload_tile_weights", p, codes, scales, count, hidden, inter);
  const LinearSizes l = linear_sizes(p, hidden, inter);
  const int64_t per[1] = {packed_geometry(p, hidden, inter).bytes_per_expert()};
  DeviceBuffer<uint8_t> d(size_t(count * per[0]));
  uint8_t* const dst[1] = {d.get()};
  upload_batched(count, per, dst, [&](int64_t e, uint8_t* const (&out)[1]) {
    pack_expert_weights(p, codes.data() + e * l.codes, scales.data() + e * l.scales, hidden, inter, out[0]);
  });
  return d;
}

}  // namespace nvfp4moe::cuda
