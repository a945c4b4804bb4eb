#!/usr/bin/env python3
"""Reference outputs of Hugging Face transformers for the engine's test models.

For every test preset, the project's own generator (`litellama make-model`) writes a random
float32 checkpoint from a fixed seed; transformers loads it (float32, eager attention, on the CPU
so no TF32 or fused kernel enters) and runs greedy decoding for prompts of length 1, 7 and 67. The
first generated position's top logits and 24 greedy tokens per prompt are written to
<out>/<preset>.json. The tests regenerate the same checkpoints from the seed and compare.

Usage: make_golden.py --litellama build/bin/litellama --out tests/golden/models [--presets a,b]
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
]
PROMPT_LENGTHS = [1, 7, 67]
N_GENERATED = 24
N_TOP = 8
SEED = 1234


def prompt_ids(vocab_size, length, salt):
    rng = np.random.default_rng(SEED * 1000 + length * 10 + salt)
    return [int(x) for x in rng.integers(0, vocab_size, size=length)]


@torch.no_grad()
def greedy(model, ids):
    cache = transformers.DynamicCache()
    inp = torch.tensor([ids], dtype=torch.long)
    out_ids, top, scale = [], None, None
    for step in range(N_GENERATED):
        pos = torch.arange(len(ids) + step - inp.shape[1], len(ids) + step).unsqueeze(0)
        logits = model(input_ids=inp, past_key_values=cache, use_cache=True,
                       position_ids=pos).logits[0, -1].float()
        if step == 0:
            values, indices = torch.topk(logits, N_TOP)
            top = [[int(i), float(v)] for i, v in zip(indices, values)]
            scale = float(logits.abs().max())
        nxt = int(torch.argmax(logits))
        out_ids.append(nxt)
        inp = torch.tensor([[nxt]], dtype=torch.long)
    return out_ids, top, scale


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--litellama", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--presets", default=",".join(PRESETS))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    for preset in args.presets.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = os.path.join(tmp, preset)
            subprocess.run([args.litellama, "make-model", "--preset", preset, "--out", model_dir,
                            "--seed", str(SEED), "--dtype", "float32", "--no-tokenizer"],
                           check=True)
            model = AutoModelForCausalLM.from_pretrained(
                model_dir, torch_dtype=torch.float32, attn_implementation="eager")
            model.eval()
            vocab = model.config.vocab_size
            cases = []
            for salt, length in enumerate(PROMPT_LENGTHS):
                ids = prompt_ids(vocab, length, salt)
                greedy_ids, top, scale = greedy(model, ids)
                cases.append({"prompt_ids": ids, "greedy_ids": greedy_ids, "top_logits": top,
                              "logit_scale": scale})
            record = {
                "preset": preset,
                "seed": SEED,
                "architecture": model.config.architectures[0],
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
                "dtype": "float32",
                "cases": cases,
            }
            with open(os.path.join(args.out, preset + ".json"), "w") as f:
                json.dump(record, f, indent=1)
            print(f"{preset}: " + "; ".join(
                f"len {len(c['prompt_ids'])} -> {c['greedy_ids'][:6]}..." for c in cases),
                flush=True)


if __name__ == "__main__":
    sys.exit(main())
