#!/usr/bin/env python3
"""Per-kernel timeline figures of one decode step from a block trace (kernels/block_trace.h).

`litellama-bench ... --block-trace trace.csv`, built with -DLITELLAMA_PROFILING=ON, appends
one row per block of the traced kernels (the GEMVs, decode attention, add_rmsnorm) of one decode
step per batch: the multiprocessor, and the global timer when the block started, when its wait
for the previous kernel returned and when it finished. Here the rows become launches (blocks of
one kernel and variant, in start order, a new launch where a block index repeats), ordered by
their first release, and each launch gets:

  blocks     grid size; `per SM` the most blocks that ran on one multiprocessor, `SMs` how many
             multiprocessors ran at least one
  early      blocks that started before the previous traced launch's last block finished
             (programmatic dependent launch lets them in while it still runs)
  dep        the previous launch's last end -> this launch's first release (the dependency
             latency; kernels not traced, such as cuBLAS or sampling, fall inside it)
  start      first release -> the last block's start (blocks that could not be resident yet)
  busy       first release -> the median block's end
  drain      the median block's end -> the last block's end
  span       first release -> last end

The launches of a step repeat per layer: the summary takes each position of the layer's cycle
(found as the sequence of kernel kinds between two QKV GEMVs) and gives the median over the
layers, in microseconds, then the sum of spans and dependency latencies against the step.

With --after KIND (a kernel name prefix, e.g. attention) each kernel of the layer also gets its
blocks' ends after its first release split by multiprocessor: those where the latest launch of
KIND ran a block, and the others (median / p90 / max, us). GEMV blocks that followed decode
attention (the most shared memory, the least L1) onto its multiprocessors ran slower that way
(bench/RESULTS.md).

Usage: bench/block_timeline.py trace.csv [--preset P] [--batch B] [--launches] [--after KIND]
"""
import argparse
import csv
import statistics
import sys
from collections import defaultdict

EPILOGUES = {0: "store", 1: "residual", 2: "silu", 3: "rope"}


def kernel_name(kernel, variant):
    if kernel in (1, 2):
        epi, segs = divmod(variant, 16)
        name = "gemv-" + EPILOGUES.get(epi, str(epi))
        if kernel == 2:
            name += "-loop"
        if segs > 1:
            name += f"-s{segs}"
        return name
    if kernel == 3:
        return "attention" + ("-cluster" if variant else "")
    if kernel == 4:
        return "add_rmsnorm"
    return f"kernel{kernel}"


def launches_of(rows):
    by_kind = defaultdict(list)
    for r in rows:
        by_kind[(r["kernel"], r["variant"], r["n_blocks"])].append(r)
    launches = []
    for (kernel, variant, n_blocks), blocks in by_kind.items():
        blocks.sort(key=lambda r: r["start_ns"])
        current, seen = [], set()
        for b in blocks:
            if b["block"] in seen:
                launches.append((kernel_name(kernel, variant), n_blocks, current))
                current, seen = [], set()
            current.append(b)
            seen.add(b["block"])
        if current:
            launches.append((kernel_name(kernel, variant), n_blocks, current))
    launches.sort(key=lambda l: min(b["released_ns"] for b in l[2]))
    return launches


