"""nvfp4moe.Moe on the CPU backend against a float64 NumPy evaluation of spec
section 5 on the same quantized weights."""

import numpy as np
import pytest

import nvfp4moe
import spec_ref
from moe_factory import make_config, make_tensors, reference


@pytest.mark.parametrize("H,I,E,k,shared,T", [(64, 32, 8, 2, 1, 5), (96, 48, 6, 3, 0, 17), (32, 64, 4, 4, 1, 1),
                                                (48, 16, 5, 1, 1, 9)])
def test_forward_with_router_matches_float64_reference(rng, H, I, E, k, shared, T):
    cfg = make_config(H, I, E, k, shared)
    t = make_tensors(cfg, rng)
    moe = nvfp4moe.Moe.from_tensors(cfg, **t)
    x = (rng.standard_normal((T, H)) * 2).astype(np.float32)
    y, ids, w = moe.forward(x, return_topk=True)
    assert y.dtype == np.float32 and y.shape == (T, H) and np.isfinite(y).all()
    ids_ref, w_ref = spec_ref.route(x, t["router_gate"], t["router_bias"], k, cfg.routed_scaling_factor)
    np.testing.assert_array_equal(np.sort(ids, axis=1), np.sort(ids_ref, axis=1))
    np.testing.assert_allclose(np.take_along_axis(w, np.argsort(ids, 1), 1),
                               np.take_along_axis(w_ref, np.argsort(ids_ref, 1), 1), rtol=1e-5, atol=1e-6)
    # y is BF16 values.
    np.testing.assert_array_equal(y, spec_ref.bf16_values(nvfp4moe._arrays.f32_to_bf16_bits(y)))
    y_ref = reference(cfg, t, x, ids_ref, w_ref)
    assert spec_ref.rel_l2(y, y_ref) <= 1e-2


def test_caller_routing_with_empty_slots(rng):
    cfg = make_config(64, 32, 8, 3, 1)
    t = make_tensors(cfg, rng)
    moe = nvfp4moe.Moe.from_tensors(cfg, **t)
    T = 6
    x = rng.standard_normal((T, 64)).astype(np.float32)
    ids = np.stack([rng.permutation(8)[:3] for _ in range(T)]).astype(np.int64)
    ids[1, 2] = -1
    ids[3, :] = -1  # only the shared expert
    w = rng.uniform(0.1, 1, (T, 3)).astype(np.float32)
    y, ids_out, w_out = moe.forward(x, ids, w, return_topk=True)
    np.testing.assert_array_equal(ids_out, ids.astype(np.int32))
    np.testing.assert_array_equal(w_out, w)
    y_ref = reference(cfg, t, x, ids, w)
    assert spec_ref.rel_l2(y, y_ref) <= 1e-2
    assert spec_ref.rel_l2(y[3], y_ref[3]) <= 1e-2


def test_static_input_scales(rng):
    cfg = make_config(64, 32, 8, 2, 0)
    cfg.l1_input = "static"
    cfg.l2_input = "static"
    t = make_tensors(cfg, rng)
    moe = nvfp4moe.Moe.from_tensors(cfg, **t)
    x = rng.standard_normal((7, 64)).astype(np.float32)
    ids = np.stack([rng.permutation(8)[:2] for _ in range(7)]).astype(np.int32)
    w = rng.uniform(0.1, 1, (7, 2)).astype(np.float32)
    y = moe.forward(x, ids, w)
    assert spec_ref.rel_l2(y, reference(cfg, t, x, ids, w, static=True)) <= 1e-2


def test_hash_routed_layer(rng):
    cfg = make_config(64, 32, 8, 2, 1, hash_routed=True)
    t = make_tensors(cfg, rng, vocab=50)
    moe = nvfp4moe.Moe.from_tensors(cfg, **t)
    tok = rng.integers(0, 50, 9).astype(np.int32)
    x = rng.standard_normal((9, 64)).astype(np.float32)
    y, ids, w = moe.forward(x, token_ids=tok, return_topk=True)
    np.testing.assert_array_equal(ids, t["tid2eid"][tok])
    _, w_all = spec_ref.route(x, t["router_gate"], None, 8, cfg.routed_scaling_factor)  # scores, no bias
    logits = x.astype(np.float64) @ t["router_gate"].astype(np.float64).T
    s = np.sqrt(np.log1p(np.exp(logits)))
    sw = np.take_along_axis(s, ids.astype(np.int64), 1)
    w_ref = cfg.routed_scaling_factor * sw / sw.sum(1, keepdims=True)
    np.testing.assert_allclose(w, w_ref, rtol=1e-5)
    assert spec_ref.rel_l2(y, reference(cfg, t, x, ids, w_ref)) <= 1e-2


def test_nan_token_affects_only_itself(rng):
    cfg = make_config(64, 32, 8, 2, 1)
    t = make_tensors(cfg, rng)
    moe = nvfp4moe.Moe.from_tensors(cfg, **t)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    ids = np.array([[0, 1], [2, 3], [0, 2], [1, 3]], np.int32)
    w = np.full((4, 2), 0.5, np.float32)
    clean = moe.forward(x, ids, w)
    x[2, 7] = np.nan
    y = moe.forward(x, ids, w)
    assert np.isnan(y[2]).any()
    np.testing.assert_array_equal(np.delete(y, 2, 0), np.delete(clean, 2, 0))


def test_synthetic_layer_and_config_access():
    cfg = make_config(64, 32, 8, 2, 1)
    moe = nvfp4moe.Moe.synthetic(cfg, seed=7)
    c = moe.config
    assert (c.hidden, c.intermediate, c.experts, c.top_k, c.shared_experts) == (64, 32, 8, 2, 1)
    assert c.swiglu_limit == 10.0 and moe.device == "cpu" and moe.backend == "cpu"
    assert moe.prefill_mma == "none"  # the CPU backend has no tensor-core forms
    c.hidden = 128  # a copy: the layer keeps its own
    assert moe.config.hidden == 64
    y = moe(np.zeros((3, 64), np.float32))
    assert y.shape == (3, 64) and np.isfinite(y).all()
    w = nvfp4moe._C.synthetic_weights(cfg, 7)
    assert w.w13_weight.shape == (8, 64, 32) and w.w2_weight_scale.shape == (8, 64, 2)
    assert w.w13_weight_scale_2.shape == (8, 2) and w.router_gate.shape == (8, 64)
    assert w.shared_w1.shape == (32, 64) and w.shared_w2.shape == (64, 32)
