"""Array plumbing shared by the Python API: which framework an array belongs
to, allocating outputs next to an input (same framework, same device), the
caller's CUDA stream, and the two documented reinterpretations (float8 scale
bytes are passed as uint8; NumPy BF16 is uint16 bit patterns).

Nothing here copies an input: a non-contiguous array, a wrong dtype or a wrong
device is reported by the C++ checks with the argument's name."""

from __future__ import annotations

import numpy as np

from ._C import Error


def framework(a) -> str:
    mod = type(a).__module__
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    if isinstance(a, np.ndarray):
        return "numpy"
    raise Error(f"expected a NumPy array, a torch.Tensor or a CuPy array, got {type(a).__name__}")


def is_cuda(a) -> bool:
    fw = framework(a)
    if fw == "torch":
        return a.device.type == "cuda"
    return fw == "cupy"


def device_of(a) -> str:
    fw = framework(a)
    if fw == "torch":
        return str(a.device)
    if fw == "cupy":
        return f"cuda:{a.device.id}"
    return "cpu"


def device_index(a) -> int:
    fw = framework(a)
    if fw == "torch":
        return (a.device.index or 0) if a.device.type == "cuda" else 0
    if fw == "cupy":
        return a.device.id
    return 0


def stream_of(a, stream=None) -> int:
    """The CUDA stream to queue work on: the given one, else the caller's
    current stream (torch.cuda.current_stream / CuPy's current stream); 0 on
    the host."""
    if stream is not None:
        return int(stream)
    fw = framework(a)
    if fw == "torch" and a.device.type == "cuda":
        import torch

        return torch.cuda.current_stream(a.device).cuda_stream
    if fw == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


def as_input(a, name: str):
    """The array as the C++ side takes it: torch tensors detached (DLPack
    refuses tensors that require grad) and float8 scale bytes viewed as uint8
    (the same bits, never a numeric cast)."""
    if a is None:
        return None
    fw = framework(a)
    if fw == "torch":
        import torch

        a = a.detach()
        if a.dtype == torch.float8_e4m3fn:
            a = a.view(torch.uint8)
    return a


_TORCH_DTYPES = {
    "uint8": "uint8",
    "float32": "float32",
    "int32": "int32",
    "int64": "int64",
    "bfloat16": "bfloat16",
    "scale": "float8_e4m3fn",
}
_NUMPY_DTYPES = {
    "uint8": np.uint8,
    "float32": np.float32,
    "int32": np.int32,
    "int64": np.int64,
    "bfloat16": np.uint16,  # BF16 bit patterns: NumPy has no bfloat16
    "scale": np.uint8,      # UE4M3 bit patterns: NumPy has no float8
}


def empty_like(ref, shape, kind: str):
    """An uninitialised array of `kind` (a key of the tables above) with the
    framework and device of `ref`."""
    fw = framework(ref)
    shape = tuple(int(s) for s in shape)
    if fw == "torch":
        import torch

        return torch.empty(shape, dtype=getattr(torch, _TORCH_DTYPES[kind]), device=ref.device)
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(ref.device.id):
            return cupy.empty(shape, dtype=_NUMPY_DTYPES[kind])
    return np.empty(shape, dtype=_NUMPY_DTYPES[kind])


def out_view(t):
    """What the C++ side writes into: float8 outputs as their uint8 bytes."""
    return as_input(t, "out")


def scalar_array(ref, value, name: str):
    """A float32 [1] array holding `value` next to `ref` (Python number), or
    the given array reshaped to [1] (an array stays on its own device)."""
    if isinstance(value, (int, float, np.floating, np.integer)):
        v = float(value)
        if not np.isfinite(v) or v <= 0:
            raise Error(f"{name}: a static global scale must be finite and > 0, got {v}")
        fw = framework(ref)
        if fw == "torch":
            import torch

            return torch.full((1,), v, dtype=torch.float32, device=ref.device)
        if fw == "cupy":
            import cupy

            with cupy.cuda.Device(ref.device.id):
                return cupy.full((1,), v, dtype=cupy.float32)
        return np.full((1,), v, dtype=np.float32)
    value = as_input(value, name)
    count = value.numel() if framework(value) == "torch" else value.size
    if count != 1:
        raise Error(f"{name}: expected one value, got shape {tuple(value.shape)}")
    return value.reshape(1)


def scalar_value(value, name: str) -> float:
    """A static global scale as a host float: a number, or a one-element array
    (a CUDA tensor is read back, which synchronises with its stream)."""
    if not isinstance(value, (int, float, np.floating, np.integer)):
        value = as_input(value, name)
        fw = framework(value)
        count = value.numel() if fw == "torch" else value.size
        if count != 1:
            raise Error(f"{name}: expected one value, got shape {tuple(value.shape)}")
        value = value.reshape(-1)[0]
        value = value.item() if fw in ("torch", "cupy") else value
    v = float(value)
    if not np.isfinite(v) or v <= 0:
        raise Error(f"{name}: a static global scale must be finite and > 0, got {v}")
    return v


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) -> the same values as float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns, round to nearest even (NaN kept NaN)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded)
