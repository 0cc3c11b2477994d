// upload_fragment_weights and upload_tile_weights (see weight_upload.hpp).
#include "cuda/layout/weight_upload.hpp"

#include <algorithm>
#include <mutex>

#include "common/parallel.hpp"
#include "cuda/layout/fp8_operand.hpp"

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
      if (per_expert[j] > 0)  // an output not asked for
        NVFP4_CUDA_CHECK(cudaMemcpy(dst[j] + e0 * per_expert[j], host[j].data(), size_t(n * per_expert[j]),
                                    cudaMemcpyHostToDevice));
  }
}

// Linear bytes per expert of one projection: codes, scales; N, K.
struct LinearSizes {
  int64_t codes, scales, n, k;
};
LinearSizes linear_sizes(ExpertFormat f, Projection p, int64_t hidden, int64_t inter) {
  const int64_t n = p == Projection::GateUp ? 2 * inter : hidden, k = p == Projection::GateUp ? hidden : inter;
  return {n * k / 2, n * k / (f == ExpertFormat::Mxfp4 ? 32 : 16), n, k};
}

void check_linear(const char* who, const LinearExperts& w) {
  NVFP4_CHECK(w.codes && w.scales, who, ": no weights");
  const LinearSizes l = linear_sizes(w.format, w.projection, w.hidden, w.inter);
  NVFP4_CHECK(w.count > 0 && int64_t(w.codes->size()) == w.count * l.codes &&
                  int64_t(w.scales->size()) == w.count * l.scales,
              who, ": ", w.count, " ", expert_format_name(w.format), " experts (",
              w.projection == Projection::GateUp ? "gate/up" : "down", ", H=", w.hidden, " I=", w.inter, ") need ",
              w.count * l.codes, " code and ", w.count * l.scales, " scale bytes, got ", w.codes->size(), " and ",
              w.scales->size());
}

// Factors per expert of one projection's row groups.
int64_t factor_groups(Projection p) { return p == Projection::GateUp ? 2 : 1; }

// encode_weight_scales into scratch: (codes with zero blocks cleared, multiplier bytes).
struct Encoded {
  std::vector<uint8_t> codes, mult;
};
Encoded encode(const LinearExpertProjection& w, float* mx_factors) {
  const LinearSizes l = linear_sizes(w.format, w.projection, w.hidden, w.inter);
  Encoded e{std::vector<uint8_t>(w.codes, w.codes + l.codes), std::vector<uint8_t>(size_t(l.n * l.k / 16))};
  float unused[2];
  encode_weight_scales(w, e.codes.data(), e.mult.data(), mx_factors ? mx_factors : unused);
  return e;
}

void resize_factors(const LinearExperts& w, std::vector<float>* f) {
  if (f) f->assign(size_t(w.count * factor_groups(w.projection)), 1.0f);
}
float* factors_of(const LinearExperts& w, std::vector<float>* f, int64_t e) {
  return f ? f->data() + e * factor_groups(w.projection) : nullptr;
}

}  // namespace

LinearExpertProjection LinearExperts::expert(int64_t e) const {
  const LinearSizes l = linear_sizes(format, projection, hidden, inter);
  return LinearExpertProjection{.format = format,
                                .projection = projection,
                                .hidden = hidden,
                                .inter = inter,
                                .codes = codes->data() + e * l.codes,
                                .scales = scales->data() + e * l.scales,
                                .expert = first_expert + e};
}

void pack_fragment_expert(const LinearExpertProjection& w, uint8_t* out_codes, uint8_t* out_scales,
                          float* mx_factors) {
  const Encoded e = encode(w, mx_factors);
  pack_fragment_weights(w.projection, e.codes.data(), e.mult.data(), w.hidden, w.inter, out_codes, out_scales,
                        w.format);
}

void pack_tile_expert(const LinearExpertProjection& w, uint8_t* out, float* mx_factors) {
  const Encoded e = encode(w, mx_factors);
  pack_expert_weights(w.projection, e.codes.data(), e.mult.data(), w.hidden, w.inter, out);
}

FragmentWeightsDevice upload_fragment_weights(const LinearExperts& w, std::vector<float>* mx_factors, bool fp8_rows) {
  check_linear("upload_fragment_weights", w);
  std::vector<float> own_factors;  // the FP8 rows need the factors even when the caller does not
  std::vector<float>* factors = mx_factors ? mx_factors : (fp8_rows ? &own_factors : nullptr);
  resize_factors(w, factors);
  FragmentWeightsDevice d;
  d.geometry = fragment_geometry(w.projection, w.hidden, w.inter, w.format);
  // Codes, scales and (when asked for) the FP8 row exponents of each expert.
  const int64_t per[3] = {d.geometry.code_bytes_per_expert(), d.geometry.scale_bytes_per_expert(),
                          fp8_rows ? d.geometry.m_tiles * kMmaTileRows : 0};
  d.codes = DeviceBuffer<uint8_t>(size_t(w.count * per[0]));
  d.scales = DeviceBuffer<uint8_t>(size_t(w.count * per[1]));
  d.fp8_rows = DeviceBuffer<int8_t>(size_t(w.count * per[2]));
  uint8_t* const dst[3] = {d.codes.get(), d.scales.get(), reinterpret_cast<uint8_t*>(d.fp8_rows.get())};
  std::mutex mu;
  int64_t refused = -1;  // the lowest expert without FP8 rows
  upload_batched(w.count, per, dst, [&](int64_t e, uint8_t* const (&out)[3]) {
    float* f = factors_of(w, factors, e);
    pack_fragment_expert(w.expert(e), out[0], out[1], f);
    if (!fp8_rows) return;
    std::string why;
    if (fp8_weight_rows(w.expert(e), f, reinterpret_cast<int8_t*>(out[2]), &why)) return;
    const std::lock_guard<std::mutex> lock(mu);
    if (refused < 0 || e < refused) {
      refused = e;
      d.fp8_refusal = why;
    }
  });
  if (refused >= 0) d.fp8_rows = DeviceBuffer<int8_t>();
  return d;
}

DeviceBuffer<uint8_t> upload_tile_weights(const LinearExperts& w, std::vector<float>* mx_factors) {
  check_linear("upload_tile_weights", w);
  resize_factors(w, mx_factors);
  const int64_t per[1] = {packed_geometry(w.projection, w.hidden, w.inter).bytes_per_expert()};
  DeviceBuffer<uint8_t> d(size_t(w.count * per[0]));
  uint8_t* const dst[1] = {d.get()};
  upload_batched(w.count, per, dst, [&](int64_t e, uint8_t* const (&out)[1]) {
    pack_tile_expert(w.expert(e), out[0], factors_of(w, mx_factors, e));
  });
  return d;
}

}  // namespace nvfp4moe::cuda
