#!/usr/bin/env python3
"""bench/perf_table.py on small inputs written here: routed JSON lines
without "format" / "act" (the bench before those options) read as NVFP4
with nvfp4 activations; MXFP4 rows take their roofline from the 4.25-bit
checkpoint bytes and are set beside the NVFP4 row of the same workload,
mode and T; the layer CSV in both of its forms. Standard library only
(unittest), run by ctest (label cpu) as `python3 test_perf_table.py`."""
import csv
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "perf_table.py")
H, I = 7168, 3072
CEILINGS = {"kind": "ceilings", "read_tbps": 4.0, "copy_tbps": 3.6, "bf16_tflops": 800.0}


def routed_row(T, touched, gemm_us, graph_us, fmt=None, act=None):
    r = {"kind": "ours", "ep": "EP8", "experts": 48, "T": T, "pairs": 6 * T, "touched": touched,
         "config": "decode", "gemm_us": gemm_us, "graph_us": graph_us, "sweep": ""}
    if fmt:  # the fields the bench writes since --format / --act
        weights = touched * 3.0 * H * I
        bits = 4.25 if fmt == "mxfp4" else 4.5
        r.update({"format": fmt, "act": act, "device_bits": 4.5, "checkpoint_bits": bits,
                  "device_bytes": weights * 4.5 / 8, "checkpoint_bytes": weights * bits / 8})
    return r


