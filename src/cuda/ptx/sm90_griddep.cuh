// One-instruction PTX wrappers of programmatic dependent launch (sm_90):
// a grid lets the next kernel of its stream start launching (on SMs its own
// CTAs free), and a grid waits for the grid it may have overlapped.
#pragma once

namespace nvfp4moe::cuda::ptx {

// The next kernel in the stream, if launched with programmatic stream
// serialisation, may start once every CTA of this grid has executed this (or
// exited).
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

// Blocks until the grids this one may overlap have completed and their
// memory is visible; a no-op for a grid launched without the attribute.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

}  // namespace nvfp4moe::cuda::ptx
