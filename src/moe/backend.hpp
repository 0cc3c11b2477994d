// The interface every backend implements behind nvfp4moe::Moe, and the
// device side of MoeLayer::forward_host.
#pragma once

#include <memory>
#include <string>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe {

class MoeBackendImpl {
 public:
  virtual ~MoeBackendImpl() = default;
  virtual const MoeConfig& config() const = 0;
  virtual Backend kind() const = 0;
  virtual int device_index() const = 0;
  virtual void forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
                       const ForwardOptions& options) = 0;
  virtual void sync_errors() = 0;
  virtual std::string prefill_mma() const { return "none"; }
};

// src/cpu/
std::unique_ptr<MoeBackendImpl> make_cpu_backend(MoeWeights weights, const MoeOptions& options);
// src/cuda/ (throws "built without CUDA" when the library has no CUDA backend)
std::unique_ptr<MoeBackendImpl> make_cuda_backend(MoeWeights weights, const MoeOptions& options);
// Number of CUDA devices (0 without CUDA or without a device).
int cuda_device_count();

// forward_host of a layer on a CUDA device (src/cuda/backend/host_forward.cpp):
// the batch (sizes checked by the caller) to device buffers, layer.forward on
// a stream of its own, the outputs back into `result`, then sync_errors().
void cuda_forward_host(MoeLayer& layer, const HostBatch& batch, HostResult& result);

}  // namespace nvfp4moe
