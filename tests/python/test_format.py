"""nvfp4moe.quantize / dequantize / scale layouts on the host (NumPy), checked
against docs/numerics.md's hand-worked block, an independent NumPy implementation of
docs/numerics.md §1-3 (spec_ref.py) and the C++ CLI."""

import os
import subprocess

import numpy as np
import pytest

import nvfp4moe
import spec_ref

GOLDEN_X = [6, -6, 3, 0.1, -0.1, 1.25, 1.75, 0.25, 0.75, 2.5, 3.5, 5, 4, -2, 1, 0]
GOLDEN_CODES = bytes([0xF7, 0x05, 0x28, 0x04, 0x42, 0x66, 0xC6, 0x02])


def test_golden_block_static_g1():
    x = np.array([GOLDEN_X], dtype=np.float32)
    codes, scales, g = nvfp4moe.quantize(x, scope="static", global_scale=1.0)
    assert codes.dtype == np.uint8 and codes.shape == (1, 8)
    assert codes.tobytes() == GOLDEN_CODES, codes.tobytes().hex()
    assert scales.dtype == np.uint8 and scales.tolist() == [[0x38]]
    assert g.tolist() == [1.0]
    # Dequantized: value(q) * 1.0 * 1.0.
    expected = [6, -6, 3, 0, -0.0, 1, 2, 0, 1, 2, 4, 4, 4, -2, 1, 0]
    assert nvfp4moe.dequantize(codes, scales, g).tolist() == [expected]


def test_golden_block_as_bf16_input():
    x = spec_ref_bf16(np.array([GOLDEN_X], dtype=np.float32))
    codes, scales, _ = nvfp4moe.quantize(x, scope="static", global_scale=1.0)
    # 0.1 is not exact in BF16 but still rounds to code 0 / 8.
    assert codes.tobytes() == GOLDEN_CODES and scales.tolist() == [[0x38]]


def _f32(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


# The rules of docs/numerics.md §2 that the formula of NVIDIA ModelOpt
# (NVFP4QTensor) brought, as (row, g, scale bytes, code bytes); the same
# bytes are pinned in tests/format/test_quantize.cpp. u = 2^-12.
_U = 2.0**-12
GOLDEN_RULES = {
    # an all-zero block: scale 1.0 (0x38), codes 0 (-0 too)
    "zero block": ([0.0] * 8 + [-0.0] * 8, 1.0, [0x38], [0] * 8),
    # t = 2^-12 < 2^-9: clamped to byte 0x01, codes against d = 2^-9
    "tiny block": ([6 * _U, -6 * _U, _U, 3 * _U, -3 * _U, 4.5 * _U, 7.5 * _U] + [0] * 9, 1.0, [0x01],
                   [0xA2, 0x10, 0x19, 0x02, 0, 0, 0, 0]),
    # t = 1000 > 448: saturated at 0x7E, d = 448
    "large block": ([6000, -6000, 1344, -1344, 1120, 112, 134.4] + [0] * 9, 1.0, [0x7E],
                    [0xF7, 0xD5, 0x04, 0x01, 0, 0, 0, 0]),
    # t = 1.875: byte 0x3F is the E4M3 value 1.875, not 63
    "scale 0x3F": ([11.25, -11.25, 1.875, 0.9375, 5.625, -3.75] + [0] * 10, 1.0, [0x3F],
                   [0xF7, 0x12, 0xC5, 0, 0, 0, 0, 0]),
    # row maximum 10: t of block 1 = maximum / f32(6 g) = 5.25 exactly, the tie to 0x4A;
    # (maximum / 6) / g would give 0x4B
    "6g rounded first": ([10.0] + [1.0] * 15 + list(_f32([0x3DF00001, 0xBDF00001, 0x3D461861])) + [0] * 13,
                         None, [0x7E, 0x4A], [0x17] + [0x11] * 7 + [0xF7, 0x05] + [0] * 6),
}


@pytest.mark.parametrize("name", list(GOLDEN_RULES))
def test_golden_rules_of_the_modelopt_formula(name):
    row, g, scales_want, codes_want = GOLDEN_RULES[name]
    x = np.array([row], dtype=np.float32)
    gg = spec_ref.per_row_g(x) if g is None else np.array([g], dtype=np.float32)
    codes, scales = spec_ref.quantize(x, gg)
    assert scales[0].tolist() == scales_want and codes[0].tolist() == codes_want, "spec_ref"
    if g is None:
        codes, scales, got_g = nvfp4moe.quantize(x, scope="per_row")
        np.testing.assert_array_equal(got_g, gg)
    else:
        codes, scales, _ = nvfp4moe.quantize(x, scope="static", global_scale=g)
    assert scales[0].tolist() == scales_want, [hex(v) for v in scales[0]]
    assert codes[0].tolist() == codes_want, [hex(v) for v in codes[0]]


def test_six_g_example_separates_the_formulas():
    x = _f32([0x3DF00001])
    g = np.float32(10) / np.float32(2688)
    assert spec_ref.block_scales(x, g).tolist() == [0x4A]
    assert spec_ref.e4m3_encode((x / np.float32(6)) / g).tolist() == [0x4B]


def spec_ref_bf16(x32):
    from nvfp4moe._arrays import f32_to_bf16_bits
    return f32_to_bf16_bits(x32)


def _random_input(rng, rows, cols):
    x = (rng.standard_normal((rows, cols)) * np.exp(rng.uniform(-6, 6, (rows, 1)))).astype(np.float32)
    x[rng.random((rows, cols)) < 0.05] = 0  # zeros and an all-zero block
    if rows > 1:
        x[1, :16] = 0
    # Exact E2M1 ties under g = 1-ish scales.
    x[0, 16:32] = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5, -6],
                           dtype=np.float32) if cols >= 32 else x[0, 16:32]
    return x


