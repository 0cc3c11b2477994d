// make_synthetic_moe_cuda (nvfp4moe/moe.hpp): the synthetic layer's routed
// experts drawn on the GPU (moe/synthetic_stream.hpp, one element per
// thread) and quantized there by the activation staging's per-tensor path
// (kernels/staging.hpp: the host quantizer's bytes), one tensor at a time
// into a device buffer of one expert's FP32 weights; the codes, scales and
// global scales are copied into the host arrays of the layer shell
// (moe/synthetic_layer.hpp), which builds everything else on the host.
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/staging.hpp"
#include "moe/synthetic_layer.hpp"
#include "moe/synthetic_stream.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

namespace {

// out[r, c] = synthetic_value of row r's stream, for a [rows, cols] tensor.
__global__ void synthetic_tensor_kernel(float* out, int64_t rows, int64_t cols, float stddev, uint64_t seed,
                                        uint64_t tag, int64_t expert) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = synthetic_value(synthetic_row_key(seed, tag, expert, r), c, cols, stddev);
  }
}

// Scratch of one tensor's generation and quantization on the device.
struct TensorScratch {
  cuda::DeviceBuffer<float> x, g;
  cuda::DeviceBuffer<uint8_t> codes, scales;
  cuda::DeviceBuffer<unsigned> amax{1};
  explicit TensorScratch(int64_t elems, int64_t rows)
      : x(size_t(elems)), g(size_t(rows)), codes(size_t(elems / 2)), scales(size_t(elems / 16)) {}
};

// Draws tensor (tag, expert) [rows, cols], quantizes it per tensor and
// copies its codes, block scales and g to the host.
void draw_and_quantize(TensorScratch& s, int64_t rows, int64_t cols, uint64_t seed, uint64_t tag, int64_t expert,
                       uint8_t* codes, uint8_t* scales, float* g, cudaStream_t stream) {
  const int64_t n = rows * cols;
  const unsigned blocks = unsigned(std::min<int64_t>(cuda::ceil_div(n, 256), 132 * 16));
  synthetic_tensor_kernel<<<blocks, 256, 0, stream>>>(s.x.get(), rows, cols, 1.0f / std::sqrt(float(cols)), seed,
                                                       tag, expert);
  NVFP4_CUDA_CHECK_LAUNCH("synthetic_tensor_kernel");
  cuda::QuantizeActArgs q;
  q.x = s.x.get();
  q.rows = rows;
  q.cols = cols;
  q.scope = cuda::ActScope::PerTensor;
  q.amax_scratch = s.amax.get();
  q.g_out = s.g.get();
  q.codes = s.codes.get();
  q.scales_linear = s.scales.get();
  cuda::stage_activations(q, stream);
  NVFP4_CUDA_CHECK(cudaMemcpyAsync(codes, s.codes.get(), size_t(n / 2), cudaMemcpyDeviceToHost, stream));
  NVFP4_CUDA_CHECK(cudaMemcpyAsync(scales, s.scales.get(), size_t(n / 16), cudaMemcpyDeviceToHost, stream));
  NVFP4_CUDA_CHECK(cudaMemcpyAsync(g, s.g.get(), sizeof(float), cudaMemcpyDeviceToHost, stream));
  NVFP4_CUDA_CHECK(cudaStreamSynchronize(stream));  // the scratch is reused by the next tensor
}

}  // namespace

MoeWeights make_synthetic_moe_cuda(const MoeConfig& cfg, uint64_t seed) {
  NVFP4_CHECK(cuda_available(), "make_synthetic_moe_cuda: no CUDA device is available");
  MoeWeights w = synthetic_layer_shell(cfg, seed);
  const int64_t H = cfg.hidden, I = cfg.intermediate;
  ExpertWeights& x = w.experts;
  TensorScratch s(I * H, std::max(I, H));
  cuda::CudaStream stream;
  for (int64_t e = 0; e < cfg.experts; ++e) {
    const int64_t gate = e * 2 * I * H, up = gate + I * H, down = e * H * I;
    draw_and_quantize(s, I, H, seed, kSynW1, e, x.w13_codes.data() + gate / 2, x.w13_scales.data() + gate / 16,
                      &x.w13_global[size_t(2 * e)], stream.get());
    draw_and_quantize(s, I, H, seed, kSynW3, e, x.w13_codes.data() + up / 2, x.w13_scales.data() + up / 16,
                      &x.w13_global[size_t(2 * e + 1)], stream.get());
    draw_and_quantize(s, H, I, seed, kSynW2, e, x.w2_codes.data() + down / 2, x.w2_scales.data() + down / 16,
                      &x.w2_global[size_t(e)], stream.get());
  }
  return w;
}

}  // namespace nvfp4moe
