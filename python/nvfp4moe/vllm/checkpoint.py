"""Checkpoint tensors of either layout onto vLLM's ModelOptNvFp4FusedMoE
parameters, the way vLLM's loaders map them (docs/checkpoints.md).

DeepSeek-V4 (vllm/models/deepseek_v4/nvidia/model.py, get_expert_mapping:
`fused_moe_make_expert_params_mapping(ckpt_gate_proj_name="w1",
ckpt_down_proj_name="w2", ckpt_up_proj_name="w3")`) turns
`experts.{e}.w1.` / `w3.` into `experts.w13_` with shard w1 / w3 and
`experts.{e}.w2.` into `experts.w2_`; the Hugging Face names
`gate_proj` / `up_proj` / `down_proj` are RoutedExperts' default
checkpoint names (vllm/model_executor/layers/fused_moe/routed_experts.py,
build_expert_params_mapping). RoutedExperts.weight_loader puts shard w1 in
rows [0, I) and w3 in rows [I, 2I) of expert e, and their per-tensor scales
in column 0 / 1 of the [E, 2] scale parameters.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

from .._C import Error
from .experts import NvFp4MoeExperts, make_experts

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
