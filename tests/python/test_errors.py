"""Every bad input of docs/numerics.md §6 that the Python API can receive raises
nvfp4moe.Error (a ValueError) whose message names the problem."""

import numpy as np
import pytest

import nvfp4moe
from moe_factory import make_config, make_tensors


def raises(match):
    return pytest.raises(nvfp4moe.Error, match=match)


def test_error_is_a_value_error():
    assert issubclass(nvfp4moe.Error, ValueError)


# ---- format --------------------------------------------------------------------

def test_quantize_bad_inputs():
    x = np.zeros((4, 32), np.float32)
    with raises(r"K \(the last dimension\) must be a multiple of 16, got K=24"):
        nvfp4moe.quantize(np.zeros((4, 24), np.float32))
    with raises(r"x: expected a 2-D array, got shape \[64\]"):
        nvfp4moe.quantize(np.zeros(64, np.float32))
    with raises(r"x: dtype F64, expected float32 or bfloat16"):
        nvfp4moe.quantize(np.zeros((4, 32), np.float64))
    with raises(r"x: must be contiguous"):
        nvfp4moe.quantize(np.zeros((4, 64), np.float32)[:, ::2])
    with raises(r"x: must be contiguous"):
        nvfp4moe.quantize(np.asfortranarray(np.zeros((4, 32), np.float32)))
    with raises(r"scope: unknown scope 'per_token'"):
        nvfp4moe.quantize(x, scope="per_token")
    with raises(r"layout: unknown layout 'tiled'"):
        nvfp4moe.quantize(x, layout="tiled")
    with raises(r"scope 'static' needs a global scale"):
        nvfp4moe.quantize(x, scope="static")
    with raises(r"only scope 'static' takes a global scale"):
        nvfp4moe.quantize(x, global_scale=1.0)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with raises(r"static global scale must be finite and > 0"):
            nvfp4moe.quantize(x, scope="static", global_scale=bad)
    with raises(r"global_scale: a static global scale must be finite and > 0, got nan"):
        nvfp4moe.quantize(x, scope="static", global_scale=np.array([np.nan], np.float32))
    with raises(r"global_scale: expected one value, got shape \(2,\)"):
        nvfp4moe.quantize(x, scope="static", global_scale=np.ones(2, np.float32))
    with raises(r"expected a NumPy array, a torch.Tensor or a CuPy array, got list"):
        nvfp4moe.quantize([[0.0] * 16])


def test_low_level_output_checks():
    """The C++ side checks caller-allocated outputs too (shape, dtype)."""
    x = np.zeros((4, 32), np.float32)
    g = np.zeros(4, np.float32)
    with raises(r"codes: shape \[4, 8\], dim 1 expected 16"):
        nvfp4moe._C.quantize(x, "per_row", None, np.zeros((4, 8), np.uint8), np.zeros((4, 2), np.uint8), g,
                             "linear", 0)
    with raises(r"scales: shape \[4, 2\], dim 0 expected 128"):
        nvfp4moe._C.quantize(x, "per_row", None, np.zeros((4, 16), np.uint8), np.zeros((4, 2), np.uint8), g,
                             "swizzled", 0)
    with raises(r"global_scale: dtype F64, expected F32"):
        nvfp4moe._C.quantize(x, "per_row", None, np.zeros((4, 16), np.uint8), np.zeros((4, 2), np.uint8),
                             np.zeros(4), "linear", 0)
    with raises(r"global_scale: shape \[4\], dim 0 expected 1"):
        nvfp4moe._C.quantize(x, "per_tensor", None, np.zeros((4, 16), np.uint8), np.zeros((4, 2), np.uint8), g,
                             "linear", 0)


def test_dequantize_and_layout_bad_inputs():
    codes = np.zeros((4, 16), np.uint8)
    scales = np.zeros((4, 2), np.uint8)
    with raises(r"global_scale: shape \[3\], expected \[1\] or \[rows=4\]"):
        nvfp4moe.dequantize(codes, scales, np.ones(3, np.float32))
    with raises(r"scales: shape \[4, 3\], dim 1 expected 2"):
        nvfp4moe.dequantize(codes, np.zeros((4, 3), np.uint8), np.ones(1, np.float32))
    with raises(r"codes: K = 2 \* 4 = 8 is not a multiple of 16"):
        nvfp4moe.dequantize(np.zeros((4, 4), np.uint8), scales, 1.0)
    with raises(r"dtype: unknown dtype 'float16'"):
        nvfp4moe.dequantize(codes, scales, 1.0, dtype="float16")
    with raises(r"scales: shape \[4, 4\], dim 0 expected 128"):
        nvfp4moe.scales_to_linear(np.zeros((4, 4), np.uint8), 4, 4)
    with raises(r"scales: expected a 2-D array"):
        nvfp4moe.scales_to_swizzled(np.zeros(8, np.uint8))


