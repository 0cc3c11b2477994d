#!/usr/bin/env python3
"""One line per kernel launch of an `ncu --section SpeedOfLight --csv` report, in launch order:
name, duration, DRAM and SM throughput (% of peak), then the sum of the durations.

    python3 bench/ncu_kernel_table.py REPORT.csv
"""
import csv
import re
import sys

UNIT_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("  (no ncu rows)")
    sys.exit(0)
col = {n: i for i, n in enumerate(rows[0])}
launches = {}
for r in rows[1:]:
    n = r[col["Kernel Name"]].replace("(anonymous namespace)::", "").replace("(nvfp4moe::cuda::Projection)", "P")
    mt = re.search(r"(\w+)(<[^(]*>)?\(", n)
    name = (mt.group(1) + (mt.group(2) or "")) if mt else n[:60]
    key = (int(r[col["ID"]]), name[:60])
    launches.setdefault(key, {})[r[col["Metric Name"]]] = (r[col["Metric Value"]], r[col["Metric Unit"]])
total = 0.0
for (_, name), m in sorted(launches.items()):
    value, unit = m.get("Duration", ("0", "usecond"))
    try:
        us = float(value.replace(",", "")) * UNIT_US.get(unit, 1.0)
    except ValueError:
        us = 0.0
    total += us
    dram = m.get("DRAM Throughput", ("?",))[0]
    sm = m.get("Compute (SM) Throughput", ("?",))[0]
    print(f"  {name:60s} {us:9.1f} us  dram {dram:>6s}%  sm {sm:>6s}%")
print(f"  {'sum of kernel durations':60s} {total:9.1f} us")
