// Placeholder until the CUDA backend lands.
#include "moe/backend.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {
std::unique_ptr<MoeBackendImpl> make_cuda_backend(MoeWeights, const MoeOptions&) {
  NVFP4_FAIL("cuda backend not built yet");
}
}  // namespace nvfp4moe
