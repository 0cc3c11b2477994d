"""Independent, deliberately simple NumPy versions of docs/numerics.md, for tests only:
the codecs and two-level quantization of sections 1-2 (vectorised, from the
spec's threshold list and an enumeration of E4M3), the swizzled layout of
section 3, a small safetensors writer, and a float64 evaluation of the MoE
layer of section 5."""

from __future__ import annotations

import json
import struct

import numpy as np

E2M1_MAGNITUDES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def e2m1_value(code):
    code = np.asarray(code, dtype=np.uint8)
    mag = E2M1_MAGNITUDES[code & 7]
    return np.where(code & 8, -mag, mag)


def e4m3_value(byte):
    b = np.asarray(byte, dtype=np.int64)
    e, m = (b >> 3) & 15, b & 7
    mag = np.where(e == 0, m / 512.0, (1 + m / 8.0) * np.exp2(e - 7.0))
    mag = np.where((e == 15) & (m == 7), np.nan, mag)
    return np.where(b & 0x80, -mag, mag)


_E4M3_POS = e4m3_value(np.arange(0x7F))  # every finite non-negative byte 0x00..0x7E, increasing


def e4m3_encode(v):
    """Nearest E4M3 byte of non-negative v, ties to the even byte, saturating
    at 448; NaN/Inf -> 0x7F (docs/numerics.md §1)."""
    v = np.asarray(v, dtype=np.float64)
    out = np.full(v.shape, 0x7F, dtype=np.uint8)
    finite = np.isfinite(v)
    a = np.where(finite, np.minimum(v, 448.0), 0.0)
    hi = np.clip(np.searchsorted(_E4M3_POS, a, side="left"), 1, 0x7E)
    lo = hi - 1
    dlo, dhi = a - _E4M3_POS[lo], _E4M3_POS[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    out[finite] = pick[finite].astype(np.uint8)
    return out


def e2m1_encode(v):
    """docs/numerics.md §1's thresholds on |v|; sign iff v < 0."""
    v = np.asarray(v, dtype=np.float32)
    a = np.abs(v)
    m = ((a > 0.25).astype(np.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5.0))
    return (m | np.where(v < 0, 8, 0)).astype(np.uint8)


def block_scales(amax, g):
    """docs/numerics.md §2's block scale bytes in FP32, NVIDIA ModelOpt's formula:
    t = amax / f32(6 g) (6 g rounded first, one division), 1 where t == 0,
    clamped to [2^-9, 448], rounded to E4M3. A NaN/Inf g (a row's scope) or
    amax (a block holding NaN/Inf) gives 0x7F, never a clamped value."""
    amax = np.asarray(amax, dtype=np.float32)
    g = np.asarray(g, dtype=np.float32)
    with np.errstate(all="ignore"):
        t = amax / (np.float32(6) * g)
        t = np.where(t == 0, np.float32(1), t)
        t = np.clip(t, np.float32(2.0**-9), np.float32(448))  # NaN stays NaN
    return np.where(np.isfinite(amax) & np.isfinite(g), e4m3_encode(t), np.uint8(0x7F)).astype(np.uint8)


def quantize(x, g):
    """docs/numerics.md §2 in FP32: x [R, K] float32, g [R] float32 per row.
    Returns codes [R, K/2] and linear scales [R, K/16]."""
    x = np.asarray(x, dtype=np.float32)
    R, K = x.shape
    g = np.asarray(g, dtype=np.float32).reshape(R, 1)
    blocks = x.reshape(R, K // 16, 16)
    amax = np.abs(blocks).max(axis=2)
    s = block_scales(amax, g)
    with np.errstate(all="ignore"):
        d = (e4m3_value(s).astype(np.float32) * g).astype(np.float32)
        q = e2m1_encode(blocks / d[..., None]).astype(np.uint8)  # an IEEE FP32 division; NaN -> code 0
    q = q.reshape(R, K)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8), s


def per_row_g(x):
    amax = np.abs(np.asarray(x, dtype=np.float32)).max(axis=1)
    return np.where(amax == 0, np.float32(1), amax / np.float32(2688)).astype(np.float32)


def dequantize(codes, scales, g):
    """value(q) * f32(s) * g, exact in float64 (the products are exact)."""
    codes = np.asarray(codes, dtype=np.uint8)
    R = codes.shape[0]
    q = np.empty((R, codes.shape[1] * 2), dtype=np.uint8)
    q[:, 0::2], q[:, 1::2] = codes & 0xF, codes >> 4
    s = np.repeat(e4m3_value(scales), 16, axis=1)
    return e2m1_value(q) * s * np.asarray(g, dtype=np.float64).reshape(-1, 1)


def swizzled_offset(m, c, kp):
    return ((m >> 7) * (kp // 4) + (c >> 2)) * 512 + (m & 31) * 16 + ((m >> 5) & 3) * 4 + (c & 3)


def to_swizzled(linear):
    R, k = linear.shape
    Rp, kp = -(-R // 128) * 128, -(-k // 4) * 4
    out = np.zeros(Rp * kp, dtype=np.uint8)
    m, c = np.meshgrid(np.arange(R), np.arange(k), indexing="ij")
    out[swizzled_offset(m, c, kp)] = linear
    return out.reshape(Rp, kp)


# ---- safetensors ------------------------------------------------------------

_ST_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32",
              np.dtype(np.uint16): "BF16", np.dtype(np.int64): "I64"}


def write_safetensors(path, tensors: dict, dtypes: dict | None = None):
    """tensors: name -> NumPy array (uint16 is written as BF16 unless
    `dtypes` names another safetensors dtype for it)."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        dt = (dtypes or {}).get(name, _ST_DTYPES[a.dtype])
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


# ---- the MoE layer in float64 (docs/numerics.md §5) -------------------------------

def silu(z):
    return z / (1.0 + np.exp(-z))


def qdq_rows(a, g=None):
    """QDQ per docs/numerics.md §2 (exact quantizer), per-row g unless g given."""
    a32 = np.asarray(a, dtype=np.float32)
    gg = per_row_g(a32) if g is None else np.full(a32.shape[0], g, dtype=np.float32)
    codes, scales = quantize(a32, gg)
    return dequantize(codes, scales, gg)


def route(x, gate, bias, k, rho):
    """Router of docs/numerics.md §5 in float64: ids [T, k], weights [T, k]."""
    logits = np.asarray(x, np.float64) @ np.asarray(gate, np.float64).T
    s = np.sqrt(np.where(logits > 20, logits, np.log1p(np.exp(np.minimum(logits, 20)))))
    sel = s + (0 if bias is None else np.asarray(bias, np.float64))
    ids = np.argsort(-sel, axis=1, kind="stable")[:, :k]  # ties -> lower id
    sw = np.take_along_axis(s, ids, axis=1)
    return ids.astype(np.int32), rho * sw / sw.sum(axis=1, keepdims=True)


def moe_forward(x, w, topk_ids, topk_weights, limit, static_l1=None, static_l2=None, shared=None):
    """y [T, H] in float64. w: dict of dequantized float64 expert weights
    W1 [E, I, H], W3 [E, I, H], W2 [E, H, I] (global ids). shared: (W1s, W3s,
    W2s) float64 or None. static_l1: one g, static_l2: per-expert g array."""
    x = np.asarray(x, np.float64)
    T, H = x.shape
    y = np.zeros((T, H))
    a = qdq_rows(x, static_l1)
    for t in range(T):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            if e < 0:
                continue
            gate = w["W1"][e] @ a[t]
            up = w["W3"][e] @ a[t]
            if limit is not None:
                gate, up = np.minimum(gate, limit), np.clip(up, -limit, limit)
            h = silu(gate) * up
            hq = qdq_rows(h[None, :], None if static_l2 is None else static_l2[e])[0]
            y[t] += topk_weights[t, j] * (w["W2"][e] @ hq)
    if shared is not None:
        W1s, W3s, W2s = shared
        g, u = x @ W1s.T, x @ W3s.T
        if limit is not None:
            g, u = np.minimum(g, limit), np.clip(u, -limit, limit)
        y += (silu(g) * u) @ W2s.T
    return y


def dequantize_experts(weights):
    """Dequantized float64 W1, W3, W2 of an nvfp4moe.MoeWeights."""
    c13, s13, g13 = weights.w13_weight, weights.w13_weight_scale, weights.w13_weight_scale_2
    c2, s2, g2 = weights.w2_weight, weights.w2_weight_scale, weights.w2_weight_scale_2
    n, two_i, _ = c13.shape
    I = two_i // 2
    W1, W3, W2 = [], [], []
    for e in range(n):
        W1.append(dequantize(c13[e, :I], s13[e, :I], np.full(I, g13[e, 0])))
        W3.append(dequantize(c13[e, I:], s13[e, I:], np.full(I, g13[e, 1])))
        W2.append(dequantize(c2[e], s2[e], np.full(c2.shape[1], g2[e])))
    return {"W1": np.stack(W1), "W3": np.stack(W3), "W2": np.stack(W2)}


def bf16_values(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))
