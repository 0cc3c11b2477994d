// The two projections of a routed expert, as the GEMM kernels and the
// weight layouts see them: GateUp (W1 and W3 fused, N = 2I, K = H) and
// Down (W2, N = H, K = I).
#pragma once

#include <cstdint>

namespace nvfp4moe::cuda {

enum class Projection : uint8_t { GateUp, Down };

}  // namespace nvfp4moe::cuda