def table_rows(text, first_cell):
    """The cells of the markdown rows whose first cell is first_cell."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] == first_cell:
            out.append(cells)
    return out


class PerfTable(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def run_table(self, *args, **files):
        paths = {}
        for name, lines in files.items():
            paths[name] = os.path.join(self.dir.name, name)
            with open(paths[name], "w") as f:
                f.write(lines)
        argv = [a.format(**paths) for a in args]
        p = subprocess.run([sys.executable, SCRIPT] + argv, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        return p.stdout

    @staticmethod
    def json_lines(rows):
        return "".join(json.dumps(r) + "\n" for r in rows)

    def test_old_routed_json_reads_as_nvfp4(self):
        text = self.run_table("--routed", "{old}",
                              old=self.json_lines([CEILINGS, routed_row(8, 30, 300.0, 320.0),
                                                   routed_row(1, 6, 100.0, 110.0)]))
        rows = table_rows(text, "EP8 (48 experts)")
        self.assertEqual([r[1] for r in rows], ["1", "8"], "sorted by T")
        # workload, T, pairs, touched, kernel, format, act, path, GEMMs, roofline, GEMM fraction, path fraction
        self.assertEqual(rows[0][:12], ["EP8 (48 experts)", "1", "6", "6", "decode", "nvfp4", "nvfp4", "110.0",
                                        "100.0", "55.7", "56 %", "51 %"])
        self.assertEqual(rows[1][5:7], ["nvfp4", "nvfp4"])
        self.assertEqual(rows[1][9], "278.7")  # 30 experts x 3HI x 4.5 bits / 4 TB/s
        self.assertNotIn("MXFP4 against NVFP4", text)

    def test_mxfp4_rows_use_the_checkpoint_roofline_beside_nvfp4(self):
        rows = [CEILINGS]
        for fmt in ("mxfp4", "nvfp4"):
            for act in ("fp8", "bf16"):
                rows.append(routed_row(1, 6, 100.0 if fmt == "nvfp4" else 94.0, 125.0, fmt, act))
        rows.append(routed_row(8, 30, 300.0, 320.0, "mxfp4", "fp8"))  # no NVFP4 twin: main table only
        text = self.run_table("--routed", "{new}", new=self.json_lines(rows))
        main = [r for r in table_rows(text, "EP8 (48 experts)") if len(r) == 16]
        self.assertEqual([(r[1], r[5], r[6]) for r in main],
                         [("1", "nvfp4", "bf16"), ("1", "nvfp4", "fp8"), ("1", "mxfp4", "bf16"),
                          ("1", "mxfp4", "fp8"), ("8", "mxfp4", "fp8")])
        self.assertEqual(main[0][9:11], ["55.7", "56 %"])   # 4.5 bits a weight
        self.assertEqual(main[2][9:11], ["52.6", "56 %"])   # 4.25 bits: 52.6 us / 94 us
        self.assertIn("MXFP4 against NVFP4", text)
        pairs = [r for r in table_rows(text, "EP8 (48 experts)") if len(r) == 13]
        self.assertEqual([(r[1], r[2]) for r in pairs], [("1", "bf16"), ("1", "fp8")])
        # T, act, kernel, NVFP4 us, MXFP4 us, GB read, MXFP4 GB, fractions, ratio, path fractions
        self.assertEqual(pairs[0][1:], ["1", "bf16", "decode", "100.0", "94.0", "0.223", "0.211", "56 %", "56 %",
                                        "1.00", "45 %", "42 %"])

    def test_fp8_form_rows_use_the_fp8_peak(self):
        # 2048 tokens: 12288 pairs x 3HI x 2 = 1.62 TFLOP against 0.21 GB of 48 experts' checkpoint bytes.
        ceilings = dict(CEILINGS, fp8_tflops=1600.0)
        bf16_form = routed_row(2048, 48, 3000.0, 3100.0, "mxfp4", "fp8")
        bf16_form["config"] = "split"
        fp8_form = dict(bf16_form, config="fp8-split", gemm_us=4000.0, graph_us=4100.0)
        text = self.run_table("--routed", "{r}", r=self.json_lines([ceilings, bf16_form, fp8_form]))
        self.assertIn("FP8 dense 1600 TFLOP/s", text)
        main = {r[4]: r for r in table_rows(text, "EP8 (48 experts)") if len(r) == 16}
        self.assertEqual(main["split"][9:11], ["2029.4", "68 %"])     # 1.6235e12 / 800 TFLOP/s
        self.assertEqual(main["fp8-split"][9:11], ["1014.7", "25 %"])  # 1.6235e12 / 1600 TFLOP/s
        # A run without the FP8 ceiling keeps the BF16 peak for every row.
        text = self.run_table("--routed", "{r}", r=self.json_lines([CEILINGS, fp8_form]))
        self.assertNotIn("FP8 dense", text.split("\n")[2])
        self.assertEqual(table_rows(text, "EP8 (48 experts)")[0][9], "2029.4")

    def test_layer_csv_both_forms(self):
        head = "workload,T,rows,pairs,experts,time_us,bytes,flops,roofline_us,fraction"
        old = head + "\nep8,1,5,8,7,117.5,268000000,1100000000,60.10,0.5115\n"
        new = (head + ",format,act,checkpoint_bytes,checkpoint_roofline_us,checkpoint_fraction\n"
               "ep8,1,5,8,7,100.0,268000000,1100000000,60.10,0.6010,mxfp4,fp8,253000000,56.80,0.5680\n")
        for csv_text, want in ((old, ["nvfp4", "nvfp4", "none", "60.1", "51 %"]),
                               (new, ["mxfp4", "fp8", "none", "56.8", "57 %"])):
            text = self.run_table("--layer", "{layer}", layer=csv_text)
            rows = table_rows(text, "ep8")
            self.assertEqual(len(rows), 1, text)
            self.assertEqual(rows[0][2:5] + rows[0][11:13], want)
            self.assertEqual(rows[0][9], "0.268")  # GB: the bytes read, either form

    def test_layer_csv_shared_expert_column(self):
        head = "workload,T,rows,pairs,experts,time_us,bytes,flops,roofline_us,fraction"
        bf16 = head + "\nep1,1,1,6,6,150.0,400000000,1200000000,90.00,0.6000\n"
        fp8 = (head + ",shared\nep8,1,5,8,7,117.5,268000000,1100000000,60.10,0.5115,none\n"
               "ep1,1,1,6,6,120.0,330000000,1200000000,74.00,0.6167,fp8\n")
        self.assertEqual(table_rows(self.run_table("--layer", "{layer}", layer=bf16), "ep1")[0][4], "bf16")
        text = self.run_table("--layer", "{layer}", layer=fp8)
        self.assertEqual(table_rows(text, "ep8")[0][4], "none")
        self.assertEqual([r[4] for r in table_rows(text, "ep1")], ["fp8"])

    def test_layer_csv_model_column_names_the_model(self):
        head = "workload,T,rows,pairs,experts,time_us,bytes,flops,roofline_us,fraction"
        pro = head + "\nep8,1,5,8,7,117.5,268000000,1100000000,60.10,0.5115\n"
        flash = (head + ",model\nep8,1,5,8,7,60.0,100000000,400000000,25.00,0.4167,dsv4-flash\n"
                 "ep1,1,1,6,6,80.0,150000000,300000000,40.00,0.5000,dsv4-flash\n")
        text = self.run_table("--layer", "{layer}", layer=pro)
        self.assertIn("a DeepSeek-V4-Pro layer", text)
        self.assertIn("(48 local experts", text)
        self.assertIn("all 384 experts", text)
        text = self.run_table("--layer", "{layer}", layer=flash)
        self.assertIn("a DeepSeek-V4-Flash layer", text)
        self.assertIn("(32 local experts", text)
        self.assertIn("all 256 experts", text)
        self.assertEqual(table_rows(text, "ep8")[0][12], "42 %")

    def test_routed_rows_of_another_model_use_its_geometry(self):
        flash = {"kind": "ours", "model": "dsv4-flash", "hidden": 4096, "inter": 2048, "ep": "EP8", "experts": 32,
                 "T": 1, "pairs": 6, "touched": 6, "config": "decode", "gemm_us": 40.0, "graph_us": 50.0,
                 "sweep": ""}
        pro_baseline = {"kind": "torch", "ep": "EP8", "experts": 32, "T": 1, "bf16_us": 999.0, "fp8_us": 999.0}
        flash_baseline = dict(pro_baseline, model="dsv4-flash", bf16_us=400.0, fp8_us=200.0)
        text = self.run_table("--routed", "{r}", "--baselines", "{b}", r=self.json_lines([CEILINGS, flash]),
                              b=self.json_lines([flash_baseline, pro_baseline]))
        self.assertIn("DeepSeek-V4-Flash geometry: H=4096, I=2048, top-6, 256 routed experts (EP8 holds 32", text)
        rows = table_rows(text, "EP8 (32 experts)")
        self.assertEqual(len(rows), 1, text)
        # 6 experts x 3 x 4096 x 2048 x 4.5 bits / 4 TB/s = 21.2 us; only the Flash baseline is its twin
        self.assertEqual(rows[0][9:16], ["21.2", "53 %", "42 %", "400.0", "200.0", "8.00x", "4.00x"])
        pro = self.run_table("--routed", "{r}", r=self.json_lines([CEILINGS, routed_row(1, 6, 100.0, 110.0)]))
        self.assertNotIn("geometry:", pro)

    def test_layer_csv_timing_column_names_graph_replays(self):
        head = "workload,T,rows,pairs,experts,time_us,bytes,flops,roofline_us,fraction"
        eager = head + "\nep8,1,5,8,7,117.5,268000000,1100000000,60.10,0.5115\n"
        graph = head + ",timing\nep8,1,5,8,7,90.0,268000000,1100000000,60.10,0.6678,graph\n"
        text = self.run_table("--layer", "{layer}", layer=eager)
        self.assertIn("rotated inputs, eager launches, host work included.", text)
        text = self.run_table("--layer", "{layer}", layer=graph)
        self.assertIn("rotated inputs, each forward the replay of its input set's captured CUDA graph.", text)
        self.assertEqual(table_rows(text, "ep8")[0][8:], ["90.0", "0.268", "1.1", "60.1", "67 %"])

    def test_ceilings_name_the_device_when_the_run_does(self):
        device = "NVIDIA H100 80GB HBM3, 132 SMs, L2 52 MB"
        named = dict(CEILINGS, device=device)
        text = self.run_table("--routed", "{r}", r=self.json_lines([named, routed_row(1, 6, 100.0, 110.0)]))
        self.assertIn(f"Ceilings measured in the same run on {device}: HBM read 4.00 TB/s", text)
        text = self.run_table("--routed", "{r}", r=self.json_lines([CEILINGS, routed_row(1, 6, 100.0, 110.0)]))
        self.assertIn("Ceilings measured in the same run: HBM read 4.00 TB/s", text)
        head = "workload,T,rows,pairs,experts,time_us,bytes,flops,roofline_us,fraction"
        layer = head + "\nep8,1,5,8,7,117.5,268000000,1100000000,60.10,0.5115\n"
        log = (f"device: {device}\n"
               "ceilings (measured now): HBM read 3.18 TB/s, BF16 GEMM 784 TFLOP/s (cuBLAS 8192^3)\n")
        text = self.run_table("--layer", "{layer}", "--layer-log", "{log}", layer=layer, log=log)
        self.assertIn(f"Ceilings measured in the same run on {device}: HBM read 3.18 TB/s", text)
        text = self.run_table("--layer", "{layer}", "--layer-log", "{log}", layer=layer, log=log.split("\n", 1)[1])
        self.assertIn("Ceilings measured in the same run: HBM read 3.18 TB/s", text)

    def test_ep_log_tables_with_breakdown_and_deepgemm(self):
        # Two runs as `bench --ep R` prints them: eager with its breakdown, then a graph run without.
        log = (
            "expert parallel over 8 GPUs (NCCL symmetric memory, LSA barriers), dsv4-pro: H=7168 I=3072 E=384 "
            "(48 per rank) k=6, BF16 shared expert, f32 combine, eager launches, layer sized for each T, token bound "
            "T per forward\n"
            "  T/rank   us/forward tokens/s (all)      symm MB\n"
            "       8        500.0         128000         12.0\n"
            "     512       1500.0        2730667        800.0\n"
            "\n"
            "where an eager forward's time goes, us: ...\n"
            "  T/rank    total |   stage barrier dispatch  experts barrier combine |  shared | disp. MB "
            "comb. MB      GB/s\n"
            "       8    520.0 |    20.0    10.0     30.0    420.0    10.0    30.0 |    40.0 |      1.03 "
            "    9.66     336.7\n"
            "\n"
            "expert parallel over 2 GPUs (NCCL symmetric memory, LSA barriers), dsv4-pro: H=7168 I=3072 E=384 "
            "(192 per rank) k=6, BF16 shared expert, bf16 combine, one captured forward replayed, layer sized for "
            "each T, token bound T per forward\n"
            "  T/rank   us/forward tokens/s (all)      symm MB\n"
            "       1        190.0          10526          1.0\n")
        text = self.run_table("--ep-log", "{ep}", "--routed", "{routed}", ep=log,
                              routed=self.json_lines([CEILINGS, routed_row(8, 30, 300.0, 320.0)]))
        self.assertIn("`bench --ep 8`, dsv4-pro, 384 experts (48 a rank), BF16 shared expert, f32 combine, "
                      "eager launches:", text)
        rows = table_rows(text, "8")
        self.assertEqual(len(rows), 1)
        # T, layer, eager total, 6 phases, shared, NVLink MB, GB/s, single GPU, DeepGEMM, ratio
        self.assertEqual(rows[0], ["8", "500.0", "520.0", "20.0", "10.0", "30.0", "420.0", "10.0", "30.0",
                                   "40.0", "1.03 / 9.66", "336.7", "320.0", "637.0", "0.78x"])
        row512 = table_rows(text, "512")[0]
        self.assertEqual(row512[1:3], ["1500.0", "-"], "no breakdown row: dashes")
        self.assertEqual(row512[-2:], ["1005.0", "1.49x"])
        # The 192-experts-a-rank run: no DeepGEMM figure (its geometry is 48 a rank), GB/s kept.
        self.assertIn("`bench --ep 2`, dsv4-pro, 384 experts (192 a rank), BF16 shared expert, bf16 combine, "
                      "one captured forward replayed:", text)
        row1 = table_rows(text, "1")[0]
        self.assertEqual(row1[1], "190.0")
        self.assertEqual(row1[-2:], ["-", "-"])


if __name__ == "__main__":
    unittest.main()
