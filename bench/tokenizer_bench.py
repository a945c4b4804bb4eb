#!/usr/bin/env python3
"""Single-thread encode throughput: ours against Hugging Face tokenizers and tiktoken.

On the same records of a corpus (bench/make_tokenizer_corpus.py), for each tokenizer:
  - ours: build/bench/litellama-tokenizer-bench (the library, no Python in the timed loop);
  - HF tokenizers: the `tokenizers.Tokenizer` that transformers' AutoTokenizer builds
    (`backend_tokenizer`: for Llama 2 that is transformers' own Metaspace pipeline, for the others
    tokenizer.json as it is), `encode_batch_fast` (or `encode_batch`) over all records with
    TOKENIZERS_PARALLELISM=false and RAYON_NUM_THREADS=1, so one thread;
  - tiktoken (Llama 3 family only): an Encoding built from tokenizer.json's ranks (the byte-level
    vocabulary mapped back to bytes), its split pattern and its added tokens; `encode_ordinary`
    per record, or `encode(allowed_special="all")` for the records that spell an added token.
Every implementation encodes without adding BOS/EOS. Each is timed over --repeat passes, each
with a freshly built tokenizer (empty caches), and the best pass is reported (1 MB = 10^6 bytes).
The ids of every record must be identical across the implementations; the script prints the
first difference and exits 1 otherwise.

Usage (repository root, after building litellama-tokenizer-bench):
  python3 bench/make_tokenizer_corpus.py --out /tmp/corpus.jsonl
  python3 bench/tokenizer_bench.py --corpus /tmp/corpus.jsonl --names llama3,llama2,qwen3
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")

TIKTOKEN_FAMILIES = ("llama3", "llama3_1")


def byte_decoder():
    """The inverse of GPT-2's byte-to-character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def split_pattern(tj):
    pre = tj.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre])
    for s in steps:
        if s.get("type") == "Split" and "Regex" in s.get("pattern", {}):
            return s["pattern"]["Regex"]
    raise ValueError("no Split regex in tokenizer.json")


def build_tiktoken(tok_dir):
    import tiktoken

    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    dec = byte_decoder()
    ranks = {bytes(dec[c] for c in token): rank for token, rank in tj["model"]["vocab"].items()}
    specials = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}
    return tiktoken.Encoding(name=os.path.basename(tok_dir), pat_str=split_pattern(tj),
                             mergeable_ranks=ranks, special_tokens=specials), specials


def time_passes(n_repeat, make, run):
    best, out = None, None
    for _ in range(n_repeat):
        state = make()
        t0 = time.perf_counter()
        out = run(state)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best, out


def bench_hf(tok_dir, records, n_repeat):
    from transformers import AutoTokenizer

    def make():
        return AutoTokenizer.from_pretrained(tok_dir).backend_tokenizer

    def run(t):
        fast = getattr(t, "encode_batch_fast", None)
        return (fast or t.encode_batch)(records, add_special_tokens=False)

    best, encs = time_passes(n_repeat, make, run)
    return best, [e.ids for e in encs]  # converted to Python lists outside the timing


def bench_tiktoken(tok_dir, records, n_repeat):
    _, specials = build_tiktoken(tok_dir)
    spells_special = [any(s in r for s in specials) for r in records]

    def run(enc):
        out = []
        for r, sp in zip(records, spells_special):
            out.append(enc.encode(r, allowed_special="all") if sp else enc.encode_ordinary(r))
        return out

    return time_passes(n_repeat, lambda: build_tiktoken(tok_dir)[0], run)


def bench_ours(binary, tok_dir, corpus, n_repeat):
    with tempfile.TemporaryDirectory() as tmp:
        ids_path = os.path.join(tmp, "ids.txt")
        r = subprocess.run([binary, "--tokenizer", tok_dir, "--corpus", corpus, "--repeat",
                            str(n_repeat), "--ids-out", ids_path],
                           check=True, capture_output=True, text=True)
        result = json.loads(r.stdout)
        with open(ids_path, encoding="utf-8") as f:
            ids = [[int(x) for x in line.split()] for line in f.read().split("\n")[:-1]]
    return result["best_seconds"], ids


def first_difference(records, a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i, x, y
    if len(a) != len(b):
        return min(len(a), len(b)), None, None
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizers", default="assets/tokenizers")
    ap.add_argument("--names", default="llama3")
    ap.add_argument("--binary", default="build/bin/litellama-tokenizer-bench")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json-out", help="also write the results here")
    args = ap.parse_args()

    with open(args.corpus, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    n_bytes = sum(len(r.encode("utf-8")) for r in records)
    print(f"corpus {args.corpus}: {len(records)} records, {n_bytes} bytes; "
          f"{platform.processor() or platform.machine()}, one thread, best of {args.repeat}",
          flush=True)

    rows, ok = [], True
    for name in args.names.split(","):
        tok_dir = os.path.join(args.tokenizers, name)
        row = {"tokenizer": name}
        s_ours, ids_ours = bench_ours(args.binary, tok_dir, args.corpus, args.repeat)
        row["ours"] = n_bytes / 1e6 / s_ours
        s_hf, ids_hf = bench_hf(tok_dir, records, args.repeat)
        row["hf"] = n_bytes / 1e6 / s_hf
        diffs = {"HF tokenizers": first_difference(records, ids_ours, ids_hf)}
        if name in TIKTOKEN_FAMILIES:
            s_tt, ids_tt = bench_tiktoken(tok_dir, records, args.repeat)
            row["tiktoken"] = n_bytes / 1e6 / s_tt
            diffs["tiktoken"] = first_difference(records, ids_ours, ids_tt)
        row["identical"] = all(d is None for d in diffs.values())
        for who, d in diffs.items():
            if d is not None:
                ok = False
                i, x, y = d
                print(f"  {name}: ids differ from {who} at record {i} {records[i]!r}:\n"
                      f"    ours {x}\n    {who} {y}", flush=True)
        rows.append(row)
        print(f"  {name}: {json.dumps(row)}", flush=True)

    print()
    print("| tokenizer | ours MB/s | HF tokenizers MB/s | tiktoken MB/s | ours / HF | "
          "ours / tiktoken | ids identical on every record |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        tt = f"{r['tiktoken']:.2f}" if "tiktoken" in r else "-"
        ratio_tt = f"{r['ours'] / r['tiktoken']:.2f}x" if "tiktoken" in r else "-"
        print(f"| {r['tokenizer']} | {r['ours']:.2f} | {r['hf']:.2f} | {tt} | "
              f"{r['ours'] / r['hf']:.2f}x | {ratio_tt} | {'yes' if r['identical'] else 'NO'} |")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as f:
            json.dump({"bytes": n_bytes, "records": len(records), "rows": rows}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
