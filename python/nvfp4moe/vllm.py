"""A vLLM-shaped adapter: the routed experts of an NVFP4 MoE layer built from
the parameters exactly as vLLM's ModelOptNvFp4FusedMoE holds them after
weight loading (before process_weights_after_loading), with an `apply` that
matches vLLM's fused-MoE experts call: routed experts only, each expert's
output scaled by its routing weight and summed per token. The shared expert
and the router stay with the engine. Tensor-by-tensor mapping: docs/vllm.md.

`expert_param` / `params_from_checkpoint` map checkpoint tensors of either
layout onto those parameters the way vLLM's DeepSeek-V4 loader does
(vllm-project/vllm, vllm/model_executor/models/deepseek_v4.py:
`FusedMoE.make_expert_params_mapping(ckpt_gate_proj_name="w1",
ckpt_down_proj_name="w2", ckpt_up_proj_name="w3")` turns
`experts.{e}.w1.` / `w3.` into `experts.w13_` with shard w1 / w3 and
`experts.{e}.w2.` into `experts.w2_`; the weight loader puts shard w1 in
rows [0, I) and w3 in rows [I, 2I) of expert e, and its per-tensor scales
in column 0 / 1 of the [E, 2] scale parameters). docs/checkpoints.md.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

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


# Routed-expert tensors of both layouts: DeepSeek's layers.{L}.ffn.experts.{e}.w{1,3,2}
# (and mtp.{i}.ffn...), Hugging Face's model.layers.{L}.mlp.experts.{e}.{gate,up,down}_proj.
_EXPERT_NAME = re.compile(
    r"^(?P<head>(?:model\.)?layers\.\d+\.(?:ffn|mlp)|mtp\.\d+\.ffn)\.experts\.(?P<e>\d+)\."
    r"(?P<proj>w[123]|gate_proj|up_proj|down_proj)\.(?P<suffix>weight|weight_scale|weight_scale_2|input_scale)$")
_SHARD = {"w1": "w1", "gate_proj": "w1", "w3": "w3", "up_proj": "w3", "w2": "w2", "down_proj": "w2"}


def expert_param(name: str):
    """(parameter name, expert id, shard id) of a routed-expert checkpoint
    tensor, as vLLM's DeepSeek-V4 loader maps it: "layers.3.ffn.experts.5.w3.
    weight_scale_2" -> ("layers.3.ffn.experts.w13_weight_scale_2", 5, "w3");
    None for any other tensor."""
    m = _EXPERT_NAME.match(name)
    if m is None:
        return None
    shard = _SHARD[m["proj"]]
    group = "w2_" if shard == "w2" else "w13_"
    return f"{m['head']}.experts.{group}{m['suffix']}", int(m["e"]), shard


def params_from_checkpoint(tensors: Mapping[str, "torch.Tensor"], layer: int, num_experts: int, *,
                           first_expert: int = 0, local_experts: Optional[int] = None, mtp: bool = False) -> dict:
    """ModelOptNvFp4FusedMoE's parameters of MoE layer `layer` (MTP block
    `layer` with mtp) for local experts [first_expert, first_expert + n),
    filled from checkpoint tensors of either layout (name -> tensor; the
    float8 scales as torch.float8_e4m3fn or uint8 bit patterns, never cast):
    w13_weight [n, 2I, H/2] uint8, w13_weight_scale [n, 2I, H/16]
    float8_e4m3fn, w13_weight_scale_2 [n, 2] and w13_input_scale [n, 2]
    float32 (column 0 from w1 / gate_proj, 1 from w3 / up_proj), w2_weight,
    w2_weight_scale, w2_weight_scale_2 [n], w2_input_scale [n]. Input scales
    are left out when the checkpoint has none. Ready for make_experts."""
    import torch

    n = num_experts - first_expert if local_experts is None else int(local_experts)
    if first_expert < 0 or n < 0 or first_expert + n > num_experts:
        raise Error(f"experts [{first_expert}, {first_expert + n}) outside [0, {num_experts})")
    head = f"mtp.{layer}.ffn" if mtp else None
    found = {}
    for name, t in tensors.items():
        p = expert_param(name)
        if p is None or not (first_expert <= p[1] < first_expert + n):
            continue
        param_head = p[0].rsplit(".experts.", 1)[0]
        if (head is not None and param_head != head) or (head is None and not re.fullmatch(
                rf"(?:model\.)?layers\.{int(layer)}\.(?:ffn|mlp)", param_head)):
            continue
        found[(p[0].rsplit(".", 1)[1], p[1] - first_expert, p[2])] = (name, t)

    def get(suffix, e, shard, required=True):
        key = (("w2_" if shard == "w2" else "w13_") + suffix, e, shard)
        if key not in found:
            if required:
                raise Error(f"layer {layer}: no {suffix} tensor for expert {first_expert + e}, shard {shard}")
            return None
        name, t = found[key]
        t = torch.as_tensor(t)
        if suffix == "weight_scale" and t.dtype != torch.float8_e4m3fn:
            t = t.view(torch.float8_e4m3fn)  # bit patterns: reinterpret, never cast
        return t

    out = {}
    w13 = [torch.cat([get("weight", e, "w1"), get("weight", e, "w3")]) for e in range(n)]
    s13 = [torch.cat([get("weight_scale", e, "w1"), get("weight_scale", e, "w3")]) for e in range(n)]
    out["w13_weight"] = torch.stack(w13) if n else None
    out["w13_weight_scale"] = torch.stack(s13) if n else None
    out["w13_weight_scale_2"] = torch.tensor(
        [[float(get("weight_scale_2", e, s).reshape(())) for s in ("w1", "w3")] for e in range(n)],
        dtype=torch.float32)
    out["w2_weight"] = torch.stack([get("weight", e, "w2") for e in range(n)]) if n else None
    out["w2_weight_scale"] = torch.stack([get("weight_scale", e, "w2") for e in range(n)]) if n else None
    out["w2_weight_scale_2"] = torch.tensor([float(get("weight_scale_2", e, "w2").reshape(())) for e in range(n)],
                                            dtype=torch.float32)
    ins = [[get("input_scale", e, s, False) for s in ("w1", "w3", "w2")] for e in range(n)]
    if n and all(v is not None for row in ins for v in row):
        out["w13_input_scale"] = torch.tensor([[float(r[0].reshape(())), float(r[1].reshape(()))] for r in ins],
                                              dtype=torch.float32)
        out["w2_input_scale"] = torch.tensor([float(r[2].reshape(())) for r in ins], dtype=torch.float32)
    return out


def make_experts_from_checkpoint(tensors: Mapping[str, "torch.Tensor"], layer: int, num_experts: int, top_k: int, *,
                                 first_expert: int = 0, local_experts: Optional[int] = None, mtp: bool = False,
                                 **options) -> NvFp4MoeExperts:
    """make_experts from checkpoint tensors of either layout
    (params_from_checkpoint), e.g. as vLLM's weight iterator yields them."""
    params = params_from_checkpoint(tensors, layer, num_experts, first_expert=first_expert,
                                    local_experts=local_experts, mtp=mtp)
    return make_experts(top_k=top_k, global_num_experts=num_experts, first_expert=first_expert, **params, **options)
