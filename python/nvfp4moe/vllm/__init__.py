"""nvfp4moe for vLLM (docs/vllm.md).

- The vLLM plugin: `register()` is the `vllm.general_plugins` entry point
  (pyproject.toml); vLLM calls it in every process it starts. It makes
  ModelOpt NVFP4 MoE layers run on nvfp4moe on SM90 and on vLLM's CPU
  platform (`plugin.py`, the method in `method.py`).
- The adapter underneath, usable without vLLM: `make_experts` and friends
  build the routed experts from vLLM's ModelOptNvFp4FusedMoE parameters
  (`experts.py`); `expert_param` / `params_from_checkpoint` map checkpoint
  tensors of either layout onto those parameters (`checkpoint.py`).

Importing this package imports torch, never vLLM; `register()` imports vLLM.
"""

from .checkpoint import expert_param, make_experts_from_checkpoint, params_from_checkpoint
from .experts import NvFp4MoeExperts, make_experts, make_experts_from_layer


def register() -> None:
    """Installs the nvfp4moe MoE method into vLLM (idempotent); vLLM's
    plugin loader calls it. NVFP4MOE_VLLM=0 leaves vLLM unchanged."""
    from .plugin import register as _register

    _register()


__all__ = ["NvFp4MoeExperts", "expert_param", "make_experts", "make_experts_from_checkpoint",
           "make_experts_from_layer", "params_from_checkpoint", "register"]
