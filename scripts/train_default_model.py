#!/usr/bin/env python3
"""Trains the embedded default model: a small Llama on English text from Debian packages.

Input: the corpus written by scripts/make_default_corpus.py (corpus.txt, or corpus.txt.xz) and
the Llama 2 tokenizer files (tokenizer.json, tokenizer_config.json) that scripts/fetch-assets.sh
puts in assets/tokenizers/llama2. Output, in Hugging Face layout (--out):
  config.json, model-00001-of-00002.safetensors, model-00002-of-00002.safetensors (bfloat16),
  model.safetensors.index.json, tokenizer.json, tokenizer_config.json (with a chat template that
  makes the conversation a text to continue), generation_config.json,
  training.json (hyperparameters, corpus statistics, losses, held-out perplexity) and
  reference.json (greedy continuations of five fixed prompts in float32: the engine's test).

The model is written here in plain PyTorch with the tensor names, shapes and arithmetic of
transformers' LlamaForCausalLM (RMSNorm in float32, rotate-half RoPE, GQA, SiLU MLP, tied
embeddings), so training needs only torch; when transformers is installed, the reference ids come
from LlamaForCausalLM loading the written checkpoint, and the script fails if the two disagree.

Training is deterministic for a given step count (fixed seed, fixed batch order); by default the
step count is derived from --minutes after timing the first steps, and training.json records it,
so `--steps N` repeats a run. The held-out text is every 50th block of 16 Ki tokens of the
corpus: blocks 48 (mod 50) pick the best checkpoint, blocks 49 (mod 50) give the reported
perplexity, which no decision saw.

Usage (GPU):  train_default_model.py --corpus corpus.txt.xz --tokenizer assets/tokenizers/llama2
                  --out models/default --device cuda --minutes 6
CPU (small, for trying it):  train_default_model.py ... --device cpu --size cpu --steps 700
Smoke test:   train_default_model.py ... --device cpu --size cpu --steps 4 --smoke
"""
import argparse
import json
import lzma
import math
import re
import os
import shutil
import struct
import sys
import time

import torch
import torch.nn.functional as F

SEED = 1234
# The architecture. hidden 224 keeps the tied 32000 x 224 embedding (14.3 MB in bfloat16) under
# the 15 MB shard limit; head_dim 64 is what the GPU attention kernels take.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 224,
    "intermediate_size": 576,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "initializer_range": 0.02,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
# The size that trains in minutes on one CPU core's share: 2 layers of hidden 128. The embedding
# (32000 x 128) is most of its 4.5 M parameters.
CPU_CONFIG = dict(CONFIG, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1)
# Training hyperparameters (docs/default-model.md explains them).
HPARAMS = {
    "seq_len": 512,          # tokens per training sequence, the first one <s>
    "batch_size": 64,        # sequences per step: 32 Ki tokens
    "peak_lr": 3e-3,
    "min_lr_ratio": 0.1,     # cosine decay to 10% of the peak
    "warmup_steps": 300,
    "weight_decay": 0.1,     # on matrices only, not on norms
    "betas": [0.9, 0.95],
    "grad_clip": 1.0,
    "eval_every": 500,
    "eval_batches": 16,
    "test_windows": None,    # the reported perplexity: all test windows
    "calibration_steps": 50,
    # 0: the training loss is the full softmax over the vocabulary. K > 0: over the K most
    # frequent tokens of the training text, K/2 others drawn at random each step and the batch's
    # own targets, which costs about 1.5 K/32000 of the output projection (the reported
    # perplexity is always over the full vocabulary).
    "sampled_softmax": 0,
}
CPU_HPARAMS = dict(HPARAMS, seq_len=128, batch_size=8, warmup_steps=50, eval_every=100,
                   eval_batches=4, test_windows=256, calibration_steps=10,
                   sampled_softmax=4096, peak_lr=5e-3)
