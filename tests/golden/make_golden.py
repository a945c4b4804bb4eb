#!/usr/bin/env python3
"""Reference outputs of Hugging Face transformers for the engine's test models.

For every test preset, the project's own generator (`litellama make-model`) writes a random
float32 checkpoint from a fixed seed, and transformers loads it with eager attention.

--dtype float32 (the default) runs on the CPU, so no TF32 or fused kernel enters. For each prompt
length (1, 7 and 67) it draws N_CANDIDATES prompts and keeps the one whose first generated
position has the largest top-1/top-2 logit gap relative to the logit scale, so that the 16-bit
references made from the same prompts are decisive (a rounding error of a few percent of the scale
cannot swap the top two). It then runs greedy decoding: the first generated position's top logits
and 24 greedy tokens per prompt go to <out>/<preset>.json.

--dtype bfloat16 / float16 runs transformers in that dtype on the GPU for the prompts of the
float32 file and writes <out>/<preset>.<dtype>.json: the first position's top logits, their scale
and the greedy ids.

The tests regenerate the same checkpoints from the seed and compare.

Usage: make_golden.py --litellama build/bin/litellama --out tests/golden/models [--presets a,b]
                      [--dtype float32|bfloat16|float16]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

PRESETS = [
    "llama3-tiny", "llama3-untied-tiny", "llama2-linear-tiny", "llama2-dynamic-tiny",
    "mistral-tiny", "qwen2-tiny", "qwen2-yarn-tiny", "qwen3-tiny",
    "hd16-tiny", "hd32-tiny", "hd48-tiny", "hd80-tiny", "hd96-tiny", "hd256-tiny",
]
PROMPT_LENGTHS = [1, 7, 67]
N_GENERATED = 24
N_TOP = 8
SEED = 1234
N_CANDIDATES = 64
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def prompt_ids(vocab_size, length, salt):
    rng = np.random.default_rng(SEED * 1000 + length * 10 + salt)
    return [int(x) for x in rng.integers(0, vocab_size, size=length)]


@torch.no_grad()
def pick_prompt(model, vocab, length, salt):
    """The candidate prompt whose first generated position is the most decisive."""
    candidates = [prompt_ids(vocab, length, salt + 16 * k) for k in range(N_CANDIDATES)]
    logits = model(input_ids=torch.tensor(candidates, dtype=torch.long),
                   logits_to_keep=1).logits[:, -1].float()
    top2 = torch.topk(logits, 2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]) / logits.abs().max(dim=-1).values
    best = int(torch.argmax(margin))
    return candidates[best], float(margin[best])


@torch.no_grad()
def greedy(model, ids):
    device = next(model.parameters()).device
    cache = transformers.DynamicCache()
    inp = torch.tensor([ids], dtype=torch.long, device=device)
    out_ids, top, scale = [], None, None
    for step in range(N_GENERATED):
        pos = torch.arange(len(ids) + step - inp.shape[1], len(ids) + step,
                           device=device).unsqueeze(0)
        logits = model(input_ids=inp, past_key_values=cache, use_cache=True,
                       position_ids=pos).logits[0, -1].float()
        if step == 0:
            values, indices = torch.topk(logits, N_TOP)
            top = [[int(i), float(v)] for i, v in zip(indices, values)]
            scale = float(logits.abs().max())
        nxt = int(torch.argmax(logits))
        out_ids.append(nxt)
        inp = torch.tensor([[nxt]], dtype=torch.long, device=device)
    return out_ids, top, scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--litellama", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--dtype", default="float32", choices=sorted(TORCH_DTYPES))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    half = args.dtype != "float32"
    for preset in args.presets.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = os.path.join(tmp, preset)
            subprocess.run([args.litellama, "make-model", "--preset", preset, "--out", model_dir,
                            "--seed", str(SEED), "--dtype", "float32", "--no-tokenizer"],
                           check=True)
            model = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=TORCH_DTYPES[args.dtype], attn_implementation="eager")
            if half:
                model = model.to("cuda")
            model.eval()
            vocab = model.config.vocab_size
            cases = []
            if half:
                with open(os.path.join(args.out, preset + ".json")) as f:
                    prompts = [c["prompt_ids"] for c in json.load(f)["cases"]]
            else:
                prompts = []
                for salt, length in enumerate(PROMPT_LENGTHS):
                    ids, margin = pick_prompt(model, vocab, length, salt)
                    prompts.append(ids)
            for ids in prompts:
                greedy_ids, top, scale = greedy(model, ids)
                cases.append({"prompt_ids": ids, "greedy_ids": greedy_ids, "top_logits": top,
                              "logit_scale": scale,
                              "top_margin": (top[0][1] - top[1][1]) / scale})
            record = {
                "preset": preset,
                "seed": SEED,
                "architecture": model.config.architectures[0],
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
                "dtype": args.dtype,
                "device": "cuda" if half else "cpu",
                "cases": cases,
            }
            name = preset + (("." + args.dtype) if half else "") + ".json"
            with open(os.path.join(args.out, name), "w") as f:
                json.dump(record, f, indent=1)
            print(f"{preset} {args.dtype}: " + "; ".join(
                f"len {len(c['prompt_ids'])} margin {c['top_margin']:.3f} -> "
                f"{c['greedy_ids'][:4]}..." for c in cases), flush=True)


if __name__ == "__main__":
    sys.exit(main())
