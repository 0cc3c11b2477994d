// The parts of the nvfp4moe._C extension module, one per file.
#pragma once

#include <nanobind/nanobind.h>

namespace nvfp4moe::py {

namespace nb = nanobind;

void bind_format(nb::module_& m);      // bind_format.cpp
void bind_moe(nb::module_& m);         // bind_moe.cpp
void bind_checkpoint(nb::module_& m);  // bind_checkpoint.cpp

}  // namespace nvfp4moe::py
