"""Small MoE layers for the tests, built from NumPy weights quantized with
nvfp4moe.quantize (per-tensor global scales, like ModelOpt), so they do not
depend on the library's synthetic generator."""

from __future__ import annotations

import numpy as np

import nvfp4moe
import spec_ref


def make_config(H=64, I=32, E=8, k=2, shared=1, rho=1.5, limit=10.0, hash_routed=False):
    c = nvfp4moe.MoeConfig()
    c.hidden, c.intermediate, c.experts, c.top_k = H, I, E, k
    c.shared_experts = shared
    c.routed_scaling_factor = rho
    c.swiglu_limit = limit
    c.hash_routed = hash_routed
    return c


def _q(w):
    codes, scales, g = nvfp4moe.quantize(np.ascontiguousarray(w, dtype=np.float32), scope="per_tensor")
    return codes, scales, g[0]


def make_tensors(cfg, rng, vocab=0):
    """All tensors of a layer as keyword arguments of Moe.from_tensors."""
    H, I, E = cfg.hidden, cfg.intermediate, cfg.experts
    c13 = np.empty((E, 2 * I, H // 2), np.uint8)
    s13 = np.empty((E, 2 * I, H // 16), np.uint8)
    g13 = np.empty((E, 2), np.float32)
    c2 = np.empty((E, H, I // 2), np.uint8)
    s2 = np.empty((E, H, I // 16), np.uint8)
    g2 = np.empty((E,), np.float32)
    for e in range(E):
        w1 = rng.standard_normal((I, H)) / np.sqrt(H) * rng.uniform(0.5, 2)
        w3 = rng.standard_normal((I, H)) / np.sqrt(H) * rng.uniform(0.5, 2)
        w2 = rng.standard_normal((H, I)) / np.sqrt(I)
        c13[e, :I], s13[e, :I], g13[e, 0] = _q(w1)
        c13[e, I:], s13[e, I:], g13[e, 1] = _q(w3)
        c2[e], s2[e], g2[e] = _q(w2)
    t = dict(w13_weight=c13, w13_weight_scale=s13, w13_weight_scale_2=g13, w2_weight=c2, w2_weight_scale=s2,
             w2_weight_scale_2=g2,
             w13_input_scale=rng.uniform(0.5, 2, E).astype(np.float32) * np.float32(4 / 2688),
             w2_input_scale=rng.uniform(0.5, 2, E).astype(np.float32) * np.float32(1 / 2688),
             router_gate=(rng.standard_normal((E, H)) / np.sqrt(H)).astype(np.float32),
             router_bias=(rng.standard_normal(E) * 0.1).astype(np.float32))
    if cfg.shared_experts:
        Is = cfg.shared_inter()
        from nvfp4moe._arrays import f32_to_bf16_bits
        t["shared_w1"] = f32_to_bf16_bits((rng.standard_normal((Is, H)) / np.sqrt(H)).astype(np.float32))
        t["shared_w3"] = f32_to_bf16_bits((rng.standard_normal((Is, H)) / np.sqrt(H)).astype(np.float32))
        t["shared_w2"] = f32_to_bf16_bits((rng.standard_normal((H, Is)) / np.sqrt(Is)).astype(np.float32))
    if vocab:
        t["tid2eid"] = np.stack([rng.permutation(E)[: cfg.top_k] for _ in range(vocab)]).astype(np.int32)
    return t


def reference(cfg, t, x, ids, weights, static=False):
    """docs/numerics.md §5 in float64 on the same quantized weights."""
    w = {"W1": [], "W3": [], "W2": []}
    I, H = cfg.intermediate, cfg.hidden
    for e in range(cfg.experts):
        w["W1"].append(spec_ref.dequantize(t["w13_weight"][e, :I], t["w13_weight_scale"][e, :I],
                                           np.full(I, t["w13_weight_scale_2"][e, 0])))
        w["W3"].append(spec_ref.dequantize(t["w13_weight"][e, I:], t["w13_weight_scale"][e, I:],
                                           np.full(I, t["w13_weight_scale_2"][e, 1])))
        w["W2"].append(spec_ref.dequantize(t["w2_weight"][e], t["w2_weight_scale"][e],
                                           np.full(H, t["w2_weight_scale_2"][e])))
    w = {k: np.stack(v) for k, v in w.items()}
    shared = None
    if cfg.shared_experts:
        shared = tuple(spec_ref.bf16_values(t[n]) for n in ("shared_w1", "shared_w3", "shared_w2"))
    l1 = float(np.max(t["w13_input_scale"])) if static else None
    l2 = t["w2_input_scale"] if static else None
    return spec_ref.moe_forward(x, w, ids, weights, cfg.swiglu_limit, l1, l2, shared)
