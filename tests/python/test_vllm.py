"""The vLLM adapter against the native checkpoint loader: the same layer,
saved as a DeepSeek-V4 NVFP4 directory, read natively and handed over as
vLLM's ModelOptNvFp4FusedMoE parameters, gives the same output."""

import numpy as np
import pytest

import nvfp4moe
from conftest import requires_torch
from moe_factory import make_config, make_tensors

torch = pytest.importorskip("torch")
import nvfp4moe.vllm as nv  # noqa: E402


def _layer_dir(tmp_path, rng):
    cfg = make_config(64, 32, 8, 2, shared=0)
    t = make_tensors(cfg, rng)
    nvfp4moe.save_moe(str(tmp_path), 1, nvfp4moe._C.make_weights(cfg, **t))
    return cfg


def _vllm_params(w, device):
    """vLLM's parameter set, dtypes and shapes as ModelOptNvFp4FusedMoE.create_weights."""
    f8 = torch.float8_e4m3fn
    E = w.count
    return dict(
        w13_weight=torch.from_numpy(w.w13_weight).to(device),
        w13_weight_scale=torch.from_numpy(w.w13_weight_scale).view(f8).to(device),
        w13_weight_scale_2=torch.from_numpy(w.w13_weight_scale_2).to(device),
        # vLLM holds one input scale per expert and shard: [E, 2].
        w13_input_scale=torch.from_numpy(np.repeat(w.w13_input_scale[:, None], 2, 1)).to(device),
        w2_weight=torch.from_numpy(w.w2_weight).to(device),
        w2_weight_scale=torch.from_numpy(w.w2_weight_scale).view(f8).to(device),
        w2_weight_scale_2=torch.from_numpy(w.w2_weight_scale_2).to(device),
        w2_input_scale=torch.from_numpy(w.w2_input_scale).to(device),
    ) if E else None


def _check_adapter_matches_native(tmp_path, rng, device):
    cfg = _layer_dir(tmp_path, rng)
    for static in (True, False):
        native = nvfp4moe.load_moe(str(tmp_path), 1, device, static_input_scales=static)
        w = nvfp4moe.load_moe_weights(str(tmp_path), 1)
        params = _vllm_params(w, device)
        experts = nv.make_experts(top_k=2, swiglu_limit=cfg.swiglu_limit, static_input_scales=static, **params)
        T = 9
        x = torch.from_numpy(rng.standard_normal((T, 64)).astype(np.float32)).to(torch.bfloat16).to(device)
        ids = torch.from_numpy(np.stack([rng.permutation(8)[:2] for _ in range(T)])).to(device)  # int64 as vLLM
        ids[2, 1] = -1
        wts = torch.from_numpy(rng.uniform(0.1, 1.5, (T, 2)).astype(np.float32)).to(device)
        y = experts.apply(x, ids, wts)
        assert y.dtype == torch.bfloat16 and y.shape == (T, 64)
        y_native = native.forward(x, ids, wts)
        assert torch.equal(y, y_native), f"static={static}"
        y16 = experts.apply(x.to(torch.float16), ids, wts.double())
        assert y16.dtype == torch.float16
        assert torch.equal(y16, native.forward(x.to(torch.float16).float(), ids, wts).to(torch.float16))


@requires_torch
def test_adapter_matches_native_loader_cpu(tmp_path, rng):
    _check_adapter_matches_native(tmp_path, rng, "cpu")


def test_adapter_shape_errors(rng):
    cfg = make_config(64, 32, 8, 2, shared=0)
    t = make_tensors(cfg, rng)
    w = nvfp4moe._C.make_weights(cfg, **t)
    params = _vllm_params(w, "cpu")
    with pytest.raises(nvfp4moe.Error, match=r"w13_input_scale: shape \[8, 2, 1\]"):
        nv.make_experts(top_k=2, **{**params, "w13_input_scale": params["w13_input_scale"][..., None]})
    with pytest.raises(nvfp4moe.Error, match=r"static_input_scales=True needs"):
        nv.make_experts(top_k=2, static_input_scales=True, **{**params, "w2_input_scale": None})
    with pytest.raises(nvfp4moe.Error, match=r"w2_weight_scale: shape \[8, 64, 4\], dim 2 expected 2"):
        nv.make_experts(top_k=2, **{**params, "w2_weight_scale": torch.zeros(8, 64, 4, dtype=torch.uint8)})
    experts = nv.make_experts(top_k=2, **params)
    with pytest.raises(nvfp4moe.Error, match=r"topk_ids: shape \[3, 3\], expected \[tokens, top_k=2\]"):
        experts.apply(torch.zeros(3, 64), torch.zeros(3, 3, dtype=torch.int32), torch.zeros(3, 3))
