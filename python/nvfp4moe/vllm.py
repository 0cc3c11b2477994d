"""A vLLM-shaped adapter: the routed experts of an NVFP4 MoE layer built from
the parameters exactly as vLLM's ModelOptNvFp4FusedMoE holds them after
weight loading (before process_weights_after_loading), with an `apply` that
matches vLLM's fused-MoE experts call: routed experts only, each expert's
output scaled by its routing weight and summed per token. The shared expert
and the router stay with the engine. Tensor-by-tensor mapping: docs/vllm.md.
"""

from __future__ import annotations

from typing import Optional

import torch

from ._C import Error, MoeConfig
from .moe import Moe


class NvFp4MoeExperts:
    """The routed experts. apply(hidden_states [T, H], topk_ids [T, k] (GLOBAL
    expert ids, -1 = none; int32/int64), topk_weights [T, k] float32) ->
    [T, H] in hidden_states' dtype: sum_j topk_weights[t, j] * expert(x_t).
    hidden_states may be bfloat16, float32 or float16 (widened to float32
    exactly); the layer's output is BF16, cast to the input dtype."""

    def __init__(self, moe: Moe, first_expert: int, local_experts: int):
        self.moe = moe
        self.first_expert = first_expert
        self.local_experts = local_experts
        self.top_k = moe._config.top_k

    def apply(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        if topk_ids.dim() != 2 or topk_ids.shape[1] != self.top_k:
            raise Error(f"topk_ids: shape {list(topk_ids.shape)}, expected [tokens, top_k={self.top_k}]")
        if topk_weights.dtype != torch.float32:
            topk_weights = topk_weights.float()
        x = hidden_states
        if x.dtype == torch.float16:  # the layer takes bf16 or f32; f16 -> f32 is exact
            x = x.float()
        y = self.moe.forward(x, topk_ids, topk_weights)
        return y if y.dtype == hidden_states.dtype else y.to(hidden_states.dtype)

    __call__ = apply


def _per_expert_input_scale(scale: Optional[torch.Tensor], n: int, first: int, name: str):
    """vLLM holds w13_input_scale as [E, 2] (gate, up) or [E]; some backends
    keep all global experts. -> [n] float32 for our local experts: the max of
    gate's and up's (they quantize the same x), as the checkpoint loader."""
    if scale is None:
        return None
    s = scale.detach().float().cpu()
    if s.dim() == 2:
        s = s.max(dim=1).values
    if s.dim() != 1:
        raise Error(f"{name}: shape {list(scale.shape)}, expected [experts] or [experts, 2]")
    if s.shape[0] != n:
        if s.shape[0] < first + n:
            raise Error(f"{name}: {s.shape[0]} experts, expected {n} (local) or at least {first + n} (global)")
        s = s[first:first + n]
    return s.contiguous()


def make_experts(*, w13_weight: torch.Tensor, w13_weight_scale: torch.Tensor, w13_weight_scale_2: torch.Tensor,
                 w2_weight: torch.Tensor, w2_weight_scale: torch.Tensor, w2_weight_scale_2: torch.Tensor,
                 top_k: int, w13_input_scale: Optional[torch.Tensor] = None,
                 w2_input_scale: Optional[torch.Tensor] = None, global_num_experts: Optional[int] = None,
                 first_expert: int = 0, swiglu_limit: Optional[float] = None,
                 static_input_scales: Optional[bool] = None, device=None, max_tokens: int = 8192,
                 checked: bool = False) -> NvFp4MoeExperts:
    """Routed NVFP4 experts from vLLM ModelOptNvFp4FusedMoE parameters:

    w13_weight uint8 [E, 2I, H/2] (gate rows, then up rows), w13_weight_scale
    float8_e4m3fn [E, 2I, H/16] (linear, unswizzled), w13_weight_scale_2
    float32 [E, 2] (gate g, up g; a [E] tensor is taken as both),
    w13_input_scale [E, 2] or [E] (optional), w2_weight uint8 [E, H, I/2],
    w2_weight_scale [E, H, I/16], w2_weight_scale_2 [E], w2_input_scale [E]
    (optional). E = local experts, global ids [first_expert, first_expert+E).

    static_input_scales (default: True when both input scales are given, as
    vLLM's NVFP4 W4A4 path quantizes activations with the checkpoint's
    input_scale): one static g for x (max over experts) and per-expert g for
    the down projection's input; False quantizes per token / per row."""
    n = int(w13_weight.shape[0])
    if w13_weight.dim() != 3 or w2_weight.dim() != 3:
        raise Error(f"w13_weight / w2_weight: expected 3-D [E, rows, K/2], got {list(w13_weight.shape)} / "
                    f"{list(w2_weight.shape)}")
    H = int(w13_weight.shape[2]) * 2
    two_i = int(w13_weight.shape[1])
    if two_i % 2:
        raise Error(f"w13_weight: {two_i} rows per expert, expected 2*I (gate rows then up rows)")
    I = two_i // 2
    g13 = w13_weight_scale_2.detach().float()
    if g13.dim() == 1:
        g13 = g13[:, None].expand(n, 2)
    l1 = _per_expert_input_scale(w13_input_scale, n, first_expert, "w13_input_scale")
    l2 = _per_expert_input_scale(w2_input_scale, n, first_expert, "w2_input_scale")
    if static_input_scales is None:
        static_input_scales = l1 is not None and l2 is not None
    if static_input_scales and (l1 is None or l2 is None):
        raise Error("static_input_scales=True needs w13_input_scale and w2_input_scale")
    cfg = MoeConfig()
    cfg.hidden, cfg.intermediate = H, I
    cfg.experts = int(global_num_experts) if global_num_experts is not None else first_expert + n
    cfg.top_k = int(top_k)
    cfg.shared_experts = 0
    cfg.routed_scaling_factor = 1.0  # vLLM's topk_weights already carry it
    cfg.swiglu_limit = swiglu_limit
    cfg.l1_input = cfg.l2_input = "static" if static_input_scales else "dynamic"
    if device is None:
        device = w13_weight.device
    d = torch.device(device)
    dev = "cpu" if d.type == "cpu" else f"cuda:{d.index if d.index is not None else torch.cuda.current_device()}"
    moe = Moe.from_tensors(
        cfg, w13_weight=w13_weight, w13_weight_scale=w13_weight_scale, w13_weight_scale_2=g13.contiguous(),
        w2_weight=w2_weight, w2_weight_scale=w2_weight_scale,
        w2_weight_scale_2=w2_weight_scale_2.detach().float().reshape(n), w13_input_scale=l1, w2_input_scale=l2,
        first_expert=first_expert, device=dev, max_tokens=max_tokens, checked=checked)
    return NvFp4MoeExperts(moe, first_expert, n)


def make_experts_from_layer(layer, top_k: int, **options) -> NvFp4MoeExperts:
    """make_experts from an object with vLLM's attribute names (e.g. the
    FusedMoE layer after load_weights, before process_weights_after_loading)."""
    names = ("w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w2_weight", "w2_weight_scale",
             "w2_weight_scale_2")
    tensors = {n: getattr(layer, n) for n in names}
    for n in ("w13_input_scale", "w2_input_scale"):
        tensors[n] = getattr(layer, n, None)
    return make_experts(top_k=top_k, **tensors, **options)
