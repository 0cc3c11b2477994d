// Placeholder until the CPU backend lands.
#include "moe/backend.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {
std::unique_ptr<MoeBackendImpl> make_cpu_backend(MoeWeights, const MoeOptions&) {
  NVFP4_FAIL("cpu backend not built yet");
}
MoeWeights make_synthetic_moe(const MoeConfig&, uint64_t, SyntheticDense*) { NVFP4_FAIL("not yet"); }
}  // namespace nvfp4moe