# ---- the MoE layer ---------------------------------------------------------------

@pytest.fixture
def layer(rng):
    cfg = make_config(64, 32, 8, 2, 1)
    t = make_tensors(cfg, rng)
    return cfg, t, nvfp4moe.Moe.from_tensors(cfg, **t)


def test_forward_bad_inputs(layer, rng):
    cfg, t, moe = layer
    x = rng.standard_normal((3, 64)).astype(np.float32)
    ids = np.array([[0, 1]] * 3, np.int32)
    w = np.ones((3, 2), np.float32)
    with raises(r"x: expected a 2-D \[tokens, hidden\] array, got shape \[64\]"):
        moe.forward(x[0])
    with raises(r"x"):
        moe.forward(np.zeros((3, 48), np.float32))
    with raises(r"F64"):
        moe.forward(x.astype(np.float64))
    with raises(r"contiguous"):
        moe.forward(np.zeros((64, 3), np.float32).T)
    with raises(r"topk_ids and topk_weights must be given together"):
        moe.forward(x, ids)
    with raises(r"topk_ids"):
        moe.forward(x, np.array([[0, 1, 2]] * 3, np.int32), np.ones((3, 3), np.float32))
    with raises(r"topk_ids"):
        moe.forward(x, ids.astype(np.float32), w)
    with raises(r"topk_weights"):
        moe.forward(x, ids, np.ones((3, 2), np.float64))
    with raises(r"topk_weights"):
        moe.forward(x, ids, np.ones((2, 2), np.float32))
    bad = ids.copy()
    bad[1, 1] = 8  # outside [-1, E)
    with raises(r"8"):
        moe.forward(x, bad, w)
    bad[1, 1] = -2
    with raises(r"-2"):
        moe.forward(x, bad, w)


def test_forward_device_mismatch(layer):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device to place x elsewhere")
    _, _, moe = layer
    with raises(r"x: on cuda:0, but this Moe runs on cpu"):
        moe.forward(torch.zeros((2, 64), device="cuda"))


def test_moe_construction_bad_inputs(rng):
    cfg = make_config(64, 32, 8, 2, 1)
    t = make_tensors(cfg, rng)

    def build(**changes):
        args = dict(t)
        args.update(changes)
        return nvfp4moe.Moe.from_tensors(cfg, **args)

    with raises(r"w13_weight: shape \[8, 64, 16\], dim 2 expected 32"):
        build(w13_weight=np.zeros((8, 64, 16), np.uint8))
    with raises(r"w13_weight_scale: dtype F32, expected U8"):
        build(w13_weight_scale=t["w13_weight_scale"].astype(np.float32))
    with raises(r"w2_weight_scale_2: shape \[7\], dim 0 expected 8"):
        build(w2_weight_scale_2=np.ones(7, np.float32))
    with raises(r"w13 weight_scale_2 of expert 3 is nan"):
        g = t["w13_weight_scale_2"].copy()
        g[3, 1] = np.nan
        build(w13_weight_scale_2=g)
    with raises(r"w2 weight_scale_2 of expert 5 is -1"):
        g = t["w2_weight_scale_2"].copy()
        g[5] = -1
        build(w2_weight_scale_2=g)
    s13 = t["w13_weight_scale"].copy()
    s13[2, 40, 3] = 0x7F
    with raises(r"w13_weight_scale: block scale byte 0x7f of expert 2 row 40 block 3 is NaN"):
        build(w13_weight_scale=s13)
    s2 = t["w2_weight_scale"].copy()
    s2[7, 1, 0] = 0xB8
    with raises(r"w2_weight_scale: block scale byte 0xb8 of expert 7 row 1 block 0 is negative"):
        build(w2_weight_scale=s2)
    with raises(r"router_gate: shape \[8, 32\], dim 1 expected 64"):
        build(router_gate=np.zeros((8, 32), np.float32))
    with raises(r"shared_w2"):
        build(shared_w2=np.zeros((32, 64), np.uint16))
    with raises(r"shared_experts=1 but shared_w1/shared_w3/shared_w2 were not all given"):
        build(shared_w1=None)
    with raises(r"w13_weight: rank 2"):
        build(w13_weight=np.zeros((64, 32), np.uint8))
    with raises(r"first_expert=6 with 8 local experts does not fit in E=8"):
        build(first_expert=6)
    with raises(r"w13_weight: must be contiguous"):
        build(w13_weight=np.ascontiguousarray(np.concatenate([t["w13_weight"]] * 2, 2))[:, :, ::2])
    with raises(r"device: unknown device 'tpu'"):
        build(device="tpu")
    bad = make_config(64, 32, 8, 9, 1)
    with raises(r"top_k must be in \[1, E=8\], got 9"):
        nvfp4moe.Moe.from_tensors(bad, **t)
    bad = make_config(40, 32, 8, 2, 1)
    with raises(r"hidden H must be a positive multiple of 16, got 40"):
        nvfp4moe.Moe.from_tensors(bad, **t)
    if not nvfp4moe.cuda_available():
        with raises(r"cuda"):
            build(device="cuda")


