"""The vLLM plugin inside the real vLLM (skipped without vLLM): registration,
a MoE layer built by vLLM's FusedMoEFactory from a checkpoint of each layout
(written by nvfp4moe.save_moe, resolved by vLLM's ModelConfig, loaded by
vLLM's weight-loader callbacks), `apply` and the MoE runner's forward
against nvfp4moe's native loader and the float64 reference, and an
expert-parallel rank's id mapping.

Without a GPU vLLM runs on its CPU platform (VLLM_TARGET_DEVICE=cpu) and the
plugin on nvfp4moe's CPU backend. What that does not cover is listed in
docs/vllm.md ("What is tested where")."""

import json
import os
import socket
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # read when vLLM first resolves its platform
vllm = pytest.importorskip("vllm")

import nvfp4moe  # noqa: E402
import nvfp4moe.vllm as nv  # noqa: E402
import spec_ref  # noqa: E402
from moe_factory import make_config, make_tensors  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config  # noqa: E402

if not torch.cuda.is_available():
    # vLLM from 0.34 refuses its x86 CPU platform without triton-cpu (a CPU
    # build of Triton, not on PyPI): CpuPlatform.check_and_update_config
    # raises "vLLM on x86 CPUs requires Triton". These tests run no Triton
    # kernel (the plugin computes on nvfp4moe's CPU backend), so where that
    # is the one refusal, vLLM is told Triton is there.
    try:
        VllmConfig()
    except RuntimeError as e:
        if "requires Triton" not in str(e):
            raise
        import vllm.triton_utils

        vllm.triton_utils.HAS_TRITON = True
from vllm.model_executor.layers.fused_moe import FusedMoEFactory, fused_moe_make_expert_params_mapping  # noqa: E402
from vllm.model_executor.layers.quantization import get_quantization_config  # noqa: E402

nv.register()
from nvfp4moe.vllm import method as nvm, plugin  # noqa: E402

H, I, E, K, RHO = 64, 32, 8, 2, 1.5
PREFIX = {"deepseek": "model.layers.1.ffn.experts", "huggingface": "model.layers.1.mlp.experts"}


@pytest.fixture(scope="module")
def distributed():
    """vLLM's process groups, world size 1 (gloo), once for the module."""
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if not model_parallel_is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with set_current_vllm_config(VllmConfig()):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"tcp://127.0.0.1:{port}")
            initialize_model_parallel(1, 1)


def _checkpoint(tmp_path, rng, layout):
    cfg = make_config(H, I, E, K, shared=0, rho=RHO)
    t = make_tensors(cfg, rng)
    nvfp4moe.save_moe(str(tmp_path), 1, nvfp4moe._C.make_weights(cfg, **t), layout=layout)
    # transformers 5.x validates config fields strictly; the writer emits the
    # integer 10 for swiglu_limit, which DeepseekV4Config rejects (float).
    p = tmp_path / "config.json"
    c = json.loads(p.read_text())
    c["swiglu_limit"] = float(c["swiglu_limit"])
    p.write_text(json.dumps(c))
    return cfg, t


def _route(logits, bias):
    """DeepSeek-V4's router (sqrtsoftplus scores + selection bias, weights
    normalised and scaled by rho) in float64, as spec_ref.route."""
    s = torch.nn.functional.softplus(logits.double()).sqrt()
    ids = torch.topk(s + bias.double(), K, dim=1).indices
    w = torch.gather(s, 1, ids)
    return (RHO * w / w.sum(1, keepdim=True)).float(), ids.to(torch.int32)


def _build(layout, vc, bias):
    """The layer as vLLM's DeepSeek-V4 model builds it (vllm/models/deepseek_v4/
    nvidia/model.py, DeepseekV4MoE._init_fused_moe_experts), but with a torch
    router: vLLM's CPU router needs vLLM's CPU build (torch.ops._C)."""
    kw = dict(ckpt_names=("w1", "w2", "w3")) if layout == "deepseek" else {}
    return FusedMoEFactory(num_experts=E, top_k=K, hidden_size=H, intermediate_size=I, params_dtype=torch.bfloat16,
                           quant_config=vc.quant_config, prefix=PREFIX[layout], swiglu_limit=10.0,
                           renormalize=True, router_logits_dtype=torch.float32,
                           custom_routing_function=lambda hidden_states, gating_output, topk, renormalize:
                           _route(gating_output, bias), **kw)