BLOCK = 16384          # held-out split granularity (tokens)
HELD_OUT_PERIOD = 50
PROMPTS = [
    "The purpose of this document is to",
    "When you install a new program, you",
    "The kernel is the part of the operating system that",
    "In this chapter we describe how",
    "A file system is a way of",
]
N_REFERENCE_TOKENS = 24
N_TOP = 8
# The chat template: no role markers; the turns are paragraphs of one text, and the model writes
# the next paragraph.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if not loop.first %}{{ '\\n\\n' }}{% endif %}"
    "{{ message['content'] | trim }}{% endfor %}{% if add_generation_prompt %}{{ '\\n\\n' }}"
    "{% endif %}")


# ---------------------------------------------------------------------------------------------
# The model: LlamaForCausalLM's arithmetic in plain torch.

class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_tables(cfg, n_pos, device):
    hd = cfg["head_dim"]
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device)
                                       .float() / hd))
    freqs = torch.arange(n_pos, device=device).float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        self.input_layernorm = RMSNorm(h, cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(h, cfg["rms_norm_eps"])
        self.q_proj = torch.nn.Linear(h, self.nh * hd, bias=False)
        self.k_proj = torch.nn.Linear(h, self.nkv * hd, bias=False)
        self.v_proj = torch.nn.Linear(h, self.nkv * hd, bias=False)
        self.o_proj = torch.nn.Linear(self.nh * hd, h, bias=False)
        i = cfg["intermediate_size"]
        self.gate_proj = torch.nn.Linear(h, i, bias=False)
        self.up_proj = torch.nn.Linear(h, i, bias=False)
        self.down_proj = torch.nn.Linear(i, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.nkv, self.hd).transpose(1, 2)
        c, s = cos[:t].to(q.dtype), sin[:t].to(q.dtype)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0
            w = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            w = w.masked_fill(mask, float("-inf")).softmax(-1, dtype=torch.float32).to(q.dtype)
            a = w @ v
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, self.nh * self.hd))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class TinyLlama(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = torch.nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = torch.nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        std = cfg["initializer_range"]
        for name, p in self.named_parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, 0.0, std)
        # Residual-branch outputs start smaller, as in GPT-2, so deep sums stay near unit scale.
        for layer in self.layers:
            torch.nn.init.normal_(layer.o_proj.weight, 0.0, std / math.sqrt(2 * len(self.layers)))
            torch.nn.init.normal_(layer.down_proj.weight, 0.0,
                                  std / math.sqrt(2 * len(self.layers)))
        self.register_buffer("cos", None, persistent=False)
        self.register_buffer("sin", None, persistent=False)

    def forward(self, ids):
        return F.linear(self.hidden(ids), self.embed_tokens.weight)

    def hidden(self, ids):
        """The final-norm output, before the (tied) output projection."""
        t = ids.shape[1]
        if self.cos is None or self.cos.shape[0] < t or self.cos.device != ids.device:
            self.cos, self.sin = rope_tables(self.cfg, max(t, 512), ids.device)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.norm(x)

    def hf_state_dict(self):
        """The weights under LlamaForCausalLM's names (lm_head is tied, so not stored)."""
        out = {"model.embed_tokens.weight": self.embed_tokens.weight,
               "model.norm.weight": self.norm.weight}
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
            out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[p + f"self_attn.{n}.weight"] = getattr(layer, n).weight
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = getattr(layer, n).weight
        return {k: v.detach() for k, v in out.items()}

    def load_hf_state_dict(self, sd):
        mine = self.hf_state_dict()
        assert set(mine) == set(sd), sorted(set(mine) ^ set(sd))
        with torch.no_grad():
            for k, v in mine.items():
                v.copy_(sd[k].to(v.dtype))


# ---------------------------------------------------------------------------------------------
# safetensors, written and read here: the format is an 8-byte header length, a JSON header and
# the raw little-endian tensors (the `safetensors` package is not in Debian 12).

