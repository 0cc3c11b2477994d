"""Checkpoints from Python: a layer written by save_moe and read back by
load_moe, and malformed files raising nvfp4moe.Error naming the problem."""

import json
import struct

import numpy as np
import pytest

import nvfp4moe
import spec_ref
from moe_factory import make_config, make_tensors


def _saved_layer(tmp_path, rng, layer=2):
    cfg = make_config(64, 32, 8, 2, 1)
    t = make_tensors(cfg, rng)
    w = nvfp4moe._C.make_weights(cfg, **t)
    nvfp4moe.save_moe(str(tmp_path), layer, w)
    return cfg, t, w


def test_save_then_load_round_trip(tmp_path, rng):
    cfg, t, w = _saved_layer(tmp_path, rng)
    back = nvfp4moe.load_moe_weights(str(tmp_path), 2)
    for name in ("w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w2_weight", "w2_weight_scale",
                 "w2_weight_scale_2", "router_gate", "shared_w1", "shared_w3", "shared_w2"):
        np.testing.assert_array_equal(getattr(back, name), getattr(w, name), err_msg=name)
    c = nvfp4moe.read_moe_config(str(tmp_path), 2)
    assert (c.hidden, c.intermediate, c.experts, c.top_k, c.shared_experts) == (64, 32, 8, 2, 1)
    assert c.routed_scaling_factor == pytest.approx(1.5) and c.swiglu_limit == pytest.approx(10.0)
    # The loaded layer computes what the in-memory one does.
    x = rng.standard_normal((5, 64)).astype(np.float32)
    a = nvfp4moe.load_moe(str(tmp_path), 2).forward(x)
    b = nvfp4moe.Moe(w).forward(x)
    np.testing.assert_array_equal(a, b)
    # Static input scales from the checkpoint's input_scale tensors.
    s = nvfp4moe.load_moe_weights(str(tmp_path), 2, static_input_scales=True)
    assert s.config.l1_input == "static" and s.w2_input_scale is not None


def _tensor_file(tmp_path):
    path = tmp_path / "model.safetensors"
    spec_ref.write_safetensors(path, {"a": np.arange(12, dtype=np.float32).reshape(3, 4)})
    return path


def test_safetensors_reader(tmp_path):
    f = nvfp4moe.SafetensorsFile(str(_tensor_file(tmp_path)))
    assert f.names() == ["a"] and f.dtype("a") == "F32" and f.shape("a") == [3, 4]
    np.testing.assert_array_equal(f.get("a"), np.arange(12, dtype=np.float32).reshape(3, 4))
    with pytest.raises(nvfp4moe.Error, match=r"b"):
        f.get("b")


def _write_raw(path, header: bytes, data: bytes, length=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header) if length is None else length) + header + data)


@pytest.mark.parametrize("case", ["truncated", "header_beyond_file", "not_json", "offsets_outside",
                                  "shape_mismatch", "unknown_dtype", "empty_file"])
