#!/usr/bin/env python3
"""What each kernel of a layer costs inside a decode step, with graphs and PDL as they run.

Nsight Compute (bench/kernel_breakdown.py) times each kernel alone with a cold L2; inside a CUDA
graph the kernels overlap, so their sum says little about the step. Here litellama-bench times
the step with one kernel of every layer launched twice (RunnerOptions::layer_kernel_repeats: the
repeat does the same work again) or left out, against the normal step, in separate processes,
alternating, `--rounds` times each. Per layer, the difference is that kernel's cost on the step's
critical path, dependency on its predecessor included. A repeat of a matrix that fits in L2
(50 MB on an H200) reads part of it from there, so for small matrices the figure is a lower
bound. Only the GEMV layer path (steps of up to 8 tokens for the small models) has the switch,
and only a profiling build (cmake -DLITELLAMA_PROFILING=ON) has --kernel-repeats.

Per kernel the table also gives its weights' read time at the copy bandwidth the first run
measures (bf16 weights, sizes from the checkpoint's config.json).

Usage: bench/step_breakdown.py --preset llama3.2-1b --dir DIR [--bin build/bin/litellama-bench]
                               [--batches 1,8] [--context 512] [--steps 100] [--rounds 2]
                               [--jsonl OUT.jsonl]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

KERNELS = ["qkv", "attention", "o", "post_norm", "gate_up", "down"]
LEFT_OUT = ["attention", "post_norm"]


def weight_bytes(cfg):
    h = cfg["hidden_size"]
    inter = cfg["intermediate_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads", nh)
    hd = cfg.get("head_dim") or h // nh
    return {"qkv": 2 * h * (nh + 2 * nkv) * hd, "o": 2 * nh * hd * h,
            "gate_up": 2 * 2 * h * inter, "down": 2 * inter * h}


def run_bench(a, repeats, copy_bandwidth, jsonl):
    cmd = [a.bin, "--preset", a.preset, "--dir", a.dir, "--batches", a.batches,
           "--context", str(a.context), "--steps", str(a.steps),
           "--copy-bandwidth", "1" if copy_bandwidth else "0"]
    if repeats:
        cmd += ["--kernel-repeats", repeats]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if jsonl:
        with open(jsonl, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bin/litellama-bench")
    ap.add_argument("--preset", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--batches", default="1")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--jsonl", default="")
    a = ap.parse_args()

    variants = [""] + [f"{k}=2" for k in KERNELS] + [f"{k}=0" for k in LEFT_OUT]
    ms = {}  # (variant, batch) -> [ms per step]
    bandwidth = 0.0
    for round_ in range(a.rounds):
        for v in variants:
            rows = run_bench(a, v, round_ == 0 and v == "", a.jsonl)
            for r in rows:
                if r.get("kind") == "copy_bandwidth":
                    bandwidth = r["gb_per_s"]
                elif r.get("kind") == "decode":
                    ms.setdefault((v, r["batch"]), []).append(r["ms"])
        print(f"[round {round_ + 1} of {a.rounds} done]", file=sys.stderr, flush=True)

    with open(os.path.join(a.dir, "config.json")) as f:
        cfg = json.load(f)
    n_layers = cfg["num_hidden_layers"]
    wb = weight_bytes(cfg)
    batches = sorted({b for (_, b) in ms})
    print(f"{a.preset}, context {a.context}, {n_layers} layers, copy bandwidth {bandwidth:.0f} GB/s;"
          f" microseconds per layer (median of {a.rounds} processes each)\n")
    header = "| kernel | " + " | ".join(f"batch {b}: repeated | left out" for b in batches)
    print(header + " | weights at the copy rate |")
    print("|---" * (1 + 2 * len(batches) + 1) + "|")
    base = {b: statistics.median(ms[("", b)]) for b in batches}
    print("| step, ms | " + " | ".join(f"{base[b]:.3f} | " for b in batches) + " | |")

    def per_layer_us(variant, b):
        v = ms.get((variant, b))
        return f"{(statistics.median(v) - base[b]) * 1e3 / n_layers:+.1f}" if v else "—"

    for k in KERNELS:
        cells = [f"{per_layer_us(f'{k}=2', b)} | {per_layer_us(f'{k}=0', b)}" for b in batches]
        read = f"{wb[k] / (bandwidth * 1e3):.1f}" if k in wb and bandwidth > 0 else "—"
        print(f"| {k} | " + " | ".join(cells) + f" | {read} |")


if __name__ == "__main__":
    main()
