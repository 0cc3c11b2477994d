// Device discovery for the run-time backend choice.
#include <cuda_runtime.h>

#include "moe/backend.hpp"

namespace nvfp4moe {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: not an error here
    return 0;
  }
  return n;
}

}  // namespace nvfp4moe
