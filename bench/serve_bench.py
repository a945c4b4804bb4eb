#!/usr/bin/env python3
"""Served-path benchmarks on a GPU machine, each against its own reference in the same run.

  http     HTTP API against the ZeroMQ client path, concurrency 1 and 64 (five alternating
           runs each, medians): TTFT, TPOT and output tokens/s; CPU time per output token of the scheduler
           process, of its HTTP threads (libmicrohttpd's and the pump's) and of the bench client;
           and the scheduler's own mean time to first token (from its metrics), which tells a
           delay before the scheduler from one after it.
  cache    prefix cache on against off, two servers side by side (each idle while the other
           runs): shared-prefix, multi-turn (lengths spread, and fixed for reference), and a
           workload with no shared prefix (median of five alternating runs); per run, the
           worker's steps (count, tokens, wall and device time, share of the run it was idle).
  pool     100 requests against a KV pool a tenth of what they need together: every request
           completes, greedy ids compared with the same request alone, preemptions counted
           (float32 and bfloat16 servers).

Usage: bench/serve_bench.py --bin build/bin --parts http,cache,pool --out DIR
Writes DIR/serve_bench.json and prints one table per part.
"""
import argparse
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Server:
    """One `litellama serve` (scheduler, worker, tokenizer) with its own run dir and ports."""

    def __init__(self, bin_dir, model, name, port, metrics_port, extra, log_dir, device="cuda"):
        self.run_dir = f"/tmp/litellama-bench-{name}"
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.metrics_port = metrics_port
        self.port = port
        self.name = name
        cmd = [f"{bin_dir}/litellama", "serve", "--model", model, "--device", device,
               "--run-dir", self.run_dir, "--port", str(port), "--metrics-port",
               str(metrics_port), "--log-dir", f"{log_dir}/{name}"] + extra
        os.makedirs(f"{log_dir}/{name}", exist_ok=True)
        self.log = open(f"{log_dir}/{name}/serve.out", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + 180
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name}: serve exited with {self.proc.returncode}")
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/ready",
                                          timeout=1).status == 200:
                    break
            except Exception:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{name}: not ready in 180 s")
        self.scheduler_pid = self._pid_of("litellama-scheduler")

    def _pid_of(self, program):
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if args and args[0].decode().endswith(program) and \
                    self.run_dir.encode() in b" ".join(args):
                return int(pid)
        raise RuntimeError(f"{self.name}: no {program} process")

    def scheduler_cpu_seconds(self):
        with open(f"/proc/{self.scheduler_pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime

    def api_cpu_seconds(self):
        """CPU time of the HTTP server's threads in the scheduler process: libmicrohttpd's
        (named MHD-*) and the pump between them and the scheduler (api-pump), each summed."""
        total = {"mhd": 0.0, "pump": 0.0}
        for tid in os.listdir(f"/proc/{self.scheduler_pid}/task"):
            try:
                with open(f"/proc/{self.scheduler_pid}/task/{tid}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            name = text[text.index("(") + 1:text.rindex(")")]
            kind = "mhd" if name.startswith("MHD") else "pump" if name == "api-pump" else None
            if kind:
                fields = text.rsplit(")", 1)[1].split()
                total[kind] += (int(fields[11]) + int(fields[12])) / CLK_TCK
        return total

    def metric(self, series, port_offset=0):
        """A series' value on the scheduler's metrics port, or on the worker's (offset 1)."""
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port + port_offset}/metrics",
            timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith(series + " ") or line.startswith(series + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    @property
    def zmq(self):
        return f"ipc://{self.run_dir}/client.sock"

    @property
    def http(self):
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()


def bench(bin_dir, target, args):
    """Runs `litellama bench --json` against a server address or an HTTP base URL."""
    where = ["--base-url", target] if target.startswith("http") else ["--server", target]
    out = subprocess.run([f"{bin_dir}/litellama", "bench", "--json"] + where + args,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"bench {args} failed: {out.stdout[-2000:]} {out.stderr[-2000:]}")
    j = json.loads(out.stdout[out.stdout.index("{"):])
    if j["n_completed"] != j["n_requests"]:
        raise RuntimeError(f"bench {args}: {j['n_completed']} of {j['n_requests']} completed")
    return j


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def part_http(a, model, results):
    s = Server(a.bin, model, "http", 8000, 9400, ["--no-prefix-cache"], a.out, a.device)
    rows = {}
    ttft_series = "litellama_scheduler_time_to_first_token_seconds"
    try:
        bench(a.bin, s.zmq, ["-n", "8", "-c", "8", "--output-len", "16"])  # warm-up
        # c=1: fixed lengths. c=64: lengths uniform in [64, 128], so that requests finish and
        # arrive one by one as in a served load; with one fixed length the 64 streams run in
        # synchronized waves (all admitted within a few steps, all finishing in the same steps),
        # whose TTFT varies by 10 ms and more between runs of the same path.
        for conc, n, ratio in ((1, 32, "1"), (64, 512, "0.5")):
            for rep in range(5):
                for path in ("zmq", "http"):
                    cpu0, api0, client0 = (s.scheduler_cpu_seconds(), s.api_cpu_seconds(),
                                           children_cpu_seconds())
                    ttft0 = (s.metric(ttft_series + "_sum"), s.metric(ttft_series + "_count"))
                    j = bench(a.bin, getattr(s, path),
                              ["-n", str(n), "-c", str(conc), "--input-len", "128",
                               "--output-len", "128", "--random-range-ratio", ratio,
                               "--seed", str(100 * conc + rep), "--vocab-size", "128000"])
                    cpu = s.scheduler_cpu_seconds() - cpu0
                    api1 = s.api_cpu_seconds()
                    client = children_cpu_seconds() - client0
                    ttft = (s.metric(ttft_series + "_sum") - ttft0[0],
                            s.metric(ttft_series + "_count") - ttft0[1])
                    tokens = j["output_tokens"]
                    r = rows.setdefault(f"{path} c={conc}", {
                        "ttft": [], "tpot": [], "tps": [], "cpu_us_per_token": [],
                        "api_us_per_token": [], "mhd_us_per_token": [], "pump_us_per_token": [],
                        "client_us_per_token": [], "scheduler_ttft_ms": []})
                    r["mhd_us_per_token"].append((api1["mhd"] - api0["mhd"]) * 1e6 / tokens)
                    r["pump_us_per_token"].append((api1["pump"] - api0["pump"]) * 1e6 / tokens)
                    r["api_us_per_token"].append(
                        r["mhd_us_per_token"][-1] + r["pump_us_per_token"][-1])
                    r["client_us_per_token"].append(client * 1e6 / tokens)
                    r["scheduler_ttft_ms"].append(ttft[0] * 1e3 / max(ttft[1], 1))
                    r["ttft"].append(j["ttft"]["p50_ms"])
                    r["tpot"].append(j["tpot"]["p50_ms"])
                    r["tps"].append(j["output_token_throughput"])
                    r["cpu_us_per_token"].append(cpu * 1e6 / tokens)
    finally:
        s.stop()
    med = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in rows.items()}
    results["http"] = {"runs": rows, "median": med}
    print("\n## HTTP against ZeroMQ (Llama-3.2-1B shape, bf16; c=1: 128 + 128 tokens; c=64: "
          "lengths uniform in [64, 128]; median of 5)")
    print("| path | TTFT p50 ms | TPOT p50 ms | output tok/s | scheduler process CPU us/token "
          "| HTTP threads CPU us/token (MHD + pump) | bench client CPU us/token "
          "| scheduler's TTFT mean ms |")
    print("|---|---|---|---|---|---|---|---|")
    for k, m in med.items():
        print(f"| {k} | {m['ttft']:.3f} | {m['tpot']:.4f} | {m['tps']:.0f} | "
              f"{m['cpu_us_per_token']:.1f} | {m['api_us_per_token']:.1f} "
              f"({m['mhd_us_per_token']:.1f} + {m['pump_us_per_token']:.1f}) | "
              f"{m['client_us_per_token']:.1f} | {m['scheduler_ttft_ms']:.3f} |")
    for conc in (1, 64):
        z, h = med[f"zmq c={conc}"], med[f"http c={conc}"]
        print(f"c={conc}: TPOT http/zmq {h['tpot'] / z['tpot']:.4f}, TTFT http-zmq "
              f"{h['ttft'] - z['ttft']:+.3f} ms, tok/s http/zmq {h['tps'] / z['tps']:.4f}, "
              f"HTTP server threads {h['api_us_per_token']:.1f} us CPU per output token")


WORKER_SERIES = ("litellama_worker_steps_total", "litellama_worker_step_tokens_total",
                 "litellama_worker_step_duration_seconds_sum",
                 "litellama_worker_step_device_seconds_sum")


def worker_totals(s):
    return {k: s.metric(k, port_offset=1) for k in WORKER_SERIES}


def step_report(before, after, wall):
    """Steps of one run from the worker's counters: how many, mean tokens, mean wall and device
    ms per step, and the share of the run's wall time the worker spent outside steps."""
    d = {k: after[k] - before[k] for k in WORKER_SERIES}
    n = max(d["litellama_worker_steps_total"], 1)
    busy = d["litellama_worker_step_duration_seconds_sum"]
    return {"steps": d["litellama_worker_steps_total"],
            "tokens_per_step": d["litellama_worker_step_tokens_total"] / n,
            "step_wall_ms": busy * 1e3 / n,
            "step_device_ms": d["litellama_worker_step_device_seconds_sum"] * 1e3 / n,
            "idle_share": max(0.0, 1.0 - busy / wall) if wall > 0 else 0.0}


def part_cache(a, model, results):
    # As many running sequences as the shared-prefix workload's concurrency, so that its requests
    # wait for the GPU, not in the queue.
    util = ["--max-batch-seqs", "256"] + (["--max-batch-tokens", a.batch_tokens]
                                           if a.batch_tokens else [])
    if a.device == "cuda":
        util += ["--gpu-memory-utilization", "0.3"]
    on = Server(a.bin, model, "cache-on", 8001, 9410, util, a.out, a.device)
    off = Server(a.bin, model, "cache-off", 8002, 9420, util + ["--no-prefix-cache"], a.out,
                 a.device)
    out = {}
    try:
        for s in (on, off):
            bench(a.bin, s.zmq, ["-n", "16", "-c", "16", "--output-len", "16", "--seed", "999"])
        shared = ["--workload", "shared-prefix", "-c", "256", "--seed", "1"]
        # Question and answer lengths uniform in [64, 128] and [128, 256]: the conversations drift
        # apart, and each turn arrives while the others decode. With fixed lengths (the second
        # run, for reference) every conversation ends its turn in the same step and the next turns
        # arrive together, so TTFT mostly measures their queue behind each other.
        multi = ["--workload", "multi-turn", "-c", "16", "--seed", "2",
                 "--random-range-ratio", "0.5"]
        fixed = ["--workload", "multi-turn", "-c", "16", "--seed", "2"]
        for name, args in (("shared-prefix", shared), ("multi-turn", multi),
                           ("multi-turn-fixed", fixed)):
            out[name] = {}
            for key, s in (("on", on), ("off", off)):
                w0, t0 = worker_totals(s), time.time()
                out[name][key] = bench(a.bin, s.zmq, args)
                out[name][key]["steps"] = step_report(w0, worker_totals(s), time.time() - t0)
        # Lengths uniform in [256, 512] + [64, 128], so that requests finish and arrive one by
        # one as in a served load (fixed lengths run in synchronized waves, see part_http).
        plain = {"on": [], "off": []}
        steps = {"on": [], "off": []}
        plain_args = ["-n", "512", "-c", "64", "--input-len", "512", "--output-len", "128",
                      "--random-range-ratio", "0.5"]
        # One unmeasured run on each server first: the workloads before left the two servers
        # with CUDA graphs for different batch shapes (the cache-on server's shared-prefix steps
        # were cascade graphs, a key of their own), and a graph's first capture would otherwise
        # fall into one server's measured runs only.
        for s in (on, off):
            bench(a.bin, s.zmq, plain_args + ["--seed", "9"])
        for rep in range(5):
            args = plain_args + ["--seed", str(10 + rep)]
            order = (("on", on), ("off", off)) if rep % 2 == 0 else (("off", off), ("on", on))
            for key, s in order:
                w0, t0 = worker_totals(s), time.time()
                plain[key].append(bench(a.bin, s.zmq, args)["output_token_throughput"])
                steps[key].append(step_report(w0, worker_totals(s), time.time() - t0))
        out["no-shared-prefix"] = plain
        out["no-shared-prefix-steps"] = steps
    finally:
        on.stop()
        off.stop()
    results["cache"] = out
    print("\n## Prefix cache on against off (Llama-3.2-1B shape, bf16)")
    print("| workload | cache | output tok/s | TTFT p50 ms | TTFT p99 ms | cached prompt tokens | "
          "steps |")
    print("|---|---|---|---|---|---|---|")
    for name in ("shared-prefix", "multi-turn", "multi-turn-fixed"):
        for key in ("on", "off"):
            j = out[name][key]
            r = j["steps"]
            print(f"| {name} | {key} | {j['output_token_throughput']:.0f} | "
                  f"{j['ttft']['p50_ms']:.2f} | {j['ttft']['p99_ms']:.2f} | "
                  f"{j['cached_prompt_tokens']} | {r['steps']:.0f} steps of "
                  f"{r['tokens_per_step']:.0f} tokens, {r['step_wall_ms']:.3f} ms wall "
                  f"({r['step_device_ms']:.3f} device), worker idle "
                  f"{100 * r['idle_share']:.1f}% |")
        j_on, j_off = out[name]["on"], out[name]["off"]
        print(f"{name}: throughput on/off "
              f"{j_on['output_token_throughput'] / j_off['output_token_throughput']:.2f}x, "
              f"TTFT p50 off/on {j_off['ttft']['p50_ms'] / j_on['ttft']['p50_ms']:.2f}x")
    m_on, m_off = statistics.median(plain["on"]), statistics.median(plain["off"])
    print(f"no shared prefix (median of 5 alternating): on {m_on:.0f} tok/s, off {m_off:.0f} "
          f"tok/s, on/off {m_on / m_off:.4f} (runs on {plain['on']}, off {plain['off']})")
    for key in ("on", "off"):
        for r in out["no-shared-prefix-steps"][key]:
            print(f"  {key}: {r['steps']:.0f} steps, {r['tokens_per_step']:.1f} tokens/step, "
                  f"{r['step_wall_ms']:.3f} ms wall, {r['step_device_ms']:.3f} ms device per "
                  f"step, worker idle {100 * r['idle_share']:.1f}% of the run")


def generate(bin_dir, server, ids, n_new):
    return subprocess.Popen([f"{bin_dir}/litellama", "generate", "--server", server,
                             "--input-ids", ",".join(map(str, ids)), "--max-new-tokens",
                             str(n_new), "--ignore-eos", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def collect(p):
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        return {"error": (out + err)[-500:]}
    return json.loads(out[out.index("{"):])


def part_pool(a, model, results):
    rng = random.Random(7)
    requests = [([rng.randrange(128000) for _ in range(rng.randint(200, 400))],
                 rng.randint(64, 128)) for _ in range(100)]
    need = sum(len(ids) + n for ids, n in requests)
    pool = need // 10
    out = {"need": need, "pool": pool}
    for dtype in ("float32", "bfloat16"):
        s = Server(a.bin, model, f"pool-{dtype}", 8003, 9430,
                   ["--dtype", dtype, "--kv-slots", str(pool)], a.out, a.device)
        try:
            t0 = time.time()
            together = [collect(p) for p in
                        [generate(a.bin, s.zmq, ids, n) for ids, n in requests]]
            wall = time.time() - t0
            preemptions = s.metric("litellama_scheduler_preemptions_total")
        finally:
            s.stop()
        cold = Server(a.bin, model, f"alone-{dtype}", 8004, 9440,
                      ["--dtype", dtype, "--no-prefix-cache"], a.out, a.device)
        try:
            alone = [collect(generate(a.bin, cold.zmq, ids, n)) for ids, n in requests]
        finally:
            cold.stop()
        complete = sum(1 for t, (_, n) in zip(together, requests)
                       if "error" not in t and len(t["output_ids"]) == n)
        identical = sum(1 for t, l in zip(together, alone)
                        if "error" not in t and "error" not in l and
                        t["output_ids"] == l["output_ids"])
        errors = [t["error"] for t in together if "error" in t][:3]
        out[dtype] = {"complete": complete, "identical": identical, "preemptions": preemptions,
                      "wall_s": wall, "errors": errors}
    results["pool"] = out
    print(f"\n## 100 requests, pool of {pool} KV slots (a tenth of the {need} they need)")
    print("| dtype | completed | greedy ids identical to alone | preemptions | wall s |")
    print("|---|---|---|---|---|")
    for dtype in ("float32", "bfloat16"):
        r = out[dtype]
        print(f"| {dtype} | {r['complete']} of 100 | {r['identical']} of 100 | "
              f"{r['preemptions']:.0f} | {r['wall_s']:.1f} |")
        for e in r["errors"]:
            print("error:", e)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, default, what in (
            ("--bin", "build/bin", "directory of the litellama programs"),
            ("--parts", "http,cache,pool", "parts to run, comma-separated"),
            ("--out", "serve-bench-out", "directory of the results and the servers' logs"),
            ("--preset", "llama3.2-1b", "random-weight model preset (bf16)"),
            ("--device", "cuda", "cuda, or cpu to try the script out"),
            ("--batch-tokens", "", "cache part: the servers' --max-batch-tokens (their default "
                                   "when empty)")):
        ap.add_argument(flag, default=default, help=what)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    model = f"/tmp/litellama-{a.preset}"
    if not os.path.exists(f"{model}/config.json"):
        subprocess.run([f"{a.bin}/litellama", "make-model", "--preset", a.preset, "--out", model,
                        "--dtype", "bfloat16"], check=True, stdout=subprocess.DEVNULL)
    results = {"preset": a.preset}
    status = 0
    for part in a.parts.split(","):
        try:
            {"http": part_http, "cache": part_cache, "pool": part_pool}[part](a, model, results)
        except Exception as e:  # a part's failure is reported and the others still run
            print(f"{part}: failed: {e}")
            results[part] = {"error": str(e)}
            status = 1
        sys.stdout.flush()
    with open(f"{a.out}/serve_bench.json", "w") as f:
        json.dump(results, f, indent=1)
    return status


if __name__ == "__main__":
    sys.exit(main())
