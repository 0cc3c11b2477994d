// DeviceQuantizer (see device_quantizer.hpp).
#include "cuda/backend/device_quantizer.hpp"

#include <cstring>
#include <vector>

#include "cuda/kernels/staging.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

template <typename T>
void grow(DeviceBuffer<T>& b, size_t n) {
  if (b.size() < n) b = DeviceBuffer<T>(n);
}

// Checked before any member touches the driver.
int usable_device(int device) {
  NVFP4_CHECK(cuda_available(), "quantize on cuda: no CUDA device is available");
  return device;
}

}  // namespace

DeviceQuantizer::DeviceQuantizer(int device) : device_(usable_device(device)) {}

// On the quantizer's stream: the stream is non-blocking, so a copy on the
// legacy default stream would not be ordered before its kernels (a pageable
// cudaMemcpy returns once the bytes are staged, not once they have landed).
void DeviceQuantizer::upload(const TensorInfo& t) {
  if (t.name == x_name_ && t.data == x_src_) return;
  const int64_t n = t.numel();
  DeviceGuard guard(device_);
  x_bf16_ = t.dtype == DType::BF16;
  if (x_bf16_) {
    grow(x_, size_t(n) * 2);
    x_.upload(static_cast<const uint8_t*>(t.data), size_t(n) * 2, stream_.get());
  } else {
    const std::vector<float> f = t.to_f32();  // F16 exactly, F64 rounded (beyond F32's range: Inf, refused)
    grow(x_, size_t(n) * 4);
    x_.upload(reinterpret_cast<const uint8_t*>(f.data()), size_t(n) * 4, stream_.get());
    NVFP4_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));  // f is freed on return
  }
  x_name_ = t.name;
  x_src_ = t.data;
  x_amax_.reset();
}

float DeviceQuantizer::amax(const TensorInfo& t) {
  NVFP4_CHECK(t.shape.size() == 2, "tensor \"", t.name, "\": quantize takes 2-D tensors, got ", t.shape.size(), "-D");
  upload(t);
  if (x_amax_) return *x_amax_;  // the plan asks first, quantize then checks the same tensor
  DeviceGuard guard(device_);
  tensor_abs_max(x_.get(), x_bf16_, t.numel(), amax_.get(), stream_.get());
  unsigned bits = 0;
  NVFP4_CUDA_CHECK(cudaMemcpyAsync(&bits, amax_.get(), sizeof bits, cudaMemcpyDeviceToHost, stream_.get()));
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  const float a = fmt::bits_to_float(bits);
  NVFP4_CHECK(fmt::is_finite(a), "tensor \"", t.name, "\" holds NaN or Inf; NVFP4 weights must be finite");
  x_amax_ = a;
  return a;
}

Nvfp4Matrix DeviceQuantizer::quantize(const TensorInfo& t, float g) {
  NVFP4_CHECK(t.shape.size() == 2 && t.shape[1] % 16 == 0, "tensor \"", t.name, "\": quantize needs [N, K] with K a "
              "multiple of 16");
  amax(t);  // uploads t and refuses NaN / Inf, as the host quantizer does
  const int64_t N = t.shape[0], K = t.shape[1];
  DeviceGuard guard(device_);
  grow(codes_, size_t(N * K / 2));
  grow(scales_, size_t(N * K / 16));
  grow(g_rows_, size_t(N));
  QuantizeActArgs q;
  q.x = x_.get();
  q.x_is_bf16 = x_bf16_;
  q.rows = N;
  q.cols = K;
  q.scope = ActScope::Static;
  q.static_g = g;
  q.g_out = g_rows_.get();
  q.codes = codes_.get();
  q.scales_linear = scales_.get();
  stage_activations(q, stream_.get());
  Nvfp4Matrix m;
  m.rows = N;
  m.cols = K;
  m.scope = ScaleScope::Static;
  m.global_scale = {g};
  m.codes.resize(size_t(N * K / 2));
  m.scales.resize(size_t(N * K / 16));
  NVFP4_CUDA_CHECK(cudaMemcpyAsync(m.codes.data(), codes_.get(), m.codes.size(), cudaMemcpyDeviceToHost, stream_.get()));
  NVFP4_CUDA_CHECK(
      cudaMemcpyAsync(m.scales.data(), scales_.get(), m.scales.size(), cudaMemcpyDeviceToHost, stream_.get()));
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return m;
}

}  // namespace nvfp4moe::cuda