def _load(runner, tensors, layout):
    """Checkpoint tensors through vLLM's weight-loader callbacks."""
    prefix = PREFIX[layout]
    if layout == "deepseek":
        # DeepseekV4Model.load_weights: the mapper's "layers." -> "model.layers."
        # prefix, then get_expert_mapping (w1/w2/w3) and each parameter's loader.
        mapping = fused_moe_make_expert_params_mapping(runner, "w1", "w2", "w3", E)
        params = {f"{prefix}.{n}": p for n, p in runner.named_parameters()}
        loaded = set()
        for name, w in tensors.items():
            if ".experts." not in name:
                continue
            name = "model." + name
            for param_name, weight_name, expert_id, shard in mapping:
                if weight_name in name:
                    target = name.replace(weight_name, param_name)
                    p = params[target]
                    assert p.weight_loader(p, w, target, shard_id=shard, expert_id=expert_id, return_success=True)
                    loaded.add(name)
                    break
        return loaded
    # Hugging Face names: RoutedExperts.load_weights with its default
    # gate_proj / down_proj / up_proj mapping (names relative to the layer).
    rel = [(n[len(prefix) + 1:], w) for n, w in tensors.items() if n.startswith(prefix + ".")]
    return list(runner.load_weights(rel))


class Layer:
    """A checkpoint of one layout and a vLLM MoE layer built from it; each
    build() gets its own VllmConfig (vLLM registers layers by name in it)."""

    def __init__(self, layout, tmp_path, rng):
        self.layout, self.dir = layout, str(tmp_path)
        self.cfg, self.t = _checkpoint(tmp_path, rng, layout)
        self.tensors = load_file(str(tmp_path / "model.safetensors"))
        self.gate = torch.from_numpy(self.t["router_gate"])
        self.bias = torch.from_numpy(self.t["router_bias"])
        self.build()

    def build(self):
        self.vc = VllmConfig(model_config=ModelConfig(model=self.dir, skip_tokenizer_init=True, dtype="bfloat16"))
        with set_current_vllm_config(self.vc):
            self.runner = _build(self.layout, self.vc, self.bias)
        self.experts = self.runner.routed_experts
        return self

    def load(self):
        """Loads the checkpoint and runs process_weights_after_loading."""
        _load(self.runner, self.tensors, self.layout)
        self.experts.quant_method.process_weights_after_loading(self.experts)
        return self.experts


@pytest.fixture(params=["deepseek", "huggingface"])
def layer(request, tmp_path, rng, distributed):
    return Layer(request.param, tmp_path, rng)


def test_entry_point_and_registration():
    tomllib = pytest.importorskip("tomllib")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    assert eps == {"nvfp4moe": "nvfp4moe.vllm:register"}
    expected = {"modelopt_fp4": plugin.Nvfp4moeModelOptNvFp4Config,
                "modelopt_mixed": plugin.Nvfp4moeModelOptMixedPrecisionConfig}
    for name, cls in expected.items():
        assert get_quantization_config(name) is cls
    dsv4 = get_quantization_config("deepseek_v4_fp8")
    assert issubclass(dsv4, plugin._DeepseekV4Nvfp4moe) and dsv4.get_name() == "deepseek_v4_fp8"
    nv.register()  # vLLM may call it again: nothing changes
    assert get_quantization_config("deepseek_v4_fp8") is dsv4
    assert nvm.platform_unsupported() is None  # vLLM's CPU platform (or SM90) in this process


