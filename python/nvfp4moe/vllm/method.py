"""The vLLM fused-MoE method that runs ModelOpt NVFP4 routed experts on
nvfp4moe (docs/vllm.md). Imports vLLM.

Life cycle, as vLLM drives a FusedMoEMethodBase
(vllm/model_executor/layers/fused_moe/routed_experts.py, RoutedExperts):
create_weights registers the parameters, RoutedExperts.weight_loader fills
them from the checkpoint, process_weights_after_loading builds the nvfp4moe
layer from them once and frees them, and MoERunner calls apply with the
router's topk_ids / topk_weights for every forward.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import FusedMoEConfig
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config, ModelOptNvFp4FusedMoE
from vllm.model_executor.layers.quantization.utils.quant_utils import kNvfp4DynamicToken
from vllm.model_executor.utils import replace_parameter
from vllm.platforms import current_platform

from .. import _C
from .experts import NvFp4MoeExperts, make_experts

logger = init_logger(__name__)

# The eight parameters of ModelOptNvFp4FusedMoE.create_weights.
PARAM_NAMES = ("w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w13_input_scale", "w2_weight",
               "w2_weight_scale", "w2_weight_scale_2", "w2_input_scale")


def input_scale_mode(quant_config: ModelOptNvFp4Config) -> str:
    """"static" (the checkpoint's input_scale, W4A4 as vLLM runs it; the
    default) or "dynamic" (per-token / per-row scales): NVFP4MOE_VLLM_INPUT_SCALES,
    else vLLM's own per-token MoE activation override of the checkpoint's
    quantization config (`moe.activation = "nvfp4_per_token"`)."""
    mode = os.environ.get("NVFP4MOE_VLLM_INPUT_SCALES", "").strip().lower()
    if mode in ("static", "dynamic"):
        return mode
    if mode:
        raise ValueError(f"NVFP4MOE_VLLM_INPUT_SCALES={mode!r}: expected 'static' or 'dynamic'")
    if getattr(quant_config, "moe_activation_override", None) == kNvfp4DynamicToken:
        return "dynamic"
    return "static"


def platform_unsupported() -> Optional[str]:
    """Why this process's vLLM platform cannot run nvfp4moe, or None: the
    CPU platform runs nvfp4moe's CPU backend; CUDA needs an SM90 device
    (the kernels are sm_90a) and an nvfp4moe build with the CUDA backend."""
    if current_platform.is_cpu():
        return None
    if not current_platform.is_cuda():
        return f"platform {type(current_platform).__name__} (nvfp4moe runs on CUDA SM90 and on CPU)"
    cap = current_platform.get_device_capability()
    if cap is None or cap.to_int() != 90:
        return f"device capability {cap} (nvfp4moe's kernels are for SM90)"
    if not _C.cuda_available():
        return "this nvfp4moe build has no CUDA backend"
    return None


def unsupported(quant_config: ModelOptNvFp4Config, layer) -> Optional[str]:
    """Why nvfp4moe cannot run this RoutedExperts layer, or None."""
    moe: FusedMoEConfig = layer.moe_config
    reason = platform_unsupported()
    if reason:
        return reason
    if quant_config.quant_method != "NVFP4":
        return f"quant_algo {quant_config.quant_method} (nvfp4moe quantizes activations: W4A4 NVFP4 only)"
    if getattr(quant_config, "group_size", 16) != 16:
        return f"group_size {quant_config.group_size} (NVFP4 blocks are 16)"
    if moe.activation != MoEActivation.SILU:
        return f"activation {moe.activation.value} (nvfp4moe computes SwiGLU: silu(gate) * up)"
    if moe.has_bias or moe.swiglu_alpha is not None or moe.swiglu_beta is not None:
        return "expert biases / SwiGLU alpha, beta"
    if moe.is_lora_enabled:
        return "LoRA on the experts"
    if moe.moe_parallel_config.use_all2all_kernels:
        return "all-to-all expert-parallel kernels (nvfp4moe takes vLLM's naive dispatch)"
    if moe.moe_parallel_config.enable_eplb:
        return "EPLB (nvfp4moe's layer does not rearrange experts)"
    if getattr(layer, "apply_router_weight_on_input", False):
        return "router weights applied on the input"
    manager = getattr(layer, "expert_map_manager", None)
    if manager is not None and manager.num_fused_shared_experts:
        return "shared experts fused into the routed experts"
    if moe.hidden_dim % 16:
        return f"hidden size {moe.hidden_dim} (not a multiple of 16)"
    return None


class Nvfp4moeModelOptNvFp4FusedMoE(FusedMoEMethodBase):
    """ModelOpt NVFP4 routed experts on nvfp4moe.

    "ModelOpt" is in the class name on purpose: RoutedExperts.weight_loader
    picks its ModelOpt loading (gate's and up's per-tensor scales into
    columns 0 / 1, input scales per shard) by that substring of the method's
    class name."""

    # The parameters exactly as vLLM's ModelOpt NVFP4 MoE method creates them:
    # names, shapes, dtypes, loaders and dummy-load values come from its own code.
    create_weights = ModelOptNvFp4FusedMoE.create_weights

    def __init__(self, quant_config: ModelOptNvFp4Config, moe_config: FusedMoEConfig):
        super().__init__(moe_config)
        self.quant_config = quant_config
        self.use_a16 = False
        # create_weights then allocates the input scales of every global expert and
        # the loader fills them on every rank: the static L1 scale is the max over
        # the whole layer on every rank (nvfp4moe.vllm.experts._input_scales).
        self.use_global_sf = True
        self.input_scales = input_scale_mode(quant_config)
        self.experts: Optional[NvFp4MoeExperts] = None

    def uses_weight_scale_2_pattern(self) -> bool:
        return True

    def get_fused_moe_quant_config(self, layer):
        return None  # no vLLM modular kernel runs for this layer

    def process_weights_after_loading(self, layer) -> None:
        if self.experts is not None:
            return
        n = int(layer.local_num_experts)
        expert_map = layer.expert_map
        if expert_map is None:
            expert_ids = torch.arange(n)
        else:
            # expert_map[global] = local or -1; the weights are in local order.
            m = expert_map.detach().cpu().long()
            local = torch.nonzero(m >= 0).reshape(-1)
            expert_ids = torch.empty(n, dtype=torch.int64)
            expert_ids[m[local]] = local
        par = self.moe.moe_parallel_config
        self.experts = make_experts(
            w13_weight=layer.w13_weight, w13_weight_scale=layer.w13_weight_scale,
            w13_weight_scale_2=layer.w13_weight_scale_2, w13_input_scale=layer.w13_input_scale,
            w2_weight=layer.w2_weight, w2_weight_scale=layer.w2_weight_scale,
            w2_weight_scale_2=layer.w2_weight_scale_2, w2_input_scale=layer.w2_input_scale,
            top_k=int(layer.top_k), expert_ids=expert_ids, swiglu_limit=layer.swiglu_limit,
            static_input_scales=self.input_scales == "static", device=layer.w13_weight.device,
            # vLLM's naive DP dispatch hands every rank the tokens of all DP ranks.
            max_tokens=max(int(self.moe.max_num_tokens), 1) * max(int(par.dp_size), 1))
        # The layer holds its own copy (nvfp4moe's layout, on the device): free vLLM's.
        for name in PARAM_NAMES:
            p = getattr(layer, name)
            replace_parameter(layer, name, torch.empty(0, dtype=p.dtype, device=p.device))
        logger.debug("nvfp4moe: %s: %d experts on %s, %s input scales", layer.layer_name, n,
                     self.experts.moe.device, self.input_scales)

    def apply(self, layer, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
              shared_experts=None, shared_experts_input=None) -> torch.Tensor:
        """The routed experts' weighted sum [T, H] in x's dtype; vLLM's
        runner adds the shared experts. topk_ids are GLOBAL ids: under expert
        parallelism they are mapped to this rank's local ids through
        expert_map (-1 for other ranks' experts, which contribute nothing
        here; vLLM combines the ranks' outputs)."""
        assert self.experts is not None, "process_weights_after_loading has not run"
        ids = topk_ids
        expert_map = layer.expert_map
        if expert_map is not None:
            local = expert_map[ids.clamp(min=0).long()].to(ids.dtype)
            ids = torch.where(ids >= 0, local, ids)
        return self.experts.apply(x, ids, topk_weights)
