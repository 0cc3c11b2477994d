// The interface every backend implements behind nvfp4moe::Moe.
#pragma once

#include <memory>
#include <vector>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

class MoeBackendImpl {
 public:
  virtual ~MoeBackendImpl() = default;
  virtual const MoeConfig& config() const = 0;
  virtual Backend kind() const = 0;
  virtual void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
                       void* stream) = 0;
  // x [T, H] f32 host; returns y [T, H] f32 (values of the BF16 output).
  virtual std::vector<float> forward_host(const std::vector<float>& x, int64_t tokens,
                                          const std::vector<int32_t>* topk_ids,
                                          const std::vector<float>* topk_weights,
                                          const std::vector<int32_t>* token_ids,
                                          std::vector<int32_t>* topk_ids_out,
                                          std::vector<float>* topk_weights_out) = 0;
  virtual void sync_errors() = 0;
};

// src/cpu/
std::unique_ptr<MoeBackendImpl> make_cpu_backend(MoeWeights weights, const MoeOptions& options);
// src/cuda/ (throws "built without CUDA" when the library has no CUDA backend)
std::unique_ptr<MoeBackendImpl> make_cuda_backend(MoeWeights weights, const MoeOptions& options);
// Number of CUDA devices (0 without CUDA or without a device).
int cuda_device_count();

}  // namespace nvfp4moe