def test_layer_parameters_and_loading(layer):
    """Each layout resolves to its vLLM quantization config, the layer gets
    the plugin's method with ModelOptNvFp4FusedMoE's parameters, vLLM's loader
    fills them from the checkpoint, and process_weights_after_loading frees them."""
    runner, t = layer.runner, layer.t
    want_cfg = {"deepseek": "deepseek_v4_fp8", "huggingface": "modelopt_fp4"}[layer.layout]
    assert layer.vc.quant_config.get_name() == want_cfg
    experts = runner.routed_experts
    assert type(experts.quant_method) is nvm.Nvfp4moeModelOptNvFp4FusedMoE
    f8, u8, f32 = torch.float8_e4m3fn, torch.uint8, torch.float32
    want = {"w13_weight": ((E, 2 * I, H // 2), u8), "w2_weight": ((E, H, I // 2), u8),
            "w13_weight_scale": ((E, 2 * I, H // 16), f8), "w2_weight_scale": ((E, H, I // 16), f8),
            "w13_weight_scale_2": ((E, 2), f32), "w2_weight_scale_2": ((E,), f32),
            "w13_input_scale": ((E, 2), f32), "w2_input_scale": ((E,), f32)}
    got = {n: (tuple(p.shape), p.dtype) for n, p in experts.named_parameters()}
    assert got == want
    loaded = _load(runner, layer.tensors, layer.layout)
    assert len(loaded) == E * 3 * 4
    assert np.array_equal(experts.w13_weight.numpy(), t["w13_weight"])
    assert np.array_equal(experts.w13_weight_scale.view(u8).numpy(), t["w13_weight_scale"])
    assert np.array_equal(experts.w2_weight.numpy(), t["w2_weight"])
    assert np.array_equal(experts.w2_weight_scale.view(u8).numpy(), t["w2_weight_scale"])
    assert np.array_equal(experts.w13_weight_scale_2.numpy(), t["w13_weight_scale_2"])
    assert np.array_equal(experts.w2_weight_scale_2.numpy(), t["w2_weight_scale_2"])
    assert np.array_equal(experts.w13_input_scale.numpy(), np.repeat(t["w13_input_scale"][:, None], 2, 1))
    assert np.array_equal(experts.w2_input_scale.numpy(), t["w2_input_scale"])
    experts.quant_method.process_weights_after_loading(experts)
    assert all(p.numel() == 0 for p in experts.parameters()), "vLLM's copy of the experts is still held"


@pytest.mark.parametrize("scales", ["static", "dynamic"])
def test_apply_matches_native_and_reference(layer, rng, scales, monkeypatch):
    monkeypatch.setenv("NVFP4MOE_VLLM_INPUT_SCALES", scales)
    experts = layer.build().load()  # the method reads the option when vLLM builds it
    assert experts.quant_method.input_scales == scales
    T = 11
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16)
    ids = torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32))
    ids[3, 1] = -1
    w = torch.from_numpy(rng.uniform(0.1, 1.5, (T, K)).astype(np.float32))
    y = experts.quant_method.apply(experts, x, w, ids, None, None)
    assert y.dtype == torch.bfloat16 and y.shape == (T, H)
    native = nvfp4moe.load_moe(layer.dir, 1, "cpu", static_input_scales=scales == "static")
    assert torch.equal(y, native.forward(x, ids, w))
    assert torch.equal(experts.quant_method.apply(experts, x, w, ids.long(), None, None), y)
    ref_w = spec_ref.dequantize_experts(nvfp4moe.load_moe_weights(layer.dir, 1))
    t = layer.t
    static = dict(static_l1=float(t["w13_input_scale"].max()), static_l2=t["w2_input_scale"]) \
        if scales == "static" else {}
    y_ref = spec_ref.moe_forward(x.float().numpy(), ref_w, ids.numpy(), w.numpy(), 10.0, **static)
    assert spec_ref.rel_l2(y.float().numpy(), y_ref) <= 1e-2
    assert spec_ref.rel_l2(y[3].float().numpy(), y_ref[3]) <= 1e-2  # the token with an empty slot


def test_runner_forward(layer, rng):
    """MoERunner.forward (router, the plugin's apply, combine) against the
    native layer with its own DeepSeek-V4 router on the same weights."""
    from vllm.forward_context import set_forward_context

    experts = layer.load()
    T = 9
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16)
    logits = x.float() @ layer.gate.T
    with set_current_vllm_config(layer.vc), set_forward_context(None, layer.vc):
        y = layer.runner(x, logits)
    w, ids = _route(logits, layer.bias)
    assert torch.equal(y, experts.quant_method.apply(experts, x, w, ids))
    native = nvfp4moe.load_moe(layer.dir, 1, "cpu", static_input_scales=True)
    y_native, ids_native, _ = native.forward(x, return_topk=True)
    same = (torch.sort(ids_native, 1).values == torch.sort(ids, 1).values).all(1)
    assert same.sum() >= T - 1, "the torch router and nvfp4moe's pick different experts"
    assert spec_ref.rel_l2(y[same].float().numpy(), y_native[same].float().numpy()) <= 1e-2


