#!/usr/bin/env python3
"""The performance tables of docs/performance.md, as markdown, from the
benchmarks' machine-readable output of one run:

  --routed FILE     JSON lines of `nvfp4moe_routed_bench --json FILE`: one
                    {"kind": "ceilings", ...} line (the device, HBM read,
                    device copy and BF16 dense rates measured in that run;
                    older files name no device), then one
                    {"kind": "ours", ...} line per (experts, format, act, T)
                    (files without "format" / "act" are NVFP4 with nvfp4
                    activations);
  --baselines FILE  JSON lines of `bench/baselines_torch.py --json FILE`
                    ({"kind": "torch", "experts", "T", "bf16_us", "fp8_us"});
  --ep-log FILE     the stdout of one or more `nvfp4moe bench --ep R` runs
                    (bench/device_ep.sh's ep_bench.log): per run its table
                    (T, us per forward) and its breakdown (the phases, max
                    over ranks, and the NVLink bytes), beside DeepGEMM's
                    published SM90 FP8 MegaMoE figures where a rank holds 48
                    DeepSeek-V4-Pro experts, and with --routed the same T's
                    single-GPU routed path of 48 experts;
  --layer FILE      the CSV of `nvfp4moe bench --csv FILE` (workload, T, rows,
                    pairs, experts, time_us, bytes, flops, roofline_us,
                    fraction; with --format / --act other than nvfp4 also
                    format, act, checkpoint_bytes, checkpoint_roofline_us,
                    checkpoint_fraction; with --shared fp8 also shared; with
                    --model other than dsv4-pro also model; with --graph
                    also timing), with
                    --layer-log FILE its stdout for the device and ceilings
                    lines.

Every input is optional; each table is written when its input is given. The
roofline of a routed row is max(weight bytes / HBM read, FLOPs / BF16 dense;
FP8 dense for the FP8 form's kernels, fp8-*) against the ceilings of the
same run, the weight bytes being the format's
own (its checkpoint's: NVFP4 4.5 bits a weight, MXFP4 4.25, which the
device reads); the fraction is roofline / time. Where a run
has MXFP4 rows, a second table sets each beside the NVFP4 row of the same
workload, mode and T. Only the standard library is used, so the script runs
on the GPU machine and here.

    python3 bench/perf_table.py --routed routed.json --baselines torch.json \
        --layer bench.csv --layer-log bench.log [--out table.md]
"""
import argparse
import csv
import json
import math
import re
import sys

# The routed bench's geometry when a JSON line names none (files before
# --model: DeepSeek-V4-Pro, H=7168, I=3072).
H, I = 7168, 3072
NVFP4_BYTES_PER_VALUE = 0.5625  # 4-bit code + one UE4M3 byte per 16 values
FORMATS = ["nvfp4", "mxfp4"]  # the benches' names, in table order
ACTS = ["nvfp4", "bf16", "fp8"]


def json_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def workload_name(r):
    """EP8 / EP1 and the row's experts; files before --model carry no "ep" label for other counts."""
    ep = r.get("ep") or {48: "EP8", 384: "EP1"}.get(r["experts"])
    return f"{ep} ({r['experts']} experts)" if ep in ("EP8", "EP1") else f"{r['experts']} experts"


def routed_shape(r):
    return r.get("hidden", H), r.get("inter", I)


def routed_model(r):
    """The model of a routed or baseline row (files before --model: V4-Pro)."""
    return r.get("model", "dsv4-pro")


def fmt(v, digits=1):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def ratio(a, b):
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.2f}x"


def percent(v):
    return "-" if v is None else f"{100 * v:.0f} %"


def order(names, name):
    return names.index(name) if name in names else len(names)


def routed_format(r):
    return r.get("format", "nvfp4"), r.get("act", "nvfp4")


