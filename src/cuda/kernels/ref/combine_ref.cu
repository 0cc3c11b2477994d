// combine_slots_ref (see ref/combine_ref.hpp).
#include "cuda/cuda_check.hpp"
#include "cuda/kernels/ref/combine_ref.hpp"

namespace nvfp4moe::cuda {

namespace {

constexpr int kThreads = 256;

// Scalar reference: one element per thread. Used when rows are not 16-byte
// aligned or H % 4 != 0, and by the tests as the reference of the vector kernel.
__global__ void combine_ref_kernel(CombineArgs a) {
  const int64_t t = blockIdx.y;
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= a.hidden) return;
  float sum = 0.0f;
  for (int j = 0; j < a.top_k; ++j) {
    const int64_t pair = t * a.top_k + j;
    if (a.pos_of_pair[pair] >= 0) sum += a.y_pair[pair * a.hidden + n];
  }
  if (a.shared) sum += a.shared[t * a.hidden + n];
  a.y[t * a.hidden + n] = __float2bfloat16_rn(sum);
}

}  // namespace

void combine_slots_ref(const CombineArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return;
  NVFP4_CHECK(a.tokens <= 65535, "combine_slots_ref: token count ", a.tokens, " above the grid limit 65535");
  const dim3 grid(unsigned(ceil_div(a.hidden, kThreads)), unsigned(a.tokens));
  combine_ref_kernel<<<grid, kThreads, 0, stream>>>(a);
  NVFP4_CUDA_CHECK_LAUNCH("combine_ref_kernel");
}

}  // namespace nvfp4moe::cuda