@pytest.mark.parametrize("placement", ["linear", "round_robin"])
def test_expert_parallel_rank(layer, rng, placement):
    """One rank of EP=2 (vLLM's determine_expert_map; one process cannot form
    vLLM's EP group, so the rank's layer is a stand-in with RoutedExperts'
    attributes): GLOBAL ids in, this rank's experts out, equal to the whole
    layer restricted to those experts (the static L1 scale is the layer-wide
    max on every rank)."""
    from types import SimpleNamespace

    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map

    experts = layer.runner.routed_experts
    _load(layer.runner, layer.tensors, layer.layout)
    full = {n: p.data.clone() for n, p in experts.named_parameters()}
    native = nvfp4moe.load_moe(layer.dir, 1, "cpu", static_input_scales=True)
    T = 10
    x = torch.from_numpy(rng.standard_normal((T, H)).astype(np.float32)).to(torch.bfloat16)
    ids = torch.from_numpy(np.stack([rng.permutation(E)[:K] for _ in range(T)]).astype(np.int32))
    w = torch.from_numpy(rng.uniform(0.1, 1.5, (T, K)).astype(np.float32))
    for rank in range(2):
        n, emap, _ = determine_expert_map(2, rank, E, placement)
        mine = torch.nonzero(emap >= 0).reshape(-1)[torch.argsort(emap[emap >= 0])]
        local = {k: v[mine] if k not in ("w13_input_scale", "w2_input_scale") else v for k, v in full.items()}
        stand_in = SimpleNamespace(local_num_experts=n, expert_map=emap, top_k=K, swiglu_limit=10.0,
                                   layer_name=f"rank{rank}", **local)
        method = nvm.Nvfp4moeModelOptNvFp4FusedMoE(experts.quant_method.quant_config, experts.moe_config)
        method.process_weights_after_loading(stand_in)
        y = method.apply(stand_in, x, w, ids)
        masked = torch.where(emap[ids.long()] >= 0, ids, torch.full_like(ids, -1))
        assert torch.equal(y, native.forward(x, masked, w)), f"rank {rank} ({placement})"


def test_fallbacks(layer, monkeypatch):
    """Layers nvfp4moe cannot run stay with vLLM's method, with the reason."""
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    experts = layer.runner.routed_experts
    assert nvm.unsupported(ModelOptNvFp4Config("NVFP4", True, None, [], 16), experts) is None
    a16 = ModelOptNvFp4Config("W4A16_NVFP4", True, None, [], 16)
    assert "W4A4 NVFP4 only" in nvm.unsupported(a16, experts)
    monkeypatch.setenv("NVFP4MOE_VLLM_INPUT_SCALES", "per_block")
    with pytest.raises(ValueError, match="NVFP4MOE_VLLM_INPUT_SCALES='per_block'"):
        nvm.input_scale_mode(a16)
    monkeypatch.setenv("NVFP4MOE_VLLM", "0")
    assert not plugin.enabled()
