// DLPack arrays (NumPy, PyTorch, CuPy through nanobind::ndarray) as the
// library's TensorView, without copying.
//
// The view keeps the array's dtype, device and strides; whether they are the
// right ones is checked by the callee (check_tensor and friends), which names
// the argument. Two reinterpretations are explicit and documented in
// docs/python.md: float8_e4m3fn scale bytes are read as uint8 bit patterns
// (docs/numerics.md §1: reinterpret, never cast), and uint16 arrays stand for BF16
// bit patterns where an argument takes BF16 (NumPy has no bfloat16).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>

#include "nvfp4moe/types.hpp"

namespace nvfp4moe::py {

namespace nb = nanobind;

using InArray = nb::ndarray<nb::ro>;  // an input: read-only arrays are accepted
using OutArray = nb::ndarray<>;       // an output: must be writable

TensorView to_view(const InArray& a, const char* arg);
TensorView to_view(const OutArray& a, const char* arg);

// None -> an empty view (ndim 0, "not given"); otherwise the array's view.
TensorView optional_view(const nb::handle& obj, const char* arg, bool writable);

// float8_e4m3fn -> uint8 (the same bytes).
TensorView as_scale_bytes(TensorView v);
// uint16 -> BF16 (the same bits).
TensorView as_bf16_bits(TensorView v);

// "cpu" or "cuda:N" for messages.
std::string device_string(const TensorView& v);

// Throws naming `arg` and both devices unless `v` lives on `ref`'s device.
void check_same_device(const TensorView& v, const char* arg, const TensorView& ref, const char* ref_arg);

}  // namespace nvfp4moe::py