def write_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = tensors[name].to(torch.bfloat16).contiguous().cpu()
        data = t.view(torch.int16).numpy().tobytes()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16"
        s, e = info["data_offsets"]
        raw = torch.frombuffer(bytearray(data[s:e]), dtype=torch.int16)
        out[name] = raw.view(torch.bfloat16).reshape(info["shape"])
    return out


def save_checkpoint(model, tokenizer_dir, out):
    os.makedirs(out, exist_ok=True)
    sd = model.hf_state_dict()
    # Shard 1: the embedding (and final norm); shard 2: the layers. Each stays under 15 MB.
    first = {k: v for k, v in sd.items() if not k.startswith("model.layers.")}
    second = {k: v for k, v in sd.items() if k.startswith("model.layers.")}
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    weight_map, total = {}, 0
    for fname, part in zip(names, (first, second)):
        write_safetensors(os.path.join(out, fname), part)
        for k, v in part.items():
            weight_map[k] = fname
            total += v.numel() * 2
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total},
                   "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f, indent=2)
    shutil.copy(os.path.join(tokenizer_dir, "tokenizer.json"), os.path.join(out, "tokenizer.json"))
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json")) as f:
        tok_cfg = json.load(f)
    tok_cfg["chat_template"] = CHAT_TEMPLATE
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)


def load_checkpoint(out):
    sd = {}
    for fname in sorted(os.listdir(out)):
        if fname.endswith(".safetensors"):
            sd.update(read_safetensors(os.path.join(out, fname)))
    return sd


# ---------------------------------------------------------------------------------------------
# Tokenization.

