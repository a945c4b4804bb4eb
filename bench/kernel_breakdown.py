#!/usr/bin/env python3
"""Per-kernel breakdown of one decode step, from Nsight Compute.

Runs litellama-bench under ncu (hardware timers and DRAM byte counters, each kernel replayed
alone with a cold L2 and the clocks left alone), keeps the kernels of the last decode step (a
step starts at embedding_kernel), and prints per kernel: launches, summed duration, DRAM bytes
read and the rate they were read at. The sum is the step as if its kernels ran back to back with
no overlap and no gaps; the measured step time (litellama-bench) shows what graphs and
programmatic dependent launch make of it.

Usage: bench/kernel_breakdown.py [--bin build/bin/litellama-bench] [--preset llama3.2-1b]
                                 [--batch 1] [--context 512] [--dir DIR] [-- extra bench flags]
"""
import argparse
import collections
import csv
import io
import os
import re
import subprocess
import sys


def short_name(name):
    name = re.sub(r"\(.*", "", name)           # drop the parameter list
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"litellama::(\(anonymous namespace\)::)?", "", name)
    name = name.replace("<unnamed>::", "").replace("__nv_bfloat16", "bf16")
    return name[:70]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin/litellama-bench")
    ap.add_argument("--ncu", default="ncu")
    ap.add_argument("--preset", default="llama3.2-1b")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--context", default="512")
    ap.add_argument("--dir", default="")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    bench = [a.bin, "--preset", a.preset, "--batches", a.batch, "--context", a.context,
             "--warmup", "0", "--steps", "2", "--graphs", "0", "--copy-bandwidth", "0"]
    if a.dir:
        bench += ["--dir", a.dir]
    cmd = [a.ncu, "--clock-control", "none", "--csv", "--print-units", "base",
           "--metrics", "gpu__time_duration.sum,dram__bytes_read.sum"] + bench + a.extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        sys.exit(f"ncu failed ({p.returncode})")
    lines = [l for l in p.stdout.splitlines() if l.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    kernels = collections.OrderedDict()
    for r in rows:
        key = r["ID"]
        k = kernels.setdefault(key, {"name": r["Kernel Name"], "grid": r.get("Grid Size", "")})
        k[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
    seq = list(kernels.values())
    starts = [i for i, k in enumerate(seq) if "embedding_kernel" in k["name"]]
    if not starts:
        sys.exit("no embedding_kernel launch found")
    step = seq[starts[-1]:]
    agg = collections.OrderedDict()
    for k in step:
        s = agg.setdefault(short_name(k["name"]) + " " + k["grid"], [0, 0.0, 0.0])
        s[0] += 1
        s[1] += k.get("gpu__time_duration.sum", 0.0)
        s[2] += k.get("dram__bytes_read.sum", 0.0)
    total_ns = sum(v[1] for v in agg.values())
    total_b = sum(v[2] for v in agg.values())
    print(f"{a.preset} batch {a.batch} context {a.context}: {len(step)} kernels, "
          f"{total_ns / 1e3:.1f} us summed, {total_b / 1e6:.1f} MB read from DRAM")
    print(f"{'kernel and grid':90s} {'n':>4s} {'us':>9s} {'us/launch':>9s} {'MB':>8s} {'GB/s':>7s} {'share':>6s}")
    for name, (n, ns, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        rate = b / ns if ns else 0.0
        print(f"{name:90s} {n:4d} {ns / 1e3:9.1f} {ns / 1e3 / n:9.2f} {b / 1e6:8.1f} {rate:7.0f} "
              f"{100 * ns / total_ns:5.1f}%")


if __name__ == "__main__":
    main()
