#!/usr/bin/env python3
"""Reference outputs of transformers for quantized checkpoints written by `litellama quantize`.

For each method (awq, gptq-rtn, fp8, w8a8) this writes the llama3-tiny test model (float32, seed
7) with `litellama make-model`, quantizes it with `litellama quantize --group-size 32` (awq and
w8a8 calibrated over calibration.txt beside this script's output), and dequantizes the result with
numpy alone (make_quant_golden.dequantize_stored, written from the layouts' descriptions, not
from the engine). It then runs transformers' LlamaForCausalLM in float32 on the CPU (eager
attention) over the dense copy: greedy ids and the first position's top logits for three prompts.
The engine must give the same greedy ids from the quantized checkpoint itself.

Output: <out>/<method>-llama3-tiny.json. Needs torch and transformers (the GPU machine's).
Usage: make_quant_model_golden.py --litellama build/bin/litellama --out tests/golden/quant
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden  # noqa: E402  (greedy decoding and the prompts of the other goldens)
import make_quant_golden as layouts  # noqa: E402

PRESET, SEED, GROUP = "llama3-tiny", 7, 32
METHODS = ["awq", "gptq-rtn", "fp8", "w8a8"]
PROJECTIONS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def read_safetensors(path):
    """name -> numpy array; BF16 as float32, F8_E4M3 as its uint8 codes."""
    kinds = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I8": np.int8,
             "F8_E4M3": np.uint8, "BF16": np.uint16, "I64": np.int64, "U8": np.uint8}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        begin, end = h["data_offsets"]
        a = np.frombuffer(data[begin:end], dtype=kinds[h["dtype"]]).reshape(h["shape"])
        out[name] = layouts.bf16_value(a) if h["dtype"] == "BF16" else a.copy()
    return out


def read_checkpoint(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) \
        else ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(d, f)))
    return tensors


def dequantized_copy(qdir, ddir):
    config = json.load(open(os.path.join(qdir, "config.json")))
    qc = config.pop("quantization_config")
    tensors = read_checkpoint(qdir)
    h, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or h // config["num_attention_heads"]
    q_dim = config["num_attention_heads"] * head_dim
    kv_dim = config["num_key_value_heads"] * head_dim
    shapes = {"self_attn.q_proj": (q_dim, h), "self_attn.k_proj": (kv_dim, h),
              "self_attn.v_proj": (kv_dim, h), "self_attn.o_proj": (h, q_dim),
              "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h), "mlp.down_proj": (h, inter)}
    dense = {}
    for layer in range(config["num_hidden_layers"]):
        for proj in PROJECTIONS:
            module = f"model.layers.{layer}.{proj}"
            n_out, n_in = shapes[proj]
            w = layouts.dequantize_stored(qc, lambda t: tensors.pop(f"{module}.{t}", None),
                                          n_out, n_in)
            dense[f"{module}.weight"] = np.ascontiguousarray(w, dtype=np.float32)
            tensors.pop(f"{module}.input_scale", None)
    for name, value in tensors.items():
        dense[name] = np.ascontiguousarray(value, dtype=np.float32)
    os.makedirs(ddir, exist_ok=True)
    layouts.write_safetensors(os.path.join(ddir, "model.safetensors"), dense)
    config["torch_dtype"] = "float32"
    json.dump(config, open(os.path.join(ddir, "config.json"), "w"))


@torch.no_grad()
def record(method, args, work):
    dense_dir, qdir, ddir = (os.path.join(work, x) for x in ("dense", method, method + "-dense"))
    if not os.path.exists(dense_dir):
        subprocess.run([args.litellama, "make-model", "--preset", PRESET, "--seed", str(SEED),
                        "--dtype", "float32", "--out", dense_dir], check=True)
    cmd = [args.litellama, "quantize", "--method", method, "--group-size", str(GROUP)]
    calibration = os.path.join(args.out, "calibration.txt")
    if method in ("awq", "w8a8"):
        cmd += ["--calibration", calibration, "--calibration-tokens", "512",
                "--calibration-sequence-length", "128"]
    subprocess.run(cmd + [dense_dir, qdir], check=True)
    dequantized_copy(qdir, ddir)
    model = AutoModelForCausalLM.from_pretrained(ddir, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    vocab = model.config.vocab_size
    cases = []
    for length in make_golden.PROMPT_LENGTHS:
        ids = make_golden.prompt_ids(vocab, length, 3)
        greedy_ids, top, scale = make_golden.greedy(model, ids)
        cases.append({"prompt_ids": ids, "greedy_ids": greedy_ids, "top_logits": top,
                      "logit_scale": scale})
    return {"method": method, "preset": PRESET, "seed": SEED, "group_size": GROUP,
            "calibration": "calibration.txt (512 tokens, sequences of 128)"
            if method in ("awq", "w8a8") else None,
            "transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "numpy_version": np.__version__, "cases": cases}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--litellama", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--methods", default=",".join(METHODS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for method in args.methods.split(","):
            result = record(method, args, work)
            path = os.path.join(args.out, f"{method}-{PRESET}.json")
            with open(path, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
            print(f"{path}: {len(result['cases'])} cases")


if __name__ == "__main__":
    main()
