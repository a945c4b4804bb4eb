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

LLaVA presets (--presets llava-tiny; float32 on the CPU, not among the defaults): transformers'
LlavaForConditionalGeneration and the slow CLIPImageProcessor (use_fast=False) on the
checkpoint's preprocessor_config.json, for each of LLAVA_IMAGES (tests/golden/images): the pixel
values, the selected vision hidden state (vision_feature_layer, class token dropped for the
"default" strategy), the projector output, the first position's top logits and the greedy ids of
a prompt holding the image's tokens. tests/vision/llava_test.cpp checks every llava*.json.

Usage: make_golden.py --litellama build/bin/litellama --out tests/golden/models [--presets a,b]
                      [--dtype float32|bfloat16|float16]
       make_golden.py --litellama build/bin/litellama --out tests/golden/models --presets llava-tiny
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


LLAVA_IMAGES = ["rgb_61x45.jpg", "rgba_19x41.png"]
IMAGES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "images")


@torch.no_grad()
def llava_record(model_dir, preset):
    from PIL import Image
    from transformers import AutoImageProcessor, LlavaForConditionalGeneration
    model = LlavaForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    proc = AutoImageProcessor.from_pretrained(model_dir, use_fast=False)
    cfg = model.config
    # transformers >= 4.52 nests the parts under model.model; older versions hold them directly.
    inner = model.model if hasattr(model, "model") and hasattr(model.model, "vision_tower") \
        else model
    vision_tower, projector = inner.vision_tower, inner.multi_modal_projector
    image_token = cfg.image_token_index if hasattr(cfg, "image_token_index") else cfg.image_token_id
    n_image = cfg.image_seq_length
    prompt = [1, 319, 1967, 29901] + [image_token] * n_image + [13, 5618, 338, 445]
    cases = []
    for name in LLAVA_IMAGES:
        pv = proc(images=Image.open(os.path.join(IMAGES_DIR, name)),
                  return_tensors="pt")["pixel_values"]
        states = vision_tower(pv, output_hidden_states=True).hidden_states
        features = states[cfg.vision_feature_layer]
        if cfg.vision_feature_select_strategy == "default":
            features = features[:, 1:]
        embeds = projector(features)
        cache = transformers.DynamicCache()
        inp = torch.tensor([prompt], dtype=torch.long)
        logits = model(input_ids=inp, pixel_values=pv, past_key_values=cache,
                       use_cache=True).logits[0, -1].float()
        values, indices = torch.topk(logits, N_TOP)
        top = [[int(i), float(v)] for i, v in zip(indices, values)]
        ids = []
        for step in range(N_GENERATED):
            nxt = int(torch.argmax(logits))
            ids.append(nxt)
            if step + 1 == N_GENERATED:
                break
            pos = torch.tensor([[len(prompt) + step]])
            logits = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True,
                           position_ids=pos).logits[0, -1].float()
        cases.append({
            "image": name,
            "pixel_values": [float(v) for v in pv[0].reshape(-1)],
            "vision_features": [float(v) for v in features[0].reshape(-1)],
            "image_embeddings": [float(v) for v in embeds[0].reshape(-1)],
            "prompt_ids": prompt, "greedy_ids": ids, "top_logits": top,
            "logit_scale": float(logits.abs().max()),
        })
        print(f"{preset} {name}: features {tuple(features.shape)} -> {ids[:4]}...", flush=True)
    return {"preset": preset, "seed": SEED, "architecture": cfg.architectures[0],
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "dtype": "float32", "device": "cpu", "cases": cases}


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
        if preset.startswith("llava"):
            if half:
                sys.exit(f"{preset}: LLaVA references are float32 only")
            with tempfile.TemporaryDirectory() as tmp:
                model_dir = os.path.join(tmp, preset)
                subprocess.run([args.litellama, "make-model", "--preset", preset, "--out",
                                model_dir, "--seed", str(SEED), "--dtype", "float32",
                                "--no-tokenizer"], check=True)
                record = llava_record(model_dir, preset)
            with open(os.path.join(args.out, preset + ".json"), "w") as f:
                json.dump(record, f, indent=1)
            continue
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
