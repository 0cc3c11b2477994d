"""PyTorch integration: custom ops that torch.compile traces and CUDA graphs
capture, and a DeepSeek-V4 MoE nn.Module.

    nvfp4moe::quantize(x, scope, static_scale, layout) -> (codes, scales, g)
    nvfp4moe::moe_forward(handle, x, topk_ids, topk_weights, token_ids)
        -> (y, topk_ids, topk_weights)

A Moe object cannot be an operator argument, so layers live in a registry
keyed by an int handle (`register_moe`); DeepseekV4MoE registers its layer on
construction and unregisters it when collected. Both ops have fake (meta)
implementations giving output shapes from the inputs and the registered
layer's config, so torch.compile traces through them without running them.
They queue their work on torch.cuda.current_stream() and never synchronise
with the host, so a CUDA graph captures them (a layer built with
checked=True synchronises and cannot be captured).

Importing this module imports torch; `import nvfp4moe` alone does not.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Optional

import torch

from . import _C
from ._C import Error, MoeConfig
from .format import quantize as _quantize_any, swizzled_shape
from .moe import Moe, load_moe

# ---- the layer registry ------------------------------------------------------

_registry: dict[int, Moe] = {}
_registry_lock = threading.Lock()
_handles = itertools.count(1)


def register_moe(moe: Moe) -> int:
    """Registers `moe` for the moe_forward op and returns its handle."""
    with _registry_lock:
        handle = next(_handles)
        _registry[handle] = moe
    return handle


def unregister_moe(handle: int) -> None:
    with _registry_lock:
        _registry.pop(handle, None)


def registered_moe(handle: int) -> Moe:
    moe = _registry.get(handle)
    if moe is None:
        raise Error(f"moe handle {handle} is not registered (the layer was released or never registered)")
    return moe


# ---- nvfp4moe::quantize --------------------------------------------------------

@torch.library.custom_op("nvfp4moe::quantize", mutates_args=())
def quantize_op(x: torch.Tensor, scope: str = "per_row", static_scale: Optional[float] = None,
                layout: str = "linear") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    codes, scales, g = _quantize_any(x, scope, static_scale, layout)
    return codes, scales, g


@quantize_op.register_fake
def _quantize_fake(x, scope="per_row", static_scale=None, layout="linear"):
    rows, k_elems = x.shape
    kb = k_elems // 16
    codes = x.new_empty((rows, k_elems // 2), dtype=torch.uint8)
    sshape = swizzled_shape(rows, kb) if layout == "swizzled" else (rows, kb)
    scales = x.new_empty(sshape, dtype=torch.float8_e4m3fn)
    g = x.new_empty((rows if scope == "per_row" else 1,), dtype=torch.float32)
    return codes, scales, g


def quantize(x: torch.Tensor, scope: str = "per_row", global_scale: Optional[float] = None,
             layout: str = "linear"):
    """nvfp4moe.quantize through the custom op (torch.compile / CUDA graphs).
    A static global scale is a Python number here (a graph constant)."""
    if global_scale is not None and isinstance(global_scale, torch.Tensor):
        global_scale = float(global_scale.reshape(-1)[0])  # one host read; pass a float to avoid it
    return torch.ops.nvfp4moe.quantize(x, scope, global_scale, layout)


# ---- nvfp4moe::moe_forward -------------------------------------------------------

@torch.library.custom_op("nvfp4moe::moe_forward", mutates_args=())
def moe_forward_op(handle: int, x: torch.Tensor, topk_ids: Optional[torch.Tensor] = None,
                   topk_weights: Optional[torch.Tensor] = None,
                   token_ids: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    moe = registered_moe(handle)
    return moe.forward(x, topk_ids, topk_weights, token_ids, return_topk=True)


@moe_forward_op.register_fake
def _moe_forward_fake(handle, x, topk_ids=None, topk_weights=None, token_ids=None):
    cfg = registered_moe(handle)._config
    T = x.shape[0]
    return (x.new_empty((T, cfg.hidden), dtype=torch.bfloat16), x.new_empty((T, cfg.top_k), dtype=torch.int32),
            x.new_empty((T, cfg.top_k), dtype=torch.float32))


def moe_forward(handle: int, x: torch.Tensor, topk_ids=None, topk_weights=None, token_ids=None):
    """y [T, H] bf16 of the registered layer `handle` (custom op)."""
    return torch.ops.nvfp4moe.moe_forward(handle, x, topk_ids, topk_weights, token_ids)[0]


# ---- the module ------------------------------------------------------------------

class DeepseekV4MoE(torch.nn.Module):
    """A DeepSeek-V4 MoE block — router, routed NVFP4 experts and the shared
    expert — as one nn.Module over the nvfp4moe::moe_forward op.

    forward(hidden_states [..., H], token_ids=None, topk_ids=None,
    topk_weights=None) -> [..., H] bfloat16. token_ids ([...] int) are needed
    for hash-routed layers; topk_ids/topk_weights bypass the router."""

    def __init__(self, moe: Moe):
        super().__init__()
        self.moe = moe
        self.handle = register_moe(moe)
        self._finalizer = weakref.finalize(self, unregister_moe, self.handle)
        cfg = moe._config
        self.hidden_size = cfg.hidden
        self.top_k = cfg.top_k

    @classmethod
    def from_pretrained(cls, model_dir: str, layer: int, device="cuda", **options) -> "DeepseekV4MoE":
        """Layer `layer` of a DeepSeek-V4 NVFP4 checkpoint directory in either
        layout — DeepSeek's names (layers.L.ffn.*, as NVIDIA publishes the
        NVFP4 models) or Hugging Face's (model.layers.L.mlp.*) — (options as
        nvfp4moe.load_moe: static_input_scales, max_tokens, mtp, ...)."""
        return cls(load_moe(model_dir, layer, _device_str(device), **options))

    @classmethod
    def from_tensors(cls, config: MoeConfig, device="cuda", **tensors_and_options) -> "DeepseekV4MoE":
        """See nvfp4moe.Moe.from_tensors for the tensors."""
        return cls(Moe.from_tensors(config, device=_device_str(device), **tensors_and_options))

    @property
    def config(self) -> MoeConfig:
        return self.moe.config

    def forward(self, hidden_states: torch.Tensor, token_ids: Optional[torch.Tensor] = None,
                topk_ids: Optional[torch.Tensor] = None, topk_weights: Optional[torch.Tensor] = None):
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, self.hidden_size)
        if token_ids is not None:
            token_ids = token_ids.reshape(-1)
        if topk_ids is not None:
            topk_ids = topk_ids.reshape(-1, self.top_k)
            topk_weights = topk_weights.reshape(-1, self.top_k)
        y, _, _ = torch.ops.nvfp4moe.moe_forward(self.handle, x, topk_ids, topk_weights, token_ids)
        return y.reshape(shape)

    def extra_repr(self) -> str:
        return f"handle={self.handle}, device={self.moe.device}, {self.moe._config!r}"


def _device_str(device) -> str:
    d = torch.device(device)
    if d.type == "cuda":
        return f"cuda:{d.index if d.index is not None else torch.cuda.current_device()}"
    return str(d)
