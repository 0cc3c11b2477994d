// nvfp4moe::Moe: picks the backend at run time and forwards to it.
#include "moe/backend.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

const char* backend_name(Backend b) { return b == Backend::Cpu ? "cpu" : "cuda"; }

Backend parse_backend(const std::string& s) {
  if (s == "cpu") return Backend::Cpu;
  if (s == "cuda" || s == "gpu") return Backend::Cuda;
  NVFP4_FAIL("unknown device '", s, "': expected cpu or cuda");
}

bool cuda_available() { return cuda_device_count() > 0; }

Moe::Moe(MoeWeights weights, const MoeOptions& options) {
  weights.config.validate();
  weights.experts.validate();
  if (options.backend == Backend::Cuda) {
    NVFP4_CHECK(cuda_available(), "device cuda requested but no CUDA device is available",
#ifdef NVFP4MOE_HAS_CUDA
                " (built with CUDA)"
#else
                " (this build has no CUDA backend)"
#endif
    );
    impl_ = make_cuda_backend(std::move(weights), options);
  } else {
    impl_ = make_cpu_backend(std::move(weights), options);
  }
}

Moe::~Moe() = default;
Moe::Moe(Moe&&) noexcept = default;
Moe& Moe::operator=(Moe&&) noexcept = default;

const MoeConfig& Moe::config() const { return impl_->config(); }
Backend Moe::backend() const { return impl_->kind(); }
DeviceKind Moe::device() const { return impl_->kind() == Backend::Cpu ? DeviceKind::Cpu : DeviceKind::Cuda; }
int Moe::device_index() const { return impl_->device_index(); }
std::string Moe::prefill_mma() const { return impl_->prefill_mma(); }

void Moe::forward(const TensorView& x, const RoutingArgs& routing, const ForwardOutputs& out,
                  const ForwardOptions& options) {
  impl_->forward(x, routing, out, options);
}

void Moe::sync_errors() { impl_->sync_errors(); }

#ifndef NVFP4MOE_HAS_CUDA
std::unique_ptr<MoeBackendImpl> make_cuda_backend(MoeWeights, const MoeOptions&) {
  NVFP4_FAIL("this build of nvfp4moe has no CUDA backend (nvcc was not found at configure time)");
}
int cuda_device_count() { return 0; }
void cuda_forward_host(MoeLayer&, const HostBatch&, HostResult&) {
  NVFP4_FAIL("this build of nvfp4moe has no CUDA backend (nvcc was not found at configure time)");
}
#endif

}  // namespace nvfp4moe
