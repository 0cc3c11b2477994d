"""The NVFP4 format over arrays (docs/numerics.md §1-3): quantize, dequantize and
the two scale-factor layouts. NumPy arrays run on the host; torch/CuPy CUDA
arrays run on the device, queued on the caller's current stream, and give the
same bytes."""

from __future__ import annotations

from . import _C
from ._arrays import as_input, empty_like, framework, is_cuda, out_view, scalar_array, scalar_value, stream_of
from ._C import Error

SCOPES = ("per_row", "per_tensor", "static")
LAYOUTS = ("linear", "swizzled")


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def swizzled_shape(rows: int, k: int) -> tuple[int, int]:
    """Shape of the swizzled 128x4 scale buffer for `rows` rows of `k` scale
    columns: rows padded to 128, k to 4 (docs/numerics.md §3)."""
    return _round_up(rows, 128), _round_up(k, 4)


def _check_choice(name, value, choices):
    if value not in choices:
        raise Error(f"{name}: unknown {name} {value!r}, expected one of {', '.join(choices)}")


def _shape2(a, name):
    framework(a)  # raises for what is not an array
    shape = tuple(a.shape)
    if len(shape) != 2:
        raise Error(f"{name}: expected a 2-D array, got shape {list(shape)}")
    return shape


def quantize(x, scope: str = "per_row", global_scale=None, layout: str = "linear", *, stream=None):
    """Quantize x [rows, K] (float32 or bfloat16; K a multiple of 16) to NVFP4.

    scope: "per_row" (one dynamic global scale per row/token, the MoE default),
    "per_tensor" (one from the whole tensor's amax) or "static" (the given
    `global_scale`, a number or a one-element array, e.g. a checkpoint's
    input_scale).

    Returns (codes, scales, global_scale): codes uint8 [rows, K/2] (element 2i
    in the low nibble), scales UE4M3 bytes — torch.float8_e4m3fn for torch,
    uint8 for NumPy/CuPy — [rows, K/16] ("linear") or [ceil128(rows),
    ceil4(K/16)] ("swizzled"), and global_scale float32 [rows] or [1].
    """
    _check_choice("scope", scope, SCOPES)
    _check_choice("layout", layout, LAYOUTS)
    rows, k_elems = _shape2(x, "x")
    if k_elems % 16 != 0:
        raise Error(f"x: K (the last dimension) must be a multiple of 16, got K={k_elems} (shape {[rows, k_elems]})")
    static = None
    if scope == "static":
        if global_scale is None:
            raise Error("global_scale: scope 'static' needs a global scale")
        static = scalar_value(global_scale, "global_scale")
    elif global_scale is not None:
        raise Error(f"global_scale: only scope 'static' takes a global scale, got scope {scope!r}")
    kb = k_elems // 16
    codes = empty_like(x, (rows, k_elems // 2), "uint8")
    scales = empty_like(x, swizzled_shape(rows, kb) if layout == "swizzled" else (rows, kb), "scale")
    g = empty_like(x, (rows if scope == "per_row" else 1,), "float32")
    g_rows = amax = None
    if is_cuda(x) and scope != "per_row":  # device scratch of the staging kernel
        g_rows = empty_like(x, (rows,), "float32")
        if scope == "per_tensor":
            amax = empty_like(x, (1,), "int32")
    _C.quantize(as_input(x, "x"), scope, static, codes, out_view(scales), g, layout, stream_of(x, stream), g_rows,
                amax)
    return codes, scales, g


def dequantize(codes, scales, global_scale, layout: str = "linear", dtype: str = "float32", *, stream=None):
    """x_hat [rows, K] = value(code) * e4m3(scale) * global_scale, in FP32.

    global_scale: [1] or [rows] float32 (a Python number is accepted for one
    scale). dtype "float32" or "bfloat16" (NumPy: uint16 BF16 bit patterns)."""
    _check_choice("layout", layout, LAYOUTS)
    _check_choice("dtype", dtype, ("float32", "bfloat16"))
    rows, half = _shape2(codes, "codes")
    if not hasattr(global_scale, "shape"):
        global_scale = scalar_array(codes, global_scale, "global_scale")
    out = empty_like(codes, (rows, 2 * half), dtype)
    _C.dequantize(as_input(codes, "codes"), as_input(scales, "scales"), as_input(global_scale, "global_scale"),
                  out, layout, stream_of(codes, stream))
    return out


def scales_to_swizzled(scales, *, stream=None):
    """Linear scale bytes [rows, k] -> the swizzled 128x4 layout
    [ceil128(rows), ceil4(k)], padding zeroed. Keeps the dtype (float8/uint8)."""
    rows, k = _shape2(scales, "scales")
    out = empty_like(scales, swizzled_shape(rows, k), "scale" if _is_float8(scales) else "uint8")
    _C.scales_to_swizzled(as_input(scales, "scales"), out_view(out), stream_of(scales, stream))
    return out


def scales_to_linear(scales, rows: int, k: int, *, stream=None):
    """Swizzled scale bytes [ceil128(rows), ceil4(k)] -> linear [rows, k]
    (padding ignored). Keeps the dtype (float8/uint8)."""
    out = empty_like(scales, (rows, k), "scale" if _is_float8(scales) else "uint8")
    _C.scales_to_linear(as_input(scales, "scales"), out_view(out), stream_of(scales, stream))
    return out


def _is_float8(a) -> bool:
    return framework(a) == "torch" and str(a.dtype) == "torch.float8_e4m3fn"
