"""Registration of nvfp4moe in vLLM (docs/vllm.md). Imports vLLM.

vLLM 0.33 builds ModelOptNvFp4FusedMoE for a RoutedExperts layer in three
quantization configs (vllm/model_executor/layers/quantization/modelopt.py,
vllm/models/deepseek_v4/quant_config.py, vllm/models/deepseek_v41/quant_config.py):
- "modelopt_fp4", ModelOptNvFp4Config.get_quant_method (quant_algo NVFP4);
- "modelopt_mixed", ModelOptMixedPrecisionConfig.get_quant_method (a layer
  whose quantized_layers entry says NVFP4; DeepSeek-V4 NVFP4 checkpoints);
- "deepseek_v4_fp8", DeepseekV4FP8Config.get_quant_method (NVFP4 routed
  experts of DeepSeek's own FP8 checkpoints).
register() re-registers each name, through vLLM's out-of-tree hook
register_quantization_config (vllm/model_executor/layers/quantization/__init__.py),
with a subclass whose get_quant_method returns the nvfp4moe method for those
layers where nvfp4moe supports them (method.unsupported) and hands every other
layer, and every other platform, to vLLM's own code unchanged.
"""

from __future__ import annotations

import os

from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.quantization import get_quantization_config, register_quantization_config
from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig, ModelOptNvFp4Config
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped

from .method import Nvfp4moeModelOptNvFp4FusedMoE, unsupported

logger = init_logger(__name__)

_done = False


def enabled() -> bool:
    """False when NVFP4MOE_VLLM is 0 / off / false / no."""
    return os.environ.get("NVFP4MOE_VLLM", "1").strip().lower() not in ("0", "off", "false", "no")


def method_for(quant_config: ModelOptNvFp4Config, layer, prefix: str):
    """The nvfp4moe method for an NVFP4 RoutedExperts layer, or None (with
    the reason logged once) where vLLM's own method must run it."""
    reason = unsupported(quant_config, layer)
    if reason is not None:
        logger.info_once("nvfp4moe: vLLM's own NVFP4 MoE method runs %s: %s", prefix, reason)
        return None
    logger.info_once("nvfp4moe: routed experts of ModelOpt NVFP4 MoE layers run on nvfp4moe")
    return Nvfp4moeModelOptNvFp4FusedMoE(quant_config, layer.moe_config)


class Nvfp4moeModelOptNvFp4Config(ModelOptNvFp4Config):
    """"modelopt_fp4" with NVFP4 MoE layers on nvfp4moe."""

    def get_quant_method(self, layer, prefix):
        # The same gates as ModelOptQuantConfigBase.get_quant_method before its
        # RoutedExperts branch: excluded layers and vision towers keep vLLM's answer.
        if (isinstance(layer, RoutedExperts) and not self.is_layer_excluded(prefix)
                and not any(s in prefix for s in ("vision_tower", "vision_model", "vit_large_projector"))):
            method = method_for(self, layer, prefix)
            if method is not None:
                return method
        return super().get_quant_method(layer, prefix)


class Nvfp4moeModelOptMixedPrecisionConfig(ModelOptMixedPrecisionConfig):
    """"modelopt_mixed" with its NVFP4 MoE layers on nvfp4moe."""

    def get_quant_method(self, layer, prefix):
        if (isinstance(layer, RoutedExperts) and not self.is_layer_excluded(prefix)
                and self._resolve_quant_algo(prefix) == "NVFP4"):
            method = method_for(self.nvfp4_config, layer, prefix)
            if method is not None:
                return method
        return super().get_quant_method(layer, prefix)


class _DeepseekV4Nvfp4moe:
    """Mixed into vLLM's DeepSeek-V4 FP8 config (the class vLLM picks for the
    platform): its NVFP4 routed experts on nvfp4moe."""

    def _nvfp4_experts(self, prefix: str) -> bool:
        if self.expert_dtype != "fp4":
            return False
        if hasattr(self, "_is_nvfp4_expert_layer"):  # deepseek_v41's per-layer rule
            return bool(self._is_nvfp4_expert_layer(prefix))
        return self.moe_quant_algo == "NVFP4"

    def get_quant_method(self, layer, prefix):
        if (isinstance(layer, RoutedExperts)
                and not is_layer_skipped(prefix=prefix, ignored_layers=self.ignored_layers,
                                         fused_mapping=self.packed_modules_mapping)
                and self._nvfp4_experts(prefix)):
            method = method_for(self._get_nvfp4_config(), layer, prefix)
            if method is not None:
                return method
        return super().get_quant_method(layer, prefix)


def register() -> None:
    """Re-registers the three configs with their nvfp4moe subclasses; once
    per process (vLLM may call general plugins more than once)."""
    global _done
    if _done or not enabled():
        return
    deepseek_base = get_quantization_config("deepseek_v4_fp8")  # before ours replaces it
    register_quantization_config("modelopt_fp4")(Nvfp4moeModelOptNvFp4Config)
    register_quantization_config("modelopt_mixed")(Nvfp4moeModelOptMixedPrecisionConfig)
    if not issubclass(deepseek_base, _DeepseekV4Nvfp4moe):
        deepseek = type(f"Nvfp4moe{deepseek_base.__name__}", (_DeepseekV4Nvfp4moe, deepseek_base),
                        {"__module__": __name__, "__doc__": _DeepseekV4Nvfp4moe.__doc__})
        register_quantization_config("deepseek_v4_fp8")(deepseek)
    _done = True
