"""The DeepSeek-V4 NVFP4 MoE layer (docs/numerics.md §5) from Python: build it from
a checkpoint directory (`load_moe`), from tensors (`Moe.from_tensors`) or a
synthetic seed (`Moe.synthetic`), and call `forward`."""

from __future__ import annotations

import numpy as np

from . import _C
from ._arrays import (as_input, bf16_bits_to_f32, device_index, device_of, empty_like, framework, is_cuda,
                      stream_of)
from ._C import Error, MoeConfig, MoeWeights


def _parse_device(device) -> tuple[str, int]:
    """"cpu" | "cuda" | "cuda:N" | torch.device -> (backend, index)."""
    s = str(device)
    if s == "cpu":
        return "cpu", 0
    if s == "cuda":
        return "cuda", 0
    if s.startswith("cuda:") and s[5:].isdigit():
        return "cuda", int(s[5:])
    raise Error(f"device: unknown device {s!r}, expected 'cpu', 'cuda' or 'cuda:N'")


def _host(a, name):
    """An array for MoeWeights construction: host memory, float8 as uint8."""
    if a is None:
        return None
    if framework(a) == "torch" and a.device.type != "cpu":
        a = a.detach().cpu()
    elif framework(a) == "cupy":
        a = a.get()
    return as_input(a, name)


class Moe:
    """One MoE layer on one backend ("cpu" or "cuda[:N]").

    forward(x) takes x [T, H] (float32 or bfloat16) on the Moe's device and
    returns y [T, H] BF16: a torch tensor for torch input; for NumPy input a
    float32 array holding the BF16 values exactly (NumPy has no bfloat16).
    Expert ids are GLOBAL in [0, E), -1 = empty slot (docs/numerics.md §6).
    """

    def __init__(self, weights: MoeWeights, device="cpu", *, threads: int = 0, max_tokens: int = 8192,
                 checked: bool = False, consume: bool = False, has_router: bool = True, fp8_mma: bool = False):
        backend, index = _parse_device(device)
        self._device = "cpu" if backend == "cpu" else f"cuda:{index}"
        self._has_router = has_router
        self._impl = _C.Moe(weights, backend, index, threads, max_tokens, checked, consume, fp8_mma)
        self._config = self._impl.config

    # ---- construction --------------------------------------------------
    @classmethod
    def from_tensors(cls, config: MoeConfig, *, w13_weight, w13_weight_scale, w13_weight_scale_2, w2_weight,
                     w2_weight_scale, w2_weight_scale_2, w13_input_scale=None, w2_input_scale=None,
                     first_expert: int = 0, router_gate=None, router_bias=None, tid2eid=None, shared_w1=None,
                     shared_w3=None, shared_w2=None, device="cpu", **options) -> "Moe":
        """A Moe from expert tensors in the layout of vLLM's
        ModelOptNvFp4FusedMoE (see docs/vllm.md): w13_weight uint8 [n, 2I, H/2]
        (gate rows, then up rows), w13_weight_scale UE4M3 [n, 2I, H/16] (linear),
        w13_weight_scale_2 float32 [n, 2] (gate g, up g), w2_weight [n, H, I/2],
        w2_weight_scale [n, H, I/16], w2_weight_scale_2 [n]; optional
        per-expert input scales [n]. n local experts starting at global id
        `first_expert`. Without router_gate, forward needs topk_ids/topk_weights.
        Tensors may live anywhere; they are copied to the host, then uploaded."""
        weights = _C.make_weights(
            config, _host(w13_weight, "w13_weight"), _host(w13_weight_scale, "w13_weight_scale"),
            _host(w13_weight_scale_2, "w13_weight_scale_2"), _host(w2_weight, "w2_weight"),
            _host(w2_weight_scale, "w2_weight_scale"), _host(w2_weight_scale_2, "w2_weight_scale_2"),
            _host(w13_input_scale, "w13_input_scale"), _host(w2_input_scale, "w2_input_scale"), int(first_expert),
            _host(router_gate, "router_gate"), _host(router_bias, "router_bias"), _host(tid2eid, "tid2eid"),
            _host(shared_w1, "shared_w1"), _host(shared_w3, "shared_w3"), _host(shared_w2, "shared_w2"))
        return cls(weights, device, consume=True, has_router=router_gate is not None, **options)

    @classmethod
    def synthetic(cls, config: MoeConfig, seed: int, device="cpu", **options) -> "Moe":
        """A deterministic synthetic layer (random weights quantized to NVFP4)."""
        return cls(_C.synthetic_weights(config, seed), device, consume=True, **options)

    # ---- properties ------------------------------------------------------
    @property
    def config(self) -> MoeConfig:
        """A copy of the layer's configuration."""
        return self._config.copy()

    @property
    def device(self) -> str:
        return self._device

    @property
    def backend(self) -> str:
        return self._impl.backend

    @property
    def prefill_mma(self) -> str:
        """The routed experts' prefill GEMM form chosen at load: "fp8", "bf16",
        "bf16 (<why not fp8>)", or "none" on the CPU (docs/kernels.md)."""
        return self._impl.prefill_mma

    # ---- forward ---------------------------------------------------------
    def forward(self, x, topk_ids=None, topk_weights=None, token_ids=None, *, return_topk: bool = False,
                stream=None):
        """y = MoE(x). With topk_ids/topk_weights ([T, k], int32/int64 GLOBAL
        ids or -1, float32 weights) the router is skipped; token_ids [T] are
        needed by hash-routed layers. return_topk=True returns (y, topk_ids,
        topk_weights) — the router's choice, or the given routing."""
        shape = tuple(x.shape)
        if len(shape) != 2:
            raise Error(f"x: expected a 2-D [tokens, hidden] array, got shape {list(shape)}")
        if (topk_ids is None) != (topk_weights is None):
            raise Error("topk_ids and topk_weights must be given together")
        if topk_ids is None and not self._has_router:
            raise Error("this Moe was built without router weights: pass topk_ids and topk_weights")
        if device_of(x) != self._device:
            raise Error(f"x: on {device_of(x)}, but this Moe runs on {self._device}")
        T, H = shape
        k = self._config.top_k
        fw = framework(x)
        y = empty_like(x, (T, H), "bfloat16")
        ids_out = w_out = None
        if return_topk and topk_ids is None:
            ids_out = empty_like(x, (T, k), "int32")
            w_out = empty_like(x, (T, k), "float32")
        self._impl.forward(as_input(x, "x"), as_input(topk_ids, "topk_ids"), as_input(topk_weights, "topk_weights"),
                           as_input(token_ids, "token_ids"), y, ids_out, w_out, stream_of(x, stream))
        if fw == "numpy":
            y = bf16_bits_to_f32(y)
        if not return_topk:
            return y
        if topk_ids is not None:
            ids_out, w_out = _routing_copy(topk_ids, topk_weights)
        return y, ids_out, w_out

    __call__ = forward

    def sync_errors(self) -> None:
        """Waits for the device and raises nvfp4moe.Error if it recorded an
        error since the last call (e.g. an expert id outside [-1, E))."""
        self._impl.sync_errors()

    def __repr__(self) -> str:
        return f"Moe(device={self._device!r}, {self._config!r})"