def routed_roofline_us(r, read_bps, peaks):
    """Roofline of a routed row from the format's own weight bytes and the
    peak of its tensor cores: FP8 for the FP8 form's kernels (fp8-*), when
    the run measured it, else BF16."""
    h, i = routed_shape(r)
    weight_bytes = r.get("checkpoint_bytes", r.get("bytes", r["touched"] * 3.0 * h * i * NVFP4_BYTES_PER_VALUE))
    flops = r.get("flops", 2.0 * r["pairs"] * 3.0 * h * i)
    fp8_form = r["config"].startswith("fp8-") and peaks.get("fp8")
    return max(weight_bytes / read_bps, flops / peaks["fp8" if fp8_form else "bf16"]) * 1e6


def format_comparison(ours, read_bps, peaks):
    """MXFP4 rows beside the NVFP4 rows of the same (experts, act, T)."""
    nvfp4 = {(r["experts"], routed_format(r)[1], r["T"]): r for r in ours if routed_format(r)[0] == "nvfp4"}
    pairs = [(nvfp4[(r["experts"], routed_format(r)[1], r["T"])], r) for r in ours
             if routed_format(r)[0] == "mxfp4" and (r["experts"], routed_format(r)[1], r["T"]) in nvfp4]
    if not pairs:
        return []
    out = ["", "MXFP4 against NVFP4, the same workload, activation mode and T:", "",
           "| workload | T | act | kernel | NVFP4 GEMMs us | MXFP4 GEMMs us | GB read | MXFP4 GB "
           "| NVFP4 GEMM fraction | MXFP4 GEMM fraction | MXFP4 / NVFP4 | NVFP4 path fraction | MXFP4 path fraction |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, m in pairs:
        rn, rm = routed_roofline_us(n, read_bps, peaks), routed_roofline_us(m, read_bps, peaks)
        fn, fm = rn / n["gemm_us"], rm / m["gemm_us"]
        h, i = routed_shape(m)
        read_gb = m.get("device_bytes", m["touched"] * 3.0 * h * i * NVFP4_BYTES_PER_VALUE) / 1e9
        ckpt_gb = m["checkpoint_bytes"] / 1e9 if "checkpoint_bytes" in m else None
        kernel = n["config"] if n["config"] == m["config"] else f"{n['config']} / {m['config']}"
        out.append(f"| {workload_name(m)} | {m['T']} | {routed_format(m)[1]} | {kernel} "
                   f"| {fmt(n['gemm_us'])} | {fmt(m['gemm_us'])} | {fmt(read_gb, 3)} | {fmt(ckpt_gb, 3)} "
                   f"| {percent(fn)} | {percent(fm)} | {fm / fn:.2f} | {percent(rn / n['graph_us'])} "
                   f"| {percent(rm / m['graph_us'])} |")
    out.append("")
    out.append("Each fraction against its format's own roofline: NVFP4's 4.5 bits a weight, MXFP4's checkpoint "
               "4.25 bits, which the device reads (one multiplier byte per 32 weights: GB read). "
               "The MXFP4 decode target (T <= 64) is a ratio of 1.")
    return out


def routed_table(routed_path, baselines_path):
    rows = json_lines(routed_path)
    ceil = next((r for r in rows if r.get("kind") == "ceilings"), None)
    if ceil is None:
        sys.exit(f"perf_table: {routed_path} has no ceilings line")
    read_bps = ceil["read_tbps"] * 1e12
    peaks = {"bf16": ceil["bf16_tflops"] * 1e12}
    if "fp8_tflops" in ceil:
        peaks["fp8"] = ceil["fp8_tflops"] * 1e12
    baselines = {}
    if baselines_path:
        for r in json_lines(baselines_path):
            if r.get("kind") == "torch":
                baselines[(routed_model(r), r["experts"], r["T"])] = r
    out = []
    copy = f", device copy (read + write) {ceil['copy_tbps']:.2f} TB/s" if "copy_tbps" in ceil else ""
    on = f" on {ceil['device']}" if ceil.get("device") else ""
    fp8_peak = f", FP8 dense {ceil['fp8_tflops']:.0f} TFLOP/s" if "fp8_tflops" in ceil else ""
    out.append(f"Ceilings measured in the same run{on}: HBM read {ceil['read_tbps']:.2f} TB/s{copy}, "
               f"BF16 dense {ceil['bf16_tflops']:.0f} TFLOP/s{fp8_peak}.")
    out.append("")
    ours = sorted((r for r in rows if r.get("kind") == "ours"),
                  key=lambda r: (r["experts"], r["T"], order(FORMATS, routed_format(r)[0]),
                                 order(ACTS, routed_format(r)[1])))
    for model in sorted({routed_model(r) for r in ours} - {"dsv4-pro"}):
        h, i = routed_shape(next(r for r in ours if routed_model(r) == model))
        name, experts = LAYER_MODELS[model]
        out.append(f"{name} geometry: H={h}, I={i}, top-6, {experts} routed experts (EP8 holds "
                   f"{experts // 8} of them).")
        out.append("")
    out.append("| workload | T | pairs | experts touched | kernel | format | act | routed path us | GEMMs us "
               "| roofline us | GEMM fraction | path fraction | PyTorch BF16 us | PyTorch FP8 us | vs BF16 | vs FP8 |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in ours:
        roof_us = routed_roofline_us(r, read_bps, peaks)
        path_us, gemm_us = r["graph_us"], r["gemm_us"]
        b = baselines.get((routed_model(r), r["experts"], r["T"]), {})
        bf16, fp8 = b.get("bf16_us"), b.get("fp8_us")
        weights, act = routed_format(r)
        out.append(f"| {workload_name(r)} | {r['T']} | {r['pairs']} | {r['touched']} | {r['config']} "
                   f"| {weights} | {act} | {fmt(path_us)} | {fmt(gemm_us)} | {fmt(roof_us)} "
                   f"| {percent(roof_us / gemm_us)} | {percent(roof_us / path_us)} | {fmt(bf16)} | {fmt(fp8)} "
                   f"| {ratio(bf16, path_us)} | {ratio(fp8, path_us)} |")
    out.append("")
    out.append("Routed path: one CUDA graph of grouping, L1 staging, gate/up GEMM + SwiGLU, requantization, "
               "down GEMM and combine (no router, no shared expert), median of the replays. GEMMs: the two "
               "grouped GEMMs alone and the kernel the device chose (decode, or the prefill kernel's split "
               "launches). format: the routed experts' weights; act: their activation mode (docs/numerics.md "
               "§7). Roofline: max(the format's bytes of the touched experts (NVFP4 4.5 bits a weight, MXFP4 "
               "its checkpoint's 4.25, which the device reads) / HBM read, 2 x pairs x 3HI FLOPs / BF16 "
               "dense, or FP8 dense for the FP8 form's kernels fp8-narrow and fp8-split). Baselines: PyTorch "
               "MoEs with the same routing, SwiGLU and combine, BF16 `torch._grouped_mm` and FP8 rowwise "
               "`torch._scaled_grouped_mm`; vs = baseline time / routed path time.")
    out += format_comparison(ours, read_bps, peaks)
    return out


# `nvfp4moe bench --model`: the name and the routed experts of each model.
LAYER_MODELS = {"dsv4-pro": ("DeepSeek-V4-Pro", 384), "dsv4-flash": ("DeepSeek-V4-Flash", 256)}


def layer_table(csv_path, log_path):
    out = []
    if log_path:
        with open(log_path) as f:
            lines = f.readlines()
        device = next((line[len("device:"):].strip() for line in lines if line.startswith("device:")), None)
        m = next((re.search(r"ceilings \(([^)]*)\): (.*)", line) for line in lines if line.startswith("ceilings")), None)
        if m:
            how = "measured in the same run" if m.group(1) == "measured now" else f"({m.group(1)})"
            on = f" on {device}" if device else ""
            out.append(f"Ceilings {how}{on}: {m.group(2).strip()}.")
            out.append("")
    out.append("| workload | T | format | act | shared expert | tokens | pairs | experts touched | forward us | GB "
               "| GFLOP | roofline us | fraction |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    model, timing = "dsv4-pro", "eager"
    with open(csv_path) as f:
        for r in csv.DictReader(f):
            model = r.get("model") or model  # the `model` column of --model other than dsv4-pro
            timing = r.get("timing") or timing  # the `timing` column of --graph
            # The format's own roofline where the CSV has it (other formats than NVFP4 alone).
            roof_us = float(r.get("checkpoint_roofline_us") or r["roofline_us"])
            frac = float(r.get("checkpoint_fraction") or r["fraction"])
            # The shared expert: the `shared` column of --shared fp8, else BF16 for ep1 and none for ep8.
            shared = r.get("shared") or ("none" if r["workload"] == "ep8" else "bf16")
            out.append(f"| {r['workload']} | {r['T']} | {r.get('format') or 'nvfp4'} | {r.get('act') or 'nvfp4'} "
                       f"| {shared} | {r['rows']} | {r['pairs']} | {r['experts']} "
                       f"| {float(r['time_us']):.1f} | {float(r['bytes']) / 1e9:.3f} | {float(r['flops']) / 1e9:.1f} "
                       f"| {roof_us:.1f} | {percent(frac)} |")
    out.append("")
    name, experts = LAYER_MODELS[model]
    how = ("each forward the replay of its input set's captured CUDA graph" if timing == "graph"
           else "eager launches, host work included")
    out.append(f"Forward: `Moe::forward` of a {name} layer on the cuda backend with caller routing, median over "
               f"rotated inputs, {how}. ep8: one rank of 8 ({experts // 8} local experts fed the pairs of 8T tokens, "
               f"routed experts only); ep1: all {experts} experts and the shared expert. GB: the bytes the device "
               "reads (the touched experts at 4.5 bits a weight for NVFP4, 4.25 for MXFP4, plus the shared "
               "expert's weights for ep1: BF16, or FP8 with its tile factors). Roofline from the row's FLOPs and "
               "its format's bytes (MXFP4: its checkpoint's 4.25 bits a weight) against the ceilings above.")
    return out


# deepseek-ai/DeepGEMM pull request 383: SM90 FP8 MegaMoE on 8 x H200,
# DeepSeek-V4-Pro, dispatch + GEMMs + combine, us at T tokens a rank.
DEEPGEMM_MEGAMOE_US = {8: 637, 64: 858, 512: 1005, 2048: 2406, 8192: 7939}
EP_HEADER = re.compile(r"expert parallel over (\d+) GPUs .*?, (\S+): H=(\d+) I=(\d+) E=(\d+) \((\d+) per rank\) "
                       r"k=(\d+), (\w+) shared expert, (\w+) combine, ([^,]+),")


def ep_runs(path):
    """The runs of a `bench --ep` log: header fields, {T: us}, {T: breakdown}."""
    runs = []
    with open(path) as f:
        for line in f:
            m = EP_HEADER.search(line)
            if m:
                runs.append({"ranks": int(m.group(1)), "model": m.group(2), "hidden": int(m.group(3)),
                             "experts": int(m.group(5)), "per_rank": int(m.group(6)), "shared": m.group(8),
                             "combine": m.group(9), "mode": m.group(10).strip(), "us": {}, "phases": {}})
                continue
            if not runs:
                continue
            cells = line.replace("|", " ").split()
            if not cells or not all(re.fullmatch(r"-?[0-9.]+", c) for c in cells):
                continue
            if len(cells) == 4:  # T, us/forward, tokens/s, symm MB
                runs[-1]["us"][int(cells[0])] = float(cells[1])
            elif len(cells) == 12:  # T, total, 6 phases, shared, dispatch MB, combine MB, GB/s
                v = [float(c) for c in cells]
                runs[-1]["phases"][int(cells[0])] = {
                    "total": v[1], "phases": v[2:8], "shared": v[8], "dispatch_mb": v[9], "combine_mb": v[10],
                    "gbps": v[11]}
    return runs


def ep_table(path, routed_path):
    single = {}
    if routed_path:
        for r in json_lines(routed_path):
            if r.get("kind") == "ours" and r["experts"] == 48 and routed_format(r) == ("nvfp4", "nvfp4"):
                single[r["T"]] = r["graph_us"]
    out = []
    for run in ep_runs(path):
        megamoe = run["model"] == "dsv4-pro" and run["per_rank"] == 48 and run["hidden"] == 7168
        out.append(f"`bench --ep {run['ranks']}`, {run['model']}, {run['experts']} experts ({run['per_rank']} a "
                   f"rank), {run['shared']} shared expert, {run['combine']} combine, {run['mode']}:")
        out.append("")
        out.append("| T a rank | layer us | eager forward us | stage | barrier | dispatch | experts (+ push) | barrier "
                   "| combine | shared expert (side) | NVLink MB dispatch / combine | NVLink GB/s a rank "
                   "| single-GPU routed path us | DeepGEMM MegaMoE us | layer / DeepGEMM |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for T in sorted(set(run["us"]) | set(run["phases"])):
            us = run["us"].get(T)
            ph = run["phases"].get(T)
            cells = [str(T), fmt(us)]
            if ph:
                cells += [fmt(ph["total"])] + [fmt(v) for v in ph["phases"]] + [
                    fmt(ph["shared"]), f"{ph['dispatch_mb']:.2f} / {ph['combine_mb']:.2f}",
                    fmt(ph["gbps"]) if run["ranks"] > 1 else "-"]
            else:
                cells += ["-"] * 10
            dg = DEEPGEMM_MEGAMOE_US.get(T) if megamoe else None
            cells += [fmt(single.get(T)), fmt(dg), ratio(us, dg)]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    out.append("Layer: the command's us per forward (eager launches, or one captured forward replayed). The "
               "breakdown: eager forwards with events between the phases (docs/ep.md), each forward waited for, "
               "per phase the median over the forwards and then the max over ranks; the phases run one after "
               "another, the shared expert beside them on a side stream. NVLink: the bytes all ranks move "
               "between GPUs in one forward (`ep_home_traffic`), and a rank's share of them over its dispatch + "
               "experts time (the down GEMM pushes the results). DeepGEMM: its published SM90 FP8 MegaMoE on 8 x H200 (DeepSeek-V4-Pro, "
               "communication included; deepseek-ai/DeepGEMM pull request 383), shown where a rank holds 48 "
               "experts of that geometry.")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routed", help="JSON lines of nvfp4moe_routed_bench --json")
    ap.add_argument("--baselines", help="JSON lines of bench/baselines_torch.py --json")
    ap.add_argument("--layer", help="CSV of nvfp4moe bench --csv")
    ap.add_argument("--layer-log", help="stdout of the same nvfp4moe bench run (its ceilings line)")
    ap.add_argument("--ep-log", help="stdout of nvfp4moe bench --ep R runs (bench/device_ep.sh's ep_bench.log)")
    ap.add_argument("--out", help="write the markdown here instead of stdout")
    a = ap.parse_args()
    if not (a.routed or a.layer or a.ep_log):
        ap.error("give --routed, --layer and/or --ep-log")
    lines = []
    if a.routed:
        lines += ["### The routed experts (`nvfp4moe_routed_bench`, `bench/baselines_torch.py`)", ""]
        lines += routed_table(a.routed, a.baselines)
    if a.layer:
        if lines:
            lines.append("")
        lines += ["### The whole layer (`nvfp4moe bench`)", ""]
        lines += layer_table(a.layer, a.layer_log)
    if a.ep_log:
        if lines:
            lines.append("")
        lines += ["### The expert-parallel layer (`nvfp4moe bench --ep R`)", ""]
        lines += ep_table(a.ep_log, a.routed)
    text = "\n".join(lines) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