class LlamaBpe:
    """Llama 2's tokenizer.json (SentencePiece BPE: "▁" for spaces and at the start, byte
    fallback) in plain Python, for machines without the `tokenizers` package. No vocabulary entry
    holds "▁" after another character or a newline, so the text splits exactly at those points
    into pieces encoded alone (and cached); within a piece the adjacent pair of lowest merge rank
    merges first, the leftmost on ties, as in `tokenizers`. Two differences from transformers'
    encoding remain: a text that starts with a run of spaces, and literal special-token strings
    ("<s>"), which transformers turns into the special ids. Neither matters for training."""

    def __init__(self, spec):
        model = spec["model"]
        self.vocab = model["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        self.ranks = {m: i for i, m in enumerate(merges)}
        self.cache = {}
        self.piece = re.compile("\n|\u2581+[^\u2581\n]*|[^\u2581\n]+")

    def encode_piece(self, piece):
        syms = list(piece)
        while len(syms) > 1:
            best, at = None, -1
            for i in range(len(syms) - 1):
                r = self.ranks.get((syms[i], syms[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            syms[at:at + 2] = [syms[at] + syms[at + 1]]
        ids = []
        for sym in syms:
            if sym in self.vocab:
                ids.append(self.vocab[sym])
            else:
                ids.extend(self.vocab[f"<0x{b:02X}>"] for b in sym.encode("utf-8"))
        return ids

    def encode(self, text):
        text = "\u2581" + text.replace(" ", "\u2581")
        ids = []
        for piece in self.piece.findall(text):
            got = self.cache.get(piece)
            if got is None:
                got = self.encode_piece(piece)
                if len(self.cache) < 2_000_000:
                    self.cache[piece] = got
            ids.extend(got)
        return ids


class Tok:
    """The Llama 2 tokenizer: `tokenizers` where installed, else LlamaBpe (the same ids)."""

    def __init__(self, tokenizer_dir):
        path = os.path.join(tokenizer_dir, "tokenizer.json")
        try:
            import tokenizers
            self.tk = tokenizers.Tokenizer.from_file(path)
            self.bpe = None
        except ImportError:
            self.tk = None
            with open(path) as f:
                spec = json.load(f)
            self.bpe = LlamaBpe(spec)
            self.id_to_token = {i: t for t, i in spec["model"]["vocab"].items()}

    def encode_batch(self, texts):
        if self.tk is not None:
            return [e.ids for e in self.tk.encode_batch(texts, add_special_tokens=False)]
        return [self.bpe.encode(t) for t in texts]

    def encode_prompt(self, text):
        return [1] + self.encode_batch([text])[0]

    def decode(self, ids):
        if self.tk is not None:
            return self.tk.decode(ids)
        out = bytearray()
        for i in ids:
            t = self.id_to_token[i]
            if t.startswith("<0x") and t.endswith(">") and len(t) == 6:
                out.append(int(t[3:5], 16))
            elif t not in ("<s>", "</s>", "<unk>"):
                out.extend(t.replace("\u2581", " ").encode("utf-8"))
        text = out.decode("utf-8", errors="replace")
        return text[1:] if text.startswith(" ") else text


def corpus_chunks(text, max_chars=2000):
    """Paragraphs with their line breaks undone (the manuals wrap lines at 80 columns, which would
    make "\n" the commonest token), each ending in a blank line as the chat template ends a turn;
    long ones are cut at spaces, since the tokenizer merges whole chunks at once."""
    for para in text.split("\n\n"):
        para = " ".join(ln.strip() for ln in para.split("\n") if ln.strip())
        while len(para) > max_chars:
            cut = para.rfind(" ", 0, max_chars)
            if cut <= 0:
                cut = max_chars
            yield para[:cut]
            para = para[cut:]
        if para:
            yield para + "\n\n"


def tokenize_corpus(tok, path, limit_chars):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read(limit_chars) if limit_chars else f.read()
    chunks = list(corpus_chunks(text))
    ids = []
    for i in range(0, len(chunks), 20000):
        for e in tok.encode_batch(chunks[i:i + 20000]):
            ids.extend(e)
    return torch.tensor(ids, dtype=torch.int32), len(text.encode("utf-8"))


def split(ids, block):
    n_blocks = (len(ids) + block - 1) // block
    parts = {"train": [], "valid": [], "test": []}
    for b in range(n_blocks):
        r = b % HELD_OUT_PERIOD
        key = "valid" if r == HELD_OUT_PERIOD - 2 else "test" if r == HELD_OUT_PERIOD - 1 else "train"
        parts[key].append(ids[b * block:(b + 1) * block])
    return {k: torch.cat(v) if v else ids[:0] for k, v in parts.items()}


def batch_at(data, starts, seq_len, device):
    """Sequences of <s> followed by seq_len-1 corpus tokens from each start, and their targets."""
    body = torch.stack([data[s:s + seq_len].long() for s in starts.tolist()])
    bos = torch.ones(len(starts), 1, dtype=torch.long)
    x = torch.cat([bos, body[:, :-1]], dim=1)
    return x.to(device, non_blocking=True), body.to(device, non_blocking=True)


@torch.no_grad()
def evaluate(model, data, hp, device, amp, n_windows=None):
    """Mean next-token loss over n_windows (all when None) non-overlapping windows of the
    held-out text, spread evenly over it, each window starting with <s> as in training."""
    model.eval()
    seq = hp["seq_len"]
    starts = torch.arange(0, len(data) - seq, seq)
    if n_windows is not None and len(starts) > n_windows:
        starts = starts[torch.linspace(0, len(starts) - 1, n_windows).long()]
    total, count = 0.0, 0
    for i in range(0, len(starts), hp["batch_size"]):
        x, y = batch_at(data, starts[i:i + hp["batch_size"]], seq, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
        total += float(loss)
        count += y.numel()
    model.train()
    return total / max(count, 1)


def lr_at(step, total, hp):
    if step < hp["warmup_steps"]:
        return hp["peak_lr"] * (step + 1) / hp["warmup_steps"]
    frac = (step - hp["warmup_steps"]) / max(1, total - hp["warmup_steps"])
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    return hp["peak_lr"] * (hp["min_lr_ratio"] + (1 - hp["min_lr_ratio"]) * cos)


# ---------------------------------------------------------------------------------------------
# Reference continuations.

@torch.no_grad()
def greedy(last_logits, ids, n):
    """n greedy ids after `ids` by repeated full forwards (last_logits(ids) gives the last
    position's logits), with the first position's top logits and the largest |logit| there."""
    ids = list(ids)
    out, top, scale = [], None, None
    for step in range(n):
        logits = last_logits(ids).float()
        if step == 0:
            v, i = torch.topk(logits, N_TOP)
            top = [[int(a), float(b)] for a, b in zip(i, v)]
            scale = float(logits.abs().max())
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        ids.append(nxt)
    return out, top, scale


def greedy_mine(model, ids, n):
    return greedy(lambda x: model(torch.tensor([x]))[0, -1], ids, n)


@torch.no_grad()
def greedy_transformers(out_dir, prompts_ids, n):
    """Greedy ids of LlamaForCausalLM loading the written checkpoint in float32 on the CPU (no TF32,
    eager attention), by repeated full forwards so no cache or stopping rule enters."""
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager").eval()
    results = [greedy(lambda x: model(input_ids=torch.tensor([x])).logits[0, -1], ids, n)
               for ids in prompts_ids]
    return transformers.__version__, results


def write_reference(out_dir, tok, log, smoke):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with open(os.path.join(out_dir, "config.json")) as f:
        model = TinyLlama(json.load(f)).float().eval()
    model.load_hf_state_dict({k: v.float() for k, v in load_checkpoint(out_dir).items()})
    prompts_ids = [tok.encode_prompt(p) for p in PROMPTS]
    mine = [greedy_mine(model, ids, N_REFERENCE_TOKENS) for ids in prompts_ids]
    source = "train_default_model.py (plain torch, float32)"
    try:
        version, theirs = greedy_transformers(out_dir, prompts_ids, N_REFERENCE_TOKENS)
        agree = [a[0] == b[0] for a, b in zip(mine, theirs)]
        log["transformers_agrees_with_training_model"] = agree
        if not all(agree) and not smoke:
            raise SystemExit(f"transformers and the training model disagree: {agree}")
        mine, source = theirs, f"transformers {version} LlamaForCausalLM, float32, CPU"
    except ImportError:
        log["transformers_agrees_with_training_model"] = "transformers is not installed"
    cases = [{"prompt": p, "prompt_ids": ids, "greedy_ids": g, "top_logits": top,
              "logit_scale": scale}
             for p, ids, (g, top, scale) in zip(PROMPTS, prompts_ids, mine)]
    texts = [tok.decode(c["greedy_ids"]) for c in cases]
    for c, t in zip(cases, texts):
        c["text"] = t
    return {"source": source, "n_generated": N_REFERENCE_TOKENS, "cases": cases}, texts


# ---------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", help="corpus.txt or corpus.txt.xz")
    ap.add_argument("--tokenizer", required=True, help="directory of the Llama 2 tokenizer files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=0, help="0: as many as fit in --minutes")
    ap.add_argument("--minutes", type=float, default=6.0, help="training time budget")
    ap.add_argument("--size", choices=["gpu", "cpu"], default="gpu",
                    help="gpu: 6 layers of hidden 224 (minutes on a GPU); cpu: 2 layers of "
                    "hidden 128 (what one CPU trains in half an hour)")
    ap.add_argument("--ids-cache", help="file keeping the tokenized corpus between runs")
    ap.add_argument("--eval-only", action="store_true",
                    help="only measure the held-out perplexity of the checkpoint in --out")
    ap.add_argument("--reference-only", action="store_true",
                    help="only rewrite reference.json for the checkpoint already in --out")
    ap.add_argument("--smoke", action="store_true",
                    help="small corpus slice and model check only: not a usable model")
    args = ap.parse_args()
    t_start = time.time()
    torch.manual_seed(SEED)
    device = torch.device(args.device)
    amp = device.type == "cuda"
    global CONFIG
    if args.size == "cpu":
        CONFIG = CPU_CONFIG
    hp = dict(CPU_HPARAMS if args.size == "cpu" else HPARAMS)
    if args.smoke:
        hp.update(seq_len=64, batch_size=4, warmup_steps=2, eval_every=2, eval_batches=1,
                  test_windows=8, calibration_steps=2)

    tok = Tok(args.tokenizer)
    if args.eval_only:
        # The held-out perplexity of the checkpoint in --out, written into its training.json.
        with open(os.path.join(args.out, "training.json")) as f:
            log = json.load(f)
        hp = log["hyperparameters"]
        with open(os.path.join(args.out, "config.json")) as f:
            model = TinyLlama(json.load(f)).to(device)
        model.load_hf_state_dict(load_checkpoint(args.out))
        if args.ids_cache and os.path.exists(args.ids_cache):
            ids, _ = torch.load(args.ids_cache)
        else:
            ids, _ = tokenize_corpus(tok, args.corpus, 0)
        test = split(ids, BLOCK)["test"]
        loss = evaluate(model, test, hp, device, amp, hp["test_windows"])
        n = min(len(test) // hp["seq_len"], hp["test_windows"] or 10 ** 9)
        for stale in ("test_loss", "test_perplexity"):  # measured on other windows
            log.pop(stale, None)
        log["test_perplexity_bf16_weights"] = math.exp(loss)
        log["test_tokens"] = n * hp["seq_len"]
        with open(os.path.join(args.out, "training.json"), "w") as f:
            json.dump(log, f, indent=1)
        print(f"test perplexity {math.exp(loss):.2f} over {n} windows of {hp['seq_len']}")
        return 0
    if args.reference_only:
        reference, _ = write_reference(args.out, tok, {}, args.smoke)
        with open(os.path.join(args.out, "reference.json"), "w") as f:
            json.dump(reference, f, indent=1)
        print(reference["source"])
        return 0
    if args.ids_cache and os.path.exists(args.ids_cache):
        ids, n_bytes = torch.load(args.ids_cache)
    else:
        ids, n_bytes = tokenize_corpus(tok, args.corpus, 3_000_000 if args.smoke else 0)
        if args.ids_cache:
            torch.save((ids, n_bytes), args.ids_cache)
    parts = split(ids, 512 if args.smoke else BLOCK)
    print(f"corpus: {n_bytes / 1e6:.1f} MB, {len(ids)} tokens (train {len(parts['train'])}, "
          f"valid {len(parts['valid'])}, test {len(parts['test'])}); tokenized in "
          f"{time.time() - t_start:.0f} s", flush=True)
    train = parts["train"]

    model = TinyLlama(CONFIG).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt_kwargs = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=hp["peak_lr"], betas=tuple(hp["betas"]), **opt_kwargs)
    gen = torch.Generator().manual_seed(SEED)
    seq, bs = hp["seq_len"], hp["batch_size"]

    frequent = None
    if hp["sampled_softmax"]:
        counts = torch.bincount(train.long(), minlength=CONFIG["vocab_size"])
        frequent = counts.topk(hp["sampled_softmax"]).indices.sort().values.to(device)
        is_rare = torch.ones(CONFIG["vocab_size"], device=device)
        is_rare[frequent] = 0
        rare = torch.nonzero(is_rare.cpu()).flatten()
        n_sampled = hp["sampled_softmax"] // 2
        rare_correction = math.log(len(rare) / n_sampled)
        print(f"training softmax over the {hp['sampled_softmax']} most frequent tokens "
              f"({float(counts[frequent.cpu()].sum()) / len(train):.1%} of the training text), "
              f"{n_sampled} others at random and each batch's targets", flush=True)
    total_steps = args.steps or 10 ** 9
    t_train, calibrated = time.time(), bool(args.steps)
    history, best = [], (float("inf"), -1, None)
    step = 0
    while step < total_steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps, hp)
        starts = torch.randint(0, len(train) - seq, (bs,), generator=gen)
        x, y = batch_at(train, starts, seq, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            if frequent is None:
                logits = model(x)
                target = y.flatten()
            else:
                sampled = rare[torch.randint(0, len(rare), (n_sampled,), generator=gen)]
                cand = torch.unique(torch.cat([frequent, sampled.to(device), y.flatten()]))
                logits = F.linear(model.hidden(x), model.embed_tokens.weight[cand])
                # Each rare candidate stands for len(rare) / n_sampled tokens of the rest of the
                # vocabulary (the usual log-count correction of sampled softmax): without it the
                # tokens never sampled keep logits the trained ones were pushed below.
                logits = logits + rare_correction * is_rare[cand]
                target = torch.searchsorted(cand, y.flatten())
        loss = F.cross_entropy(logits.float().flatten(0, 1), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), hp["grad_clip"])
        opt.step()
        step += 1
        if not calibrated and step == hp["calibration_steps"]:
            if device.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - t_train) / step
            # Evaluations cost about eval_batches steps each.
            per_step_all = per_step * (1 + hp["eval_batches"] / 3 / hp["eval_every"])
            total_steps = max(100, int(args.minutes * 60 / per_step_all))
            calibrated = True
            print(f"{per_step * 1000:.1f} ms a step: {total_steps} steps", flush=True)
        if step % hp["eval_every"] == 0 or step == total_steps:
            v = evaluate(model, parts["valid"], hp, device, amp, hp["eval_batches"] * bs)
            history.append({"step": step, "train_loss": float(loss), "valid_loss": v,
                            "lr": opt.param_groups[0]["lr"],
                            "seconds": round(time.time() - t_train, 1)})
            print(json.dumps(history[-1]), flush=True)
            if v < best[0]:
                best = (v, step, {k: t.detach().clone() for k, t in model.state_dict().items()})
    train_seconds = time.time() - t_train
    model.load_state_dict(best[2])
    test_loss = evaluate(model, parts["test"], hp, device, amp, hp["test_windows"])
    print(f"best step {best[1]}: test perplexity {math.exp(test_loss):.2f}", flush=True)

    save_checkpoint(model.cpu(), args.tokenizer, args.out)
    # The perplexity of the stored (bfloat16) weights, on the same test windows.
    stored = TinyLlama(CONFIG).to(device)
    stored.load_hf_state_dict(load_checkpoint(args.out))
    test_loss_bf16 = evaluate(stored, parts["test"], hp, device, amp, hp["test_windows"])
    del stored

    log = {"seed": SEED, "config": CONFIG, "hyperparameters": hp, "steps": total_steps,
           "best_step": best[1], "tokens_seen": total_steps * bs * seq,
           "train_seconds": round(train_seconds, 1), "parameters": n_params,
           "corpus_bytes": n_bytes, "corpus_tokens": len(ids),
           "split_tokens": {k: len(v) for k, v in parts.items()},
           "best_valid_loss": best[0], "test_loss": test_loss,
           "test_tokens": min(len(parts["test"]) // hp["seq_len"], hp["test_windows"] or 10 ** 9)
           * hp["seq_len"],
           "test_perplexity": math.exp(test_loss),
           "test_perplexity_bf16_weights": math.exp(test_loss_bf16),
           "history": history, "device": torch.cuda.get_device_name() if amp else "cpu",
           "torch": torch.__version__, "smoke": args.smoke}
    reference, texts = write_reference(args.out, tok, log, args.smoke)
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(reference, f, indent=1)
    log["total_seconds"] = round(time.time() - t_start, 1)
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump(log, f, indent=1)
    for p, t in zip(PROMPTS, texts):
        print(f"{p!r} -> {t!r}")
    print(f"done in {log['total_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