@pytest.mark.parametrize("rows,cols", [(1, 16), (3, 64), (130, 96), (257, 48)])
@pytest.mark.parametrize("scope", ["per_row", "per_tensor", "static"])
def test_quantize_matches_numpy_spec(rng, rows, cols, scope):
    x = _random_input(rng, rows, cols)
    static = float(np.float32(rng.uniform(1e-4, 1e-1)))
    codes, scales, g = nvfp4moe.quantize(x, scope=scope, global_scale=static if scope == "static" else None)
    if scope == "per_row":
        g_ref = spec_ref.per_row_g(x)
    elif scope == "per_tensor":
        amax = np.abs(x).max()
        g_ref = np.full(rows, np.float32(amax) / np.float32(2688) if amax else 1.0, dtype=np.float32)
    else:
        g_ref = np.full(rows, static, dtype=np.float32)
    assert g.dtype == np.float32 and g.shape == ((rows,) if scope == "per_row" else (1,))
    np.testing.assert_array_equal(np.broadcast_to(g, (rows,)), g_ref)
    codes_ref, scales_ref = spec_ref.quantize(x, g_ref)
    np.testing.assert_array_equal(scales, scales_ref)
    np.testing.assert_array_equal(codes, codes_ref)
    # Dequantize: value(q) * s * g, exact.
    xh = nvfp4moe.dequantize(codes, scales, g)
    np.testing.assert_array_equal(xh, spec_ref.dequantize(codes, scales, g_ref).astype(np.float32))


def test_quantize_bf16_input_equals_f32_of_same_values(rng):
    x32 = _random_input(rng, 5, 64)
    bits = spec_ref_bf16(x32)
    x_as_f32 = (bits.astype(np.uint32) << 16).view(np.float32)
    a = nvfp4moe.quantize(bits)  # uint16 = BF16 bit patterns
    b = nvfp4moe.quantize(x_as_f32)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)


def test_round_trip_error_is_bounded(rng):
    x = rng.standard_normal((64, 256)).astype(np.float32)
    codes, scales, g = nvfp4moe.quantize(x)
    xh = nvfp4moe.dequantize(codes, scales, g)
    # Worst-case relative step of E2M1 is 1/3 of a block's amax-scaled range;
    # on Gaussian data the relative L2 error is ~0.1.
    assert spec_ref.rel_l2(xh, x) < 0.2
    # BF16 output: the FP32 dequantized values rounded to nearest even.
    bf = nvfp4moe.dequantize(codes, scales, g, dtype="bfloat16")
    assert bf.dtype == np.uint16
    np.testing.assert_array_equal(bf, spec_ref_bf16(xh))


def test_nan_row_propagates_only_to_its_row(rng):
    x = rng.standard_normal((4, 32)).astype(np.float32)
    x[2, 5] = np.nan
    codes, scales, g = nvfp4moe.quantize(x)
    assert np.isnan(g[2]) and np.isfinite(np.delete(g, 2)).all()
    assert (scales[2] == 0x7F).all()
    ok = nvfp4moe.quantize(np.delete(x, 2, axis=0))
    np.testing.assert_array_equal(np.delete(codes, 2, axis=0), ok[0])
    np.testing.assert_array_equal(np.delete(scales, 2, axis=0), ok[1])


@pytest.mark.parametrize("rows,k", [(1, 1), (5, 3), (128, 4), (200, 9), (300, 12)])
def test_scale_layouts_both_ways(rng, rows, k):
    lin = rng.integers(0, 256, (rows, k), dtype=np.uint8)
    swz = nvfp4moe.scales_to_swizzled(lin)
    assert swz.shape == nvfp4moe.swizzled_shape(rows, k)
    np.testing.assert_array_equal(swz, spec_ref.to_swizzled(lin))  # padding zero, every byte placed
    np.testing.assert_array_equal(nvfp4moe.scales_to_linear(swz, rows, k), lin)


def test_quantize_swizzled_equals_linear_then_swizzle(rng):
    x = rng.standard_normal((130, 80)).astype(np.float32)
    c1, s1, g1 = nvfp4moe.quantize(x, layout="linear")
    c2, s2, g2 = nvfp4moe.quantize(x, layout="swizzled")
    np.testing.assert_array_equal(c1, c2)
    np.testing.assert_array_equal(g1, g2)
    np.testing.assert_array_equal(s2, spec_ref.to_swizzled(s1))
    np.testing.assert_array_equal(nvfp4moe.dequantize(c2, s2, g2, layout="swizzled"), nvfp4moe.dequantize(c1, s1, g1))


def test_quantize_equals_cli_bytes(tmp_path, rng, cli):
    """The CLI's per-tensor weight quantization and nvfp4moe.quantize(scope=
    "per_tensor") give the same bytes."""
    w = (rng.standard_normal((48, 64)) * 0.02).astype(np.float32)
    name = "model.layers.0.mlp.experts.0.gate_proj"
    src, dst = tmp_path / "in.safetensors", tmp_path / "out.safetensors"
    spec_ref.write_safetensors(src, {name + ".weight": w})
    subprocess.run([cli, "quantize", "--in", str(src), "--out", str(dst)], check=True, capture_output=True)
    f = nvfp4moe.SafetensorsFile(str(dst))
    codes, scales, g = nvfp4moe.quantize(w, scope="per_tensor")
    np.testing.assert_array_equal(f.get(name + ".weight"), codes)
    assert f.dtype(name + ".weight_scale") == "F8_E4M3"
    np.testing.assert_array_equal(f.get(name + ".weight_scale"), scales)
    np.testing.assert_array_equal(f.get(name + ".weight_scale_2").reshape(-1), g)