def test_no_router_needs_routing(rng):
    cfg = make_config(64, 32, 8, 2, 0)
    t = make_tensors(cfg, rng)
    del t["router_gate"], t["router_bias"]
    moe = nvfp4moe.Moe.from_tensors(cfg, **t)
    with raises(r"built without router weights: pass topk_ids and topk_weights"):
        moe.forward(np.zeros((2, 64), np.float32))


def test_hash_layer_needs_token_ids(rng):
    cfg = make_config(64, 32, 8, 2, 1, hash_routed=True)
    t = make_tensors(cfg, rng, vocab=10)
    moe = nvfp4moe.Moe.from_tensors(cfg, **t)
    x = np.zeros((2, 64), np.float32)
    with raises(r"token_ids"):
        moe.forward(x)
    with raises(r"10"):
        moe.forward(x, token_ids=np.array([3, 10], np.int32))  # outside [0, vocab)
    with raises(r"tid2eid: the config is hash-routed but no tid2eid table was given"):
        t2 = dict(t)
        del t2["tid2eid"]
        nvfp4moe.Moe.from_tensors(cfg, **t2)


# ---- checkpoints: outputs, malformed scales and names (the same C++ checks) --------

def _weights(rng):
    cfg = make_config(64, 32, 8, 2, 1)
    return nvfp4moe._C.make_weights(cfg, **make_tensors(cfg, rng))


def test_save_moe_output_paths(tmp_path, rng):
    import os
    import stat
    w = _weights(rng)
    with raises(r"layer\.safetensors: a model directory is written here, but the name ends in \.safetensors"):
        nvfp4moe.save_moe(str(tmp_path / "layer.safetensors"), 0, w)
    assert not (tmp_path / "layer.safetensors").exists()
    d = tmp_path / "m"
    d.mkdir()
    os.mkfifo(d / "config.json")
    with raises(r"config\.json is a FIFO, not a regular file"):
        nvfp4moe.save_moe(str(d), 0, w)
    assert stat.S_ISFIFO(os.lstat(d / "config.json").st_mode)
    assert not (d / "model.safetensors").exists()  # nothing written before the refusal
    # A symlinked model.safetensors is written through.
    (d / "config.json").unlink()
    (tmp_path / "elsewhere.safetensors").write_bytes(b"old")
    (d / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    nvfp4moe.save_moe(str(d), 0, w)
    assert (d / "model.safetensors").is_symlink()
    np.testing.assert_array_equal(nvfp4moe.load_moe_weights(str(d), 0).w13_weight, w.w13_weight)


def test_load_moe_refuses_bad_block_scales_and_names(tmp_path, rng):
    import spec_ref
    nvfp4moe.save_moe(str(tmp_path), 2, _weights(rng))
    f = nvfp4moe.SafetensorsFile(str(tmp_path / "model.safetensors"))
    tensors = {n: f.get(n) for n in f.names()}
    dtypes = {n: f.dtype(n) for n in f.names() if f.dtype(n) not in ("F32", "U8", "I32", "I64")}
    del f
    name = "model.layers.2.mlp.experts.4.down_proj.weight_scale"
    s = tensors[name].copy()
    s.reshape(-1).view(np.uint8)[9] = 0xB8
    spec_ref.write_safetensors(tmp_path / "model.safetensors", {**tensors, name: s}, dtypes)
    with raises(r"experts\.4\.down_proj\.weight_scale\": block scale byte 9 \(row 4, block 1\) is negative \(0xb8\)"):
        nvfp4moe.load_moe(str(tmp_path), 2)
    # A tensor name whose layer index does not fit.
    big = "model.layers.99999999999999999999.mlp.gate.weight"
    spec_ref.write_safetensors(tmp_path / "model.safetensors", {**tensors, big: np.zeros((8, 64), np.float32)}, dtypes)
    with raises(r"tensor name 'model\.layers\.99999999999999999999\.mlp\.gate\.weight': layer index: "
                r"99999999999999999999 is out of range \[0, 2147483647\]"):
        nvfp4moe.summarize_moe_layers(str(tmp_path))
