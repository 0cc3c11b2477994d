// Copies of library-owned vectors handed to Python as NumPy arrays (the array
// owns its copy, so it outlives the object it was read from).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <initializer_list>
#include <vector>

namespace nvfp4moe::py {

namespace nb = nanobind;

template <typename T>
nb::object numpy_copy(std::vector<T> values, std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.begin(), owner),
                  nb::rv_policy::reference);
}

}  // namespace nvfp4moe::py
