"""nvfp4moe: DeepSeek-V4 Mixture-of-Experts layers with NVFP4 expert weights
on NVIDIA Hopper GPUs (and a CPU reference backend).

Arrays cross into the library through DLPack without copies: NumPy on the
host, torch/CuPy on CUDA devices (work is queued on the caller's current
stream). Every bad input raises nvfp4moe.Error, a subclass of ValueError,
whose message names the argument and the offending values.

PyTorch integration (custom ops, DeepseekV4MoE module) lives in
nvfp4moe.torch, the vLLM adapter in nvfp4moe.vllm; both import torch only
when imported themselves. See docs/python.md.
"""

from ._C import Error, MoeConfig, MoeWeights, SafetensorsFile, built_with_cuda, cuda_available
from ._C import dsv4_flash_config, dsv4_pro_config, small_demo_config
from .format import dequantize, quantize, scales_to_linear, scales_to_swizzled, swizzled_shape
from .moe import (Moe, load_moe, load_moe_weights, model_layout, read_moe_config, save_moe, shared_expert_fp8,
                  summarize_moe_layers)

__version__ = "0.1.0"

__all__ = [
    "Error", "MoeConfig", "MoeWeights", "SafetensorsFile", "built_with_cuda", "cuda_available",
    "dsv4_flash_config", "dsv4_pro_config", "small_demo_config",
    "quantize", "dequantize", "scales_to_swizzled", "scales_to_linear", "swizzled_shape",
    "Moe", "load_moe", "load_moe_weights", "model_layout", "read_moe_config", "save_moe", "shared_expert_fp8",
    "summarize_moe_layers",
]
