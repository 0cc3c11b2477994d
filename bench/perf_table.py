#!/usr/bin/env python3
"""The H200 performance table of docs/performance.md, as markdown, from the
benchmarks' machine-readable output of one run:

  --routed FILE     JSON lines of `nvfp4moe_routed_bench --json FILE`: one
                    {"kind": "ceilings", ...} line (HBM read, device copy and
                    BF16 dense rates measured in that run), then one
                    {"kind": "ours", ...} line per (experts, T);
  --baselines FILE  JSON lines of `bench/baselines_torch.py --json FILE`
                    ({"kind": "torch", "experts", "T", "bf16_us", "fp8_us"});
  --layer FILE      the CSV of `nvfp4moe bench --csv FILE` (workload, T, rows,
                    pairs, experts, time_us, bytes, flops, roofline_us,
                    fraction), with --layer-log FILE its stdout for the
                    ceilings line.

Every input is optional; each table is written when its input is given. The
roofline of a routed row is max(weight bytes / HBM read, FLOPs / BF16 dense)
against the ceilings of the same run; the fraction is roofline / time. Only
the standard library is used, so the script runs on the GPU machine and here.

    python3 bench/perf_table.py --routed routed.json --baselines torch.json \
        --layer bench.csv --layer-log bench.log [--out table.md]
"""
import argparse
import csv
import json
import math
import re
import sys

# The routed bench's fixed geometry (DeepSeek-V4-Pro: H=7168, I=3072), used
# only when a JSON line carries no "bytes" / "flops" of its own.
H, I = 7168, 3072
NVFP4_BYTES_PER_VALUE = 0.5625  # 4-bit code + one UE4M3 byte per 16 values
WORKLOAD = {48: "EP8 (48 experts)", 384: "EP1 (384 experts)"}


def json_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def workload_name(experts):
    return WORKLOAD.get(experts, f"{experts} experts")


def fmt(v, digits=1):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def ratio(a, b):
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}x"


def percent(v):
    return "-" if v is None else f"{100 * v:.0f} %"


def routed_table(routed_path, baselines_path):
    rows = json_lines(routed_path)
    ceil = next((r for r in rows if r.get("kind") == "ceilings"), None)
    if ceil is None:
        sys.exit(f"perf_table: {routed_path} has no ceilings line")
    read_bps = ceil["read_tbps"] * 1e12
    bf16_flops = ceil["bf16_tflops"] * 1e12
    baselines = {}
    if baselines_path:
        for r in json_lines(baselines_path):
            if r.get("kind") == "torch":
                baselines[(r["experts"], r["T"])] = r
    out = []
    copy = f", device copy (read + write) {ceil['copy_tbps']:.2f} TB/s" if "copy_tbps" in ceil else ""
    out.append(f"Ceilings measured in the same run: HBM read {ceil['read_tbps']:.2f} TB/s{copy}, "
               f"BF16 dense {ceil['bf16_tflops']:.0f} TFLOP/s.")
    out.append("")
    out.append("| workload | T | pairs | experts touched | kernel | routed path us | GEMMs us | roofline us "
               "| GEMM fraction | path fraction | PyTorch BF16 us | PyTorch FP8 us | vs BF16 | vs FP8 |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ours = sorted((r for r in rows if r.get("kind") == "ours"), key=lambda r: (r["experts"], r["T"]))
    for r in ours:
        weight_bytes = r.get("bytes", r["touched"] * 3.0 * H * I * NVFP4_BYTES_PER_VALUE)
        flops = r.get("flops", 2.0 * r["pairs"] * 3.0 * H * I)
        roof_us = max(weight_bytes / read_bps, flops / bf16_flops) * 1e6
        path_us, gemm_us = r["graph_us"], r["gemm_us"]
        b = baselines.get((r["experts"], r["T"]), {})
        bf16, fp8 = b.get("bf16_us"), b.get("fp8_us")
        out.append(f"| {workload_name(r['experts'])} | {r['T']} | {r['pairs']} | {r['touched']} | {r['config']} "
                   f"| {fmt(path_us)} | {fmt(gemm_us)} | {fmt(roof_us)} | {percent(roof_us / gemm_us)} "
                   f"| {percent(roof_us / path_us)} | {fmt(bf16)} | {fmt(fp8)} | {ratio(bf16, path_us)} "
                   f"| {ratio(fp8, path_us)} |")
    out.append("")
    out.append("Routed path: one CUDA graph of grouping, L1 staging, gate/up GEMM + SwiGLU, requantization, "
               "down GEMM and combine (no router, no shared expert), median of the replays. GEMMs: the two "
               "grouped GEMMs alone and the kernel the device chose (decode, or the prefill kernel's split "
               "launches). Roofline: max(NVFP4 bytes of the touched experts / HBM read, 2 x pairs x 3HI "
               "FLOPs / BF16 dense). Baselines: PyTorch MoEs with the same routing, SwiGLU and combine, BF16 "
               "`torch._grouped_mm` and FP8 rowwise `torch._scaled_grouped_mm`; vs = baseline time / "
               "routed path time.")
    return out


def layer_table(csv_path, log_path):
    out = []
    if log_path:
        with open(log_path) as f:
            m = next((re.search(r"ceilings \(([^)]*)\): (.*)", line) for line in f if line.startswith("ceilings")), None)
        if m:
            how = "measured in the same run" if m.group(1) == "measured now" else f"({m.group(1)})"
            out.append(f"Ceilings {how}: {m.group(2).strip()}.")
            out.append("")
    out.append("| workload | T | tokens | pairs | experts touched | forward us | GB | GFLOP | roofline us | fraction |")
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            out.append(f"| {r['workload']} | {r['T']} | {r['rows']} | {r['pairs']} | {r['experts']} "
                       f"| {float(r['time_us']):.1f} | {float(r['bytes']) / 1e9:.3f} | {float(r['flops']) / 1e9:.1f} "
                       f"| {float(r['roofline_us']):.1f} | {percent(float(r['fraction']))} |")
    out.append("")
    out.append("Forward: `Moe::forward` on the cuda backend with caller routing, median over rotated inputs. "
               "ep8: one rank of 8 (48 local experts fed the pairs of 8T tokens, routed experts only); ep1: "
               "all 384 experts and the shared expert. Roofline from the row's bytes (touched experts' NVFP4 "
               "weights, plus the shared expert's BF16 weights for ep1) and FLOPs against the ceilings above.")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routed", help="JSON lines of nvfp4moe_routed_bench --json")
    ap.add_argument("--baselines", help="JSON lines of bench/baselines_torch.py --json")
    ap.add_argument("--layer", help="CSV of nvfp4moe bench --csv")
    ap.add_argument("--layer-log", help="stdout of the same nvfp4moe bench run (its ceilings line)")
    ap.add_argument("--out", help="write the markdown here instead of stdout")
    a = ap.parse_args()
    if not (a.routed or a.layer):
        ap.error("give --routed and/or --layer")
    lines = []
    if a.routed:
        lines += ["### The routed experts (`nvfp4moe_routed_bench`, `bench/baselines_torch.py`)", ""]
        lines += routed_table(a.routed, a.baselines)
    if a.layer:
        if lines:
            lines.append("")
        lines += ["### The whole layer (`nvfp4moe bench`)", ""]
        lines += layer_table(a.layer, a.layer_log)
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
