#!/usr/bin/env python3
"""PyTorch baselines for the routed-expert path of a DeepSeek-V4 MoE layer.

Same work as bench/routed_experts_bench.cu (--model dsv4-pro: H=7168,
I=3072, 384 experts; dsv4-flash: H=4096, I=2048, 256 experts; top-6 uniform
routing, SwiGLU with limit 10, weighted combine, no router and no shared
expert):

  bf16: torch._grouped_mm for gate/up and down, BF16 weights;
  fp8:  torch._scaled_grouped_mm with rowwise scales (dynamic per-row FP8
        E4M3 activations, per-output-channel FP8 weights), BF16 out.

Each row is the median of CUDA-event timings after a warm-up. --json FILE
writes one {"kind": "torch", ...} line per (experts, T), which
bench/perf_table.py sets beside nvfp4moe's rows of the same model.

    python3 bench/baselines_torch.py [--model dsv4-pro|dsv4-flash] [--experts 48,384]
                                     [--tokens 1,8,64] [--reps 20] [--json FILE]

--experts defaults to an eighth of the model's experts (EP8) and all of them
(EP1).
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

# --model: hidden size, expert intermediate size, routed experts.
MODELS = {"dsv4-pro": (7168, 3072, 384), "dsv4-flash": (4096, 2048, 256)}
H, I, K = 7168, 3072, 6  # the model's H and I, set by main()
LIMIT = 10.0


def median_us(fn, reps):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2]


def routing(T, E, gen):
    ids = torch.rand(T, E, device="cuda", generator=gen).topk(K, dim=1).indices.to(torch.int32)
    w = torch.full((T, K), 0.25, device="cuda", dtype=torch.float32)
    return ids, w


def group(ids, E):
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    return order, offs


def swiglu(gu):
    gate, up = gu[:, :I], gu[:, I:]
    return F.silu(gate.clamp(max=LIMIT)) * up.clamp(-LIMIT, LIMIT)


def combine(o, order, w, T):
    o = o.float() * w.flatten()[order, None]
    y = torch.zeros(T, H, device="cuda", dtype=torch.float32)
    y.index_add_(0, order // K, o)
    return y.to(torch.bfloat16)


def moe_bf16(x, ids, w, w13t, w2t, E):
    order, offs = group(ids, E)
    xs = x[order // K]
    gu = torch._grouped_mm(xs, w13t, offs=offs)
    h = swiglu(gu)
    o = torch._grouped_mm(h, w2t, offs=offs)
    return combine(o, order, w, x.shape[0])


def rowwise_fp8(a):
    amax = a.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12)
    s = amax / 448.0
    return (a.float() / s).to(torch.float8_e4m3fn), s.squeeze(1)


def moe_fp8(x, ids, w, w13q_t, s13, w2q_t, s2, E):
    order, offs = group(ids, E)
    xq, sx = rowwise_fp8(x)
    xs, sxs = xq[order // K], sx[order // K]
    gu = torch._scaled_grouped_mm(xs, w13q_t, sxs, s13, offs=offs, out_dtype=torch.bfloat16)
    h = swiglu(gu)
    hq, sh = rowwise_fp8(h)
    o = torch._scaled_grouped_mm(hq, w2q_t, sh, s2, offs=offs, out_dtype=torch.bfloat16)
    return combine(o, order, w, x.shape[0])


def run(model, experts, tokens, reps, out):
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    for E in experts:
        total = MODELS[model][2]
        ep = "EP8" if 8 * E == total else ("EP1" if E == total else f"E{E}")
        res = {T: {"model": model, "ep": ep, "experts": E, "T": T} for T in tokens}
        # BF16 weights ([E, N, K] row-major; the grouped GEMM takes the [E, K, N] transposed view).
        w13 = torch.empty(E, 2 * I, H, device="cuda", dtype=torch.bfloat16).normal_(0, 0.02, generator=gen)
        w2 = torch.empty(E, H, I, device="cuda", dtype=torch.bfloat16).normal_(0, 0.02, generator=gen)
        for T in tokens:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen)
            ids, w = routing(T, E, gen)
            r = reps if T < 2048 else max(3, reps // 4)
            try:
                res[T]["bf16_us"] = median_us(lambda: moe_bf16(x, ids, w, w13.transpose(1, 2), w2.transpose(1, 2), E), r)
            except Exception as e:  # keep the other rows
                print(f"bf16 {ep} T={T}: {type(e).__name__}: {e}", file=sys.stderr)
        del w13, w2
        torch.cuda.empty_cache()
        # FP8 weights with one scale per output channel.
        w13q = torch.empty(E, 2 * I, H, device="cuda", dtype=torch.bfloat16)
        w13q = w13q.normal_(0, 0.02, generator=gen).to(torch.float8_e4m3fn)
        w2q = torch.empty(E, H, I, device="cuda", dtype=torch.bfloat16).normal_(0, 0.02, generator=gen)
        w2q = w2q.to(torch.float8_e4m3fn)
        s13 = torch.full((E, 2 * I), 1e-2, device="cuda", dtype=torch.float32)
        s2 = torch.full((E, H), 1e-2, device="cuda", dtype=torch.float32)
        for T in tokens:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen)
            ids, w = routing(T, E, gen)
            r = reps if T < 2048 else max(3, reps // 4)
            try:
                res[T]["fp8_us"] = median_us(
                    lambda: moe_fp8(x, ids, w, w13q.transpose(1, 2), s13, w2q.transpose(1, 2), s2, E), r)
            except Exception as e:
                print(f"fp8 {ep} T={T}: {type(e).__name__}: {e}", file=sys.stderr)
        del w13q, w2q
        torch.cuda.empty_cache()
        for T in tokens:
            rows.append(res[T])
            print(json.dumps({"kind": "torch", **res[T]}), file=out, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="dsv4-pro", choices=sorted(MODELS))
    ap.add_argument("--experts", default=None, help="default: an eighth of the model's experts, and all")
    ap.add_argument("--tokens", default="1,8,64,512,2048,4096,8192")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", default=None, help="write the rows as JSON lines here")
    a = ap.parse_args()
    global H, I
    H, I, total = MODELS[a.model]
    experts = [int(v) for v in a.experts.split(",")] if a.experts else [total // 8, total]
    out = open(a.json, "w") if a.json else open("/dev/null", "w")
    rows = run(a.model, experts, [int(v) for v in a.tokens.split(",")], a.reps, out)
    for r in rows:
        print(f"{r['ep']:4} T={r['T']:5d}  bf16 {r.get('bf16_us', float('nan')):9.1f} us   "
              f"fp8 {r.get('fp8_us', float('nan')):9.1f} us")


if __name__ == "__main__":
    main()