def launch_figures(launches):
    out = []
    prev_end = None
    for name, n_blocks, blocks in launches:
        rel = min(b["released_ns"] for b in blocks)
        ends = sorted(b["end_ns"] for b in blocks)
        last_start = max(b["start_ns"] for b in blocks)
        per_sm = defaultdict(int)
        for b in blocks:
            per_sm[b["sm"]] += 1
        f = {
            "name": name,
            "blocks": n_blocks,
            "traced": len(blocks),
            "per_sm": max(per_sm.values()),
            "sms": len(per_sm),
            "early": sum(1 for b in blocks if prev_end is not None and b["start_ns"] < prev_end),
            "dep": (rel - prev_end) / 1e3 if prev_end is not None else float("nan"),
            "start": (last_start - rel) / 1e3,
            "busy": (ends[len(ends) // 2] - rel) / 1e3,
            "drain": (ends[-1] - ends[len(ends) // 2]) / 1e3,
            "span": (ends[-1] - rel) / 1e3,
            "first_release": rel,
            "last_end": ends[-1],
            "rows": blocks,
        }
        out.append(f)
        prev_end = ends[-1]
    return out


def layer_cycle(figs):
    """The kernel names of one layer: from one QKV GEMV (rope epilogue) up to the next."""
    starts = [i for i, f in enumerate(figs) if f["name"].startswith("gemv-rope")]
    if len(starts) < 2:
        return None, starts
    return [f["name"] for f in figs[starts[0]:starts[1]]], starts


def quantiles(xs):
    xs = sorted(xs)
    if not xs:
        return "—"
    return f"{statistics.median(xs):.2f} / {xs[int(len(xs) * 0.9)]:.2f} / {xs[-1]:.2f} ({len(xs)})"


def print_after(figs, cycle, starts, kind):
    """Blocks' ends after their launch's release, split by whether the latest launch of `kind`
    before them ran a block on their multiprocessor, per kernel of the layer cycle."""
    n = len(cycle)
    split = defaultdict(lambda: ([], []))
    last_kind_sms = None
    for i, f in enumerate(figs):
        if f["name"].startswith(kind):
            last_kind_sms = {b["sm"] for b in f["rows"]}
            continue
        if last_kind_sms is None or i < starts[0]:
            continue
        j = (i - starts[0]) % n
        ran, other = split[j]
        for b in f["rows"]:
            (ran if b["sm"] in last_kind_sms else other).append(
                (b["end_ns"] - f["first_release"]) / 1e3)
    print(f"blocks' ends after their launch's release, us: median / p90 / max (blocks), on the "
          f"multiprocessors where the latest {kind} launch ran a block, and elsewhere:\n")
    print(f"| kernel | after {kind} | elsewhere |")
    print("|---|---|---|")
    for j, name in enumerate(cycle):
        if j in split:
            ran, other = split[j]
            print(f"| {name} | {quantiles(ran)} | {quantiles(other)} |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--preset")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--launches", action="store_true", help="print every launch too")
    ap.add_argument("--after", metavar="KIND",
                    help="split each kernel's blocks by whether a launch of KIND ran on their "
                    "multiprocessor just before (e.g. attention)")
    args = ap.parse_args()

    steps = defaultdict(list)
    with open(args.trace, newline="") as f:
        for r in csv.DictReader(f):
            key = (r["preset"], int(r["batch"]))
            if args.preset and key[0] != args.preset:
                continue
            if args.batch and key[1] != args.batch:
                continue
            row = {k: int(r[k]) for k in ("kernel", "variant", "block", "n_blocks", "sm",
                                          "start_ns", "released_ns", "end_ns")}
            row["step_ms"] = float(r["step_ms"])
            steps[key].append(row)
    if not steps:
        sys.exit("no rows match")

    cols = ["blocks", "per_sm", "sms", "early", "dep", "start", "busy", "drain", "span"]
    for (preset, batch), rows in steps.items():
        figs = launch_figures(launches_of(rows))
        t0 = figs[0]["first_release"]
        t1 = max(f["last_end"] for f in figs)
        print(f"## {preset}, batch {batch}: step {rows[0]['step_ms']:.3f} ms (host), "
              f"{len(figs)} traced launches over {(t1 - t0) / 1e3:.1f} us, {len(rows)} blocks")
        if args.launches:
            print("| # | kernel | " + " | ".join(cols) + " |")
            print("|---" * (len(cols) + 2) + "|")
            for i, f in enumerate(figs):
                print(f"| {i} | {f['name']} | " + " | ".join(
                    f"{f[c]:.2f}" if isinstance(f[c], float) else str(f[c]) for c in cols) + " |")
        cycle, starts = layer_cycle(figs)
        if cycle is None:
            print("(no repeating layer found)")
            continue
        n = len(cycle)
        layers = []
        for s in starts:
            chunk = figs[s:s + n]
            if [f["name"] for f in chunk] == cycle:
                layers.append(chunk)
        print(f"\n{len(layers)} layers of {n} traced kernels; medians per layer, us:\n")
        print("| kernel | " + " | ".join(cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        total_span = total_dep = 0.0
        for j, name in enumerate(cycle):
            vals = {c: statistics.median(l[j][c] for l in layers) for c in cols}
            total_span += vals["span"]
            if vals["dep"] == vals["dep"]:  # not nan
                total_dep += vals["dep"]
            print(f"| {name} | " + " | ".join(
                f"{vals[c]:.2f}" if c in ("dep", "start", "busy", "drain", "span") else
                f"{vals[c]:.0f}" for c in cols) + " |")
        layer_us = statistics.median(
            (layers[i + 1][0]["first_release"] - layers[i][0]["first_release"]) / 1e3
            for i in range(len(layers) - 1)) if len(layers) > 1 else float("nan")
        print(f"\nper layer: {layer_us:.2f} us (first QKV release to the next); spans "
              f"{total_span:.2f} + dependency latencies {total_dep:.2f} us\n")
        if args.after:
            print_after(figs, cycle, starts, args.after)


if __name__ == "__main__":
    main()