def _routing_copy(ids, weights):
    fw = framework(ids)
    if fw == "torch":
        import torch

        return ids.to(torch.int32).clone(), weights.to(torch.float32).clone()
    return ids.astype(np.int32, copy=True), weights.astype(np.float32, copy=True)


def read_moe_config(model_dir: str, layer: int, *, mtp: bool = False) -> MoeConfig:
    """Layer `layer`'s (or MTP block `layer`'s) MoE config from the directory's
    config.json (transformers' or DeepSeek's key names)."""
    return _C.read_moe_config(str(model_dir), int(layer), bool(mtp))


def load_moe_weights(model_dir: str, layer: int, *, static_input_scales: bool = False, first_expert: int = 0,
                     expert_count: int = -1, mtp: bool = False) -> MoeWeights:
    """The weights of one layer in host memory: ModelOpt NVFP4 routed experts,
    router, BF16 or block-scaled FP8 shared expert, from a directory of either
    layout. mtp=True reads MTP block `layer` (mtp.{layer}.ffn). Routed experts
    in another format (the official release's MXFP4, ...) raise Error."""
    return _C.load_moe_weights(str(model_dir), int(layer), static_input_scales, static_input_scales,
                               int(first_expert), int(expert_count), bool(mtp))


def load_moe(model_dir: str, layer: int, device="cpu", *, static_input_scales: bool = False,
             first_expert: int = 0, expert_count: int = -1, mtp: bool = False, **options) -> Moe:
    """Loads layer `layer` of a DeepSeek-V4 NVFP4 directory, in DeepSeek's
    layout (layers.L.ffn.*, as NVIDIA publishes it) or Hugging Face's
    (model.layers.L.mlp.*), onto `device` (docs/checkpoints.md, docs/numerics.md §4).
    static_input_scales=True quantizes activations with the checkpoint's
    input_scale instead of per token. first_expert/expert_count load one
    expert-parallel rank's experts; mtp=True loads MTP block `layer`.
    options: threads, max_tokens, checked, fp8_mma."""
    weights = load_moe_weights(model_dir, layer, static_input_scales=static_input_scales,
                               first_expert=first_expert, expert_count=expert_count, mtp=mtp)
    return Moe(weights, device, consume=True, **options)


def save_moe(model_dir: str, layer: int, weights: MoeWeights, *, layout: str = "huggingface") -> None:
    """Writes `weights` as layer `layer` of a DeepSeek-V4 NVFP4 directory in
    `layout`: "huggingface" (model.layers.L.mlp.*) or "deepseek"
    (layers.L.ffn.*, DeepSeek's config keys, ModelOpt's MIXED_PRECISION
    hf_quant_config.json)."""
    _C.save_moe_layer(str(model_dir), int(layer), weights, str(layout))


def model_layout(model_dir: str) -> str:
    """"deepseek" or "huggingface": the naming of the directory's tensors."""
    return _C.model_layout(str(model_dir))


def summarize_moe_layers(model_dir: str, *, read_values: bool = True) -> list:
    """One dict per MoE layer (and MTP block) of a checkpoint, from its headers:
    routed_format, shared_format, router, bias, loadable, scale ranges,
    problems (as `nvfp4moe inspect --json` reports them under moe_layers)."""
    return _C.summarize_moe_layers(str(model_dir), bool(read_values))


def shared_expert_fp8(weights: MoeWeights):
    """The block-scaled FP8 shared expert of loaded weights as NumPy arrays:
    w1, w3 [Is, H] and w2 [H, Is] E4M3 bit patterns (uint8), w1_scale,
    w3_scale [ceil(Is/128), ceil(H/128)] and w2_scale float32 tile factors;
    None when the shared expert is BF16 (shared_w1, ...) or absent."""
    return _C.shared_expert_fp8(weights)
