"""The routed experts of an NVFP4 MoE layer built from the parameters exactly
as vLLM's ModelOptNvFp4FusedMoE holds them after weight loading (before its
process_weights_after_loading), with an `apply` that matches vLLM's
fused-MoE experts call: routed experts only, each expert's output scaled by
its routing weight and summed per token. The shared expert and the router
stay with the engine. Tensor-by-tensor mapping: docs/vllm.md.

The experts run through the `nvfp4moe::moe_forward` torch op
(nvfp4moe.torch), so torch.compile traces `apply` and CUDA graphs capture it.
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence

import torch

from .. import torch as _nt
from .._C import Error, MoeConfig
from ..moe import Moe


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
        self.handle = _nt.register_moe(moe)
        self._finalizer = weakref.finalize(self, _nt.unregister_moe, self.handle)

    def apply(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        if topk_ids.dim() != 2 or topk_ids.shape[1] != self.top_k:
            raise Error(f"topk_ids: shape {list(topk_ids.shape)}, expected [tokens, top_k={self.top_k}]")
        if topk_weights.dtype != torch.float32:
            topk_weights = topk_weights.float()
        x = hidden_states
        if x.dtype == torch.float16:  # the layer takes bf16 or f32; f16 -> f32 is exact
            x = x.float()
        y = torch.ops.nvfp4moe.moe_forward(self.handle, x, topk_ids, topk_weights, None)[0]
        return y if y.dtype == hidden_states.dtype else y.to(hidden_states.dtype)

    __call__ = apply


def _input_scales(w13_input_scale: Optional[torch.Tensor], w2_input_scale: Optional[torch.Tensor],
                  expert_ids: torch.Tensor):
    """vLLM's input scales -> (l1 [n], l2 [n]) float32 host tensors for the n
    local experts with global ids `expert_ids`, or None where not given.

    vLLM holds w13_input_scale as [E, 2] (gate, up) or [E], w2_input_scale
    as [E], with E the local experts, or all experts of the layer where a
    backend keeps global scale factors (ModelOptNvFp4FusedMoE.use_global_sf).
    Gate's and up's quantize the same x, so one expert's L1 scale is the max
    of the two (as the checkpoint loader). The layer quantizes x once, with
    the max over the experts it holds (docs/numerics.md §4); the contract
    fixes that g as the max over ALL experts of the layer on every rank
    (spec §8 ruling 3), so given global scales every local expert gets the
    layer-wide max."""
    n = int(expert_ids.numel())
    first, last = (int(expert_ids.min()), int(expert_ids.max())) if n else (0, -1)

    def per_expert(scale, name, two_columns):
        s = scale.detach().float().cpu()
        if two_columns and s.dim() == 2:
            s = s.max(dim=1).values
        if s.dim() != 1:
            raise Error(f"{name}: shape {list(scale.shape)}, expected [experts]" +
                        (" or [experts, 2]" if two_columns else ""))
        if s.shape[0] == n:
            return s.contiguous(), False
        if s.shape[0] <= last:
            raise Error(f"{name}: {s.shape[0]} experts, expected {n} (local) or at least {last + 1} (global; "
                        f"local experts are global ids {first}..{last})")
        return s, True

    l1 = l2 = None
    if w13_input_scale is not None:
        s, is_global = per_expert(w13_input_scale, "w13_input_scale", True)
        l1 = torch.full((n,), float(s.max()), dtype=torch.float32) if is_global and n else s
    if w2_input_scale is not None:
        s, is_global = per_expert(w2_input_scale, "w2_input_scale", False)
        l2 = s[expert_ids.long()].contiguous() if is_global else s
    return l1, l2


def make_experts(*, w13_weight: torch.Tensor, w13_weight_scale: torch.Tensor, w13_weight_scale_2: torch.Tensor,
                 w2_weight: torch.Tensor, w2_weight_scale: torch.Tensor, w2_weight_scale_2: torch.Tensor,
                 top_k: int, w13_input_scale: Optional[torch.Tensor] = None,
                 w2_input_scale: Optional[torch.Tensor] = None, global_num_experts: Optional[int] = None,
                 first_expert: int = 0, expert_ids: Optional[Sequence[int]] = None,
                 swiglu_limit: Optional[float] = None, static_input_scales: Optional[bool] = None, device=None,
                 max_tokens: int = 8192, checked: bool = False) -> NvFp4MoeExperts:
    """Routed NVFP4 experts from vLLM ModelOptNvFp4FusedMoE parameters:

    w13_weight uint8 [E, 2I, H/2] (gate rows, then up rows), w13_weight_scale
    float8_e4m3fn [E, 2I, H/16] (linear, unswizzled), w13_weight_scale_2
    float32 [E, 2] (gate g, up g; a [E] tensor is taken as both),
    w13_input_scale [E, 2] or [E] (optional), w2_weight uint8 [E, H, I/2],
    w2_weight_scale [E, H, I/16], w2_weight_scale_2 [E], w2_input_scale [E]
    (optional). E = local experts, global ids [first_expert, first_expert+E);
    the input scales may instead hold all global experts.

    expert_ids (the global ids of the E local experts, in weight order) is
    for a placement that is not one contiguous range: it only selects this
    rank's rows of global input scales; the layer is then built over local
    ids [0, E), and `apply` takes LOCAL ids (the caller maps them, as vLLM's
    expert_map does).

    static_input_scales (default: True when both input scales are given, as
    vLLM's NVFP4 W4A4 path quantizes activations with the checkpoint's
    input_scale): one static g for x (max over experts) and per-expert g for
    the down projection's input; False quantizes per token / per row."""
    # vLLM's parameters are torch.nn.Parameter subclasses; hand over their tensors.
    w13_weight, w13_weight_scale, w13_weight_scale_2, w2_weight, w2_weight_scale, w2_weight_scale_2, \
        w13_input_scale, w2_input_scale = (
            t.data if isinstance(t, torch.nn.Parameter) else t
            for t in (w13_weight, w13_weight_scale, w13_weight_scale_2, w2_weight, w2_weight_scale,
                      w2_weight_scale_2, w13_input_scale, w2_input_scale))
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
    if expert_ids is None:
        ids = torch.arange(first_expert, first_expert + n, dtype=torch.int64)
    else:
        ids = torch.as_tensor(expert_ids, dtype=torch.int64).reshape(-1).cpu()
        if ids.numel() != n:
            raise Error(f"expert_ids: {ids.numel()} ids for {n} local experts")
        first_expert = 0  # the layer is indexed by local id
        global_num_experts = n
    l1, l2 = _input_scales(w13_input_scale, w2_input_scale, ids)
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