def test_malformed_safetensors(tmp_path, case):
    path = tmp_path / "bad.safetensors"
    good = json.dumps({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    if case == "truncated":
        _write_raw(path, good, b"\0" * 8)  # 16 bytes promised
        match = r"a"
    elif case == "header_beyond_file":
        _write_raw(path, good, b"\0" * 16, length=1 << 20)
        match = r"header"
    elif case == "not_json":
        _write_raw(path, b"{not json" + b" " * 7, b"")
        match = r"JSON|json"
    elif case == "offsets_outside":
        h = json.dumps({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}}).encode()
        _write_raw(path, h, b"\0" * 16)
        match = r"a"
    elif case == "shape_mismatch":
        h = json.dumps({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}).encode()
        _write_raw(path, h, b"\0" * 16)
        match = r"a"
    elif case == "unknown_dtype":
        h = json.dumps({"a": {"dtype": "F7", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
        _write_raw(path, h, b"\0" * 16)
        match = r"F7"
    else:
        path.write_bytes(b"\1\2")
        match = r"bad.safetensors"
    with pytest.raises(nvfp4moe.Error, match=match) as info:
        nvfp4moe.SafetensorsFile(str(path))
    assert "bad.safetensors" in str(info.value)


def test_missing_and_malformed_layer_tensors(tmp_path, rng):
    _saved_layer(tmp_path, rng)
    with pytest.raises(nvfp4moe.Error, match=r"model.layers.5.mlp|layer 5"):
        nvfp4moe.load_moe(str(tmp_path), 5)  # no such layer
    with pytest.raises(nvfp4moe.Error, match=r"nowhere"):
        nvfp4moe.load_moe(str(tmp_path / "nowhere"), 2)
    # A global scale that is NaN in the file.
    f = nvfp4moe.SafetensorsFile(str(tmp_path / "model.safetensors"))
    tensors = {n: f.get(n) for n in f.names()}
    dtypes = {n: f.dtype(n) for n in f.names()}
    del f
    name = "model.layers.2.mlp.experts.3.up_proj.weight_scale_2"
    tensors[name] = np.array(np.nan, np.float32).reshape(tensors[name].shape)
    spec_ref.write_safetensors(tmp_path / "model.safetensors", tensors,
                               {n: d for n, d in dtypes.items() if d not in ("F32", "U8", "I32", "I64")})
    with pytest.raises(nvfp4moe.Error, match=r"(?s)up_proj.*nan|nan.*up_proj|expert 3"):
        nvfp4moe.load_moe(str(tmp_path), 2)
    # A wrong shape.
    name = "model.layers.2.mlp.experts.1.down_proj.weight"
    tensors[name] = np.zeros((64, 8), np.uint8)
    tensors["model.layers.2.mlp.experts.3.up_proj.weight_scale_2"] = np.array(1.0, np.float32).reshape(
        tensors["model.layers.2.mlp.experts.3.up_proj.weight_scale_2"].shape)
    spec_ref.write_safetensors(tmp_path / "model.safetensors", tensors,
                               {n: d for n, d in dtypes.items() if d not in ("F32", "U8", "I32", "I64")})
    with pytest.raises(nvfp4moe.Error, match=r"experts.1.down_proj.weight"):
        nvfp4moe.load_moe(str(tmp_path), 2)


def test_every_safetensors_dtype_is_read(tmp_path):
    """The dtypes of the safetensors specification beyond NumPy's: FP8 kinds as
    uint8 bit patterns, sub-byte F4 / F6 as their packed bytes, C64 as float32
    (real, imaginary) pairs."""
    header = {"s": {"dtype": "F8_E8M0", "shape": [2, 2], "data_offsets": [0, 4]},
              "q": {"dtype": "F4", "shape": [2, 4], "data_offsets": [4, 8]},
              "c": {"dtype": "C64", "shape": [1], "data_offsets": [8, 16]},
              "f": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [16, 19]}}
    data = bytes([127, 128, 0, 255, 0x21, 0x43, 0x65, 0x87]) + struct.pack("<ff", 1.5, -2.0) + bytes([1, 2, 3])
    path = tmp_path / "mx.safetensors"
    _write_raw(path, json.dumps(header).encode(), data)
    f = nvfp4moe.SafetensorsFile(str(path))
    assert [f.dtype(n) for n in ("s", "q", "c", "f")] == ["F8_E8M0", "F4", "C64", "F6_E2M3"]
    assert f.shape("q") == [2, 4]  # elements, not bytes
    np.testing.assert_array_equal(f.get("s"), np.array([[127, 128], [0, 255]], np.uint8))
    np.testing.assert_array_equal(f.get("q"), np.array([0x21, 0x43, 0x65, 0x87], np.uint8))
    np.testing.assert_array_equal(f.get("c"), np.array([1.5, -2.0], np.float32))
    np.testing.assert_array_equal(f.get("f"), np.array([1, 2, 3], np.uint8))


def test_deepseek_layout_round_trip_and_twin(tmp_path, rng):
    """A layer saved in DeepSeek's layout (layers.L.ffn.*) loads to the same
    weights and the same outputs as its Hugging Face twin."""
    cfg = make_config(64, 32, 8, 2, 1)
    w = nvfp4moe._C.make_weights(cfg, **make_tensors(cfg, rng))
    nvfp4moe.save_moe(str(tmp_path / "a"), 4, w, layout="deepseek")
    nvfp4moe.save_moe(str(tmp_path / "b"), 4, w)
    assert nvfp4moe.model_layout(str(tmp_path / "a")) == "deepseek"
    assert nvfp4moe.model_layout(str(tmp_path / "b")) == "huggingface"
    names = nvfp4moe.SafetensorsFile(str(tmp_path / "a" / "model.safetensors")).names()
    assert "layers.4.ffn.experts.7.w3.weight_scale_2" in names and "layers.4.ffn.gate.bias" in names
    assert "layers.4.ffn.shared_experts.w2.weight" in names
    a = nvfp4moe.load_moe_weights(str(tmp_path / "a"), 4)
    b = nvfp4moe.load_moe_weights(str(tmp_path / "b"), 4)
    for name in ("w13_weight", "w13_weight_scale", "w13_weight_scale_2", "w2_weight", "w2_weight_scale",
                 "w2_weight_scale_2", "router_gate", "shared_w1", "shared_w3", "shared_w2"):
        np.testing.assert_array_equal(getattr(a, name), getattr(w, name), err_msg=name)
        np.testing.assert_array_equal(getattr(b, name), getattr(w, name), err_msg=name)
    assert nvfp4moe.shared_expert_fp8(a) is None  # BF16 shared expert
    x = rng.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_array_equal(nvfp4moe.load_moe(str(tmp_path / "a"), 4).forward(x),
                                  nvfp4moe.load_moe(str(tmp_path / "b"), 4).forward(x))
    hq = json.loads((tmp_path / "a" / "hf_quant_config.json").read_text())["quantization"]
    assert hq["quant_algo"] == "MIXED_PRECISION"
    assert hq["quantized_layers"]["layers.4.ffn.experts"] == {"quant_algo": "NVFP4", "group_size": 16}
    with pytest.raises(nvfp4moe.Error, match=r"MTP block 0.*Hugging Face layout has no MTP"):
        nvfp4moe.load_moe_weights(str(tmp_path / "b"), 0, mtp=True)
    with pytest.raises(nvfp4moe.Error, match=r"unknown checkpoint layout \"hf\""):
        nvfp4moe.save_moe(str(tmp_path / "c"), 4, w, layout="hf")


# The float keys of a saved config.json: transformers' DeepseekV4Config
# declares them float and refuses an integer such as 10.
_FLOAT_CONFIG_KEYS = ("routed_scaling_factor", "swiglu_limit")


def _saved_whole_float_config(tmp_path, rng, layout):
    cfg = make_config(64, 32, 8, 2, 1, rho=2.0, limit=10.0)
    w = nvfp4moe._C.make_weights(cfg, **make_tensors(cfg, rng))
    out = tmp_path / layout
    nvfp4moe.save_moe(str(out), 1, w, layout=layout)
    return out


@pytest.mark.parametrize("layout", ["huggingface", "deepseek"])
def test_saved_config_writes_floats_as_floats(tmp_path, rng, layout):
    out = _saved_whole_float_config(tmp_path, rng, layout)
    text = (out / "config.json").read_text()
    cfg = json.loads(text)
    for key in _FLOAT_CONFIG_KEYS:
        assert isinstance(cfg[key], float), f"{key}: {cfg[key]!r} in {text}"
    assert '"swiglu_limit": 10.0' in text and '"routed_scaling_factor": 2.0' in text, text


@pytest.mark.parametrize("layout", ["huggingface", "deepseek"])
def test_saved_config_is_read_by_transformers(tmp_path, rng, layout):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "DeepseekV4Config"):
        pytest.skip(f"transformers {transformers.__version__} has no DeepseekV4Config")
    out = _saved_whole_float_config(tmp_path, rng, layout)
    c = transformers.DeepseekV4Config.from_pretrained(str(out))
    assert c.swiglu_limit == 10.0 and c.routed_scaling_factor == 2.0
    assert (c.hidden_size, c.moe_intermediate_size, c.n_routed_experts, c.num_experts_per_tok) == (64, 32, 8, 2)


def test_written_manifests_are_accepted_by_vllm(tmp_path, rng, cli):
    """vLLM's ModelOptNvFp4Config takes what save_moe and quantize write: in
    hf_quant_config.json it requires group_size, kv_cache_quant_algo and
    exclude_modules; config.json's quantization_config (read first) must
    carry the exclusions, and, the files holding no input_scale, a
    weights-only config group (vLLM then runs W4A16)."""
    modelopt = pytest.importorskip("vllm.model_executor.layers.quantization.modelopt")
    import subprocess

    _saved_layer(tmp_path / "saved", rng)
    hq = json.loads((tmp_path / "saved" / "hf_quant_config.json").read_text())
    c = modelopt.ModelOptNvFp4Config.from_config(hq)
    assert c.kv_cache_quant_algo is None and c.group_size == 16
    assert "model.layers.2.mlp.gate" in c.exclude_modules

    src = tmp_path / "bf16"
    src.mkdir()
    w = {"model.layers.0.mlp.experts.0.gate_proj.weight": rng.standard_normal((32, 64)).astype(np.float32),
         "model.layers.0.mlp.experts.0.up_proj.weight": rng.standard_normal((32, 64)).astype(np.float32),
         "model.layers.0.self_attn.q_proj.weight": rng.standard_normal((64, 64)).astype(np.float32)}
    spec_ref.write_safetensors(src / "model.safetensors", w)
    (src / "config.json").write_text(json.dumps({"hidden_size": 64}))
    subprocess.run([cli, "quantize", "--in", str(src), "--out", str(tmp_path / "q")], check=True)
    hq = json.loads((tmp_path / "q" / "hf_quant_config.json").read_text())
    assert modelopt.ModelOptNvFp4Config.from_config(hq).exclude_modules == ["model.layers.0.self_attn.q_proj"]
    qc = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    c = modelopt.ModelOptNvFp4Config.from_config(qc)
    assert c.exclude_modules == ["model.layers.0.self_attn.q_proj"]
    assert c.quant_method == "W4A16_NVFP4"


def _e4m3_values(bytes_):
    return spec_ref.e4m3_value(bytes_).astype(np.float32)


def test_fp8_shared_expert_with_e8m0_scales(tmp_path, rng):
    """The official release's shared expert: E4M3 weights with one F8_E8M0
    scale per 128x128 tile. It loads with the factors 2^(b-127) and computes
    what BF16 weights of the same (exactly representable) values compute."""
    H, I, Is = 256, 32, 160
    cfg = make_config(H, I, 8, 2, 1)
    cfg.shared_intermediate = Is
    t = make_tensors(cfg, rng)
    fp8, exps = {}, {}
    for p, (n, k) in (("w1", (Is, H)), ("w3", (Is, H)), ("w2", (H, Is))):
        q = rng.integers(0, 256, (n, k), dtype=np.uint8)
        q[(q & 0x7F) == 0x7F] = 0x38  # no NaN
        fp8[p] = q
        exps[p] = rng.integers(117, 122, (-(-n // 128), -(-k // 128)), dtype=np.uint8)  # 2^-10 .. 2^-6
    bf16 = {}
    for p in ("w1", "w3", "w2"):
        scale = np.ldexp(1.0, exps[p].astype(np.int32) - 127).astype(np.float32)
        v = _e4m3_values(fp8[p]) * np.repeat(np.repeat(scale, 128, 0), 128, 1)[:fp8[p].shape[0], :fp8[p].shape[1]]
        bf16[p] = (v.view(np.uint32) >> 16).astype(np.uint16)  # exact: 4 significant bits times 2^k
    t = dict(t, shared_w1=bf16["w1"], shared_w3=bf16["w3"], shared_w2=bf16["w2"])
    w = nvfp4moe._C.make_weights(cfg, **t)
    nvfp4moe.save_moe(str(tmp_path), 1, w, layout="deepseek")
    f = nvfp4moe.SafetensorsFile(str(tmp_path / "model.safetensors"))
    tensors = {n: f.get(n) for n in f.names()}
    dtypes = {n: f.dtype(n) for n in f.names()}
    del f
    for p in ("w1", "w3", "w2"):
        tensors[f"layers.1.ffn.shared_experts.{p}.weight"] = fp8[p]
        dtypes[f"layers.1.ffn.shared_experts.{p}.weight"] = "F8_E4M3"
        tensors[f"layers.1.ffn.shared_experts.{p}.scale"] = exps[p]
        dtypes[f"layers.1.ffn.shared_experts.{p}.scale"] = "F8_E8M0"
    spec_ref.write_safetensors(tmp_path / "model.safetensors", tensors, dtypes)
    s = nvfp4moe.load_moe_weights(str(tmp_path), 1)
    got = nvfp4moe.shared_expert_fp8(s)
    np.testing.assert_array_equal(got["w3"], fp8["w3"])
    np.testing.assert_array_equal(got["w2_scale"], np.ldexp(1.0, exps["w2"].astype(np.int32) - 127))
    x = rng.standard_normal((4, H)).astype(np.float32)
    np.testing.assert_array_equal(nvfp4moe.Moe(s).forward(x), nvfp4moe.Moe(w).forward(x))
    summary = nvfp4moe.summarize_moe_layers(str(tmp_path))
    assert [(l["block"], l["routed_format"], l["shared_format"], l["loadable"]) for l in summary] == \
        [("layers.1", "NVFP4", "FP8", True)]
    assert summary[0]["shared_scale"]["min"] == float(np.ldexp(1.0, int(min(e.min() for e in exps.values())) - 127))
    # A NaN scale byte (0xFF) is refused naming the tensor and the tile.
    exps["w1"][1, 0] = 0xFF
    tensors["layers.1.ffn.shared_experts.w1.scale"] = exps["w1"]
    spec_ref.write_safetensors(tmp_path / "model.safetensors", tensors, dtypes)
    with pytest.raises(nvfp4moe.Error, match=r"shared_experts\.w1\.scale.*byte 2 \(tile 1, 0\) is NaN \(0xff\)"):
        nvfp4moe.load_moe_weights(str(tmp_path), 1)


def test_vllm_names_of_both_layouts(tmp_path, rng):
    """DeepSeek-native and Hugging Face expert tensors map onto vLLM's
    w13_* / w2_* parameters as vLLM's DeepSeek-V4 loader maps them, and give
    the weights the native loader reads."""
    torch = pytest.importorskip("torch")
    import nvfp4moe.vllm as nv

    assert nv.expert_param("layers.3.ffn.experts.5.w3.weight_scale_2") == \
        ("layers.3.ffn.experts.w13_weight_scale_2", 5, "w3")
    assert nv.expert_param("layers.3.ffn.experts.5.w1.weight") == ("layers.3.ffn.experts.w13_weight", 5, "w1")
    assert nv.expert_param("mtp.0.ffn.experts.2.w2.input_scale") == ("mtp.0.ffn.experts.w2_input_scale", 2, "w2")
    assert nv.expert_param("model.layers.3.mlp.experts.5.up_proj.weight_scale") == \
        ("model.layers.3.mlp.experts.w13_weight_scale", 5, "w3")
    assert nv.expert_param("layers.3.ffn.shared_experts.w1.weight") is None
    assert nv.expert_param("layers.3.ffn.experts.5.w1.scale") is None  # MXFP4's scale is no NVFP4 parameter

    cfg = make_config(64, 32, 8, 2, 1)
    w = nvfp4moe._C.make_weights(cfg, **make_tensors(cfg, rng))
    for layout in ("deepseek", "huggingface"):
        d = tmp_path / layout
        nvfp4moe.save_moe(str(d), 2, w, layout=layout)
        f = nvfp4moe.SafetensorsFile(str(d / "model.safetensors"))
        tensors = {n: torch.from_numpy(f.get(n)) for n in f.names()}
        p = nv.params_from_checkpoint(tensors, 2, 8, first_expert=2, local_experts=4)
        native = nvfp4moe.load_moe_weights(str(d), 2, first_expert=2, expert_count=4)
        np.testing.assert_array_equal(p["w13_weight"].numpy(), native.w13_weight)
        np.testing.assert_array_equal(p["w13_weight_scale"].view(torch.uint8).numpy(), native.w13_weight_scale)
        np.testing.assert_array_equal(p["w13_weight_scale_2"].numpy(), native.w13_weight_scale_2)
        np.testing.assert_array_equal(p["w2_weight"].numpy(), native.w2_weight)
        np.testing.assert_array_equal(p["w2_weight_scale"].view(torch.uint8).numpy(), native.w2_weight_scale)
        np.testing.assert_array_equal(p["w2_weight_scale_2"].numpy(), native.w2_weight_scale_2)
        np.testing.assert_array_equal(p["w13_input_scale"].max(dim=1).values.numpy(), native.w13_input_scale)
        experts = nv.make_experts_from_checkpoint(tensors, 2, 8, 2, static_input_scales=False, device="cpu")
        x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32))
        ids = torch.tensor([[0, 5], [7, -1], [3, 3]], dtype=torch.int32)
        wts = torch.tensor([[0.5, 0.25], [1.0, 0.0], [0.75, 0.125]], dtype=torch.float32)
        full = nvfp4moe.load_moe_weights(str(d), 2)
        full.config.shared_experts = 0
        want = nvfp4moe.Moe(full).forward(x.numpy(), ids.numpy(), wts.numpy())
        np.testing.assert_array_equal(experts.apply(x, ids, wts).numpy(), want)
        with pytest.raises(nvfp4moe.Error, match=r"layer 3: no weight tensor for expert 0"):
            nv.params_from_checkpoint(tensors, 3, 8)
