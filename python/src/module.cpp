// nvfp4moe._C — the Python extension module. Every nvfp4moe::Error becomes
// nvfp4moe.Error, a subclass of ValueError (nearly every failure the library
// reports is about the input it was given: shapes, dtypes, devices, files).
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"

NB_MODULE(_C, m) {
  namespace nb = nanobind;
  m.doc() = "nvfp4moe: NVFP4 Mixture-of-Experts for Hopper (low-level bindings; use the nvfp4moe package)";
  nb::exception<nvfp4moe::Error>(m, "Error", PyExc_ValueError);
  // Layers registered for the torch ops and torch.compile's caches are still
  // alive at interpreter exit; that is not a leak worth a warning.
  nb::set_leak_warnings(false);
  m.def("cuda_available", &nvfp4moe::cuda_available,
        "True when this build has the CUDA backend and a CUDA device is present.");
#ifdef NVFP4MOE_HAS_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  nvfp4moe::py::bind_format(m);
  nvfp4moe::py::bind_moe(m);
  nvfp4moe::py::bind_checkpoint(m);
}
