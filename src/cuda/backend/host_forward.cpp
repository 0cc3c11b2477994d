// cuda_forward_host: the device side of MoeLayer::forward_host (see
// moe/backend.hpp). Every buffer holds at least one element, so that a rank
// of an expert-parallel layer with no tokens still takes part in the
// collective with valid pointers.
#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "moe/backend.hpp"

namespace nvfp4moe {

namespace {

template <typename T>
cuda::DeviceBuffer<T> upload(std::span<const T> v, cudaStream_t s) {
  cuda::DeviceBuffer<T> d(std::max<size_t>(1, v.size()));
  d.upload(v.data(), v.size(), s);
  return d;
}

}  // namespace

void cuda_forward_host(MoeLayer& layer, const HostBatch& b, HostResult& r) {
  const int dev = layer.device_index();
  cuda::DeviceGuard guard(dev);
  const int64_t T = b.tokens, H = layer.config().hidden, k = layer.config().top_k;
  cuda::CudaStream stream;
  const cudaStream_t s = stream.get();
  cuda::DeviceBuffer<float> dx = upload(b.x, s), dw, dwo(std::max<size_t>(1, r.topk_weights.size()));
  cuda::DeviceBuffer<int32_t> di, dt, dio(std::max<size_t>(1, r.topk_ids.size()));
  cuda::DeviceBuffer<uint16_t> dy(std::max<size_t>(1, r.y.size()));
  RoutingArgs routing;
  if (b.topk_ids) {
    di = upload(*b.topk_ids, s);
    dw = upload(*b.topk_weights, s);
    routing.topk_ids = make_view(di.get(), DType::I32, {T, k}, DeviceKind::Cuda, dev);
    routing.topk_weights = make_view(dw.get(), DType::F32, {T, k}, DeviceKind::Cuda, dev);
  }
  if (b.token_ids) {
    dt = upload(*b.token_ids, s);
    routing.token_ids = make_view(dt.get(), DType::I32, {T}, DeviceKind::Cuda, dev);
  }
  ForwardOutputs out;
  out.y = make_view(dy.get(), DType::BF16, {T, H}, DeviceKind::Cuda, dev);
  out.topk_ids = make_view(dio.get(), DType::I32, {T, k}, DeviceKind::Cuda, dev);
  out.topk_weights = make_view(dwo.get(), DType::F32, {T, k}, DeviceKind::Cuda, dev);
  layer.forward(make_view(dx.get(), DType::F32, {T, H}, DeviceKind::Cuda, dev), routing, out,
                ForwardOptions{.stream = s});
  std::vector<uint16_t> y(r.y.size());
  dy.download(y.data(), y.size(), s);
  dio.download(r.topk_ids.data(), r.topk_ids.size(), s);
  dwo.download(r.topk_weights.data(), r.topk_weights.size(), s);
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(s));
  layer.sync_errors();  // a synchronising call reports what the device recorded
  for (size_t i = 0; i < y.size(); ++i) r.y[i] = bf16_to_float(Bf16{y[i]});
}

}  // namespace nvfp4moe
