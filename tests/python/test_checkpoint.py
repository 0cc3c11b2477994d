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
