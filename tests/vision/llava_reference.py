#!/usr/bin/env python3
"""An independent numpy (float64) reference of LLaVA's vision path, for llava_test.cpp.

It reads a LLaVA checkpoint directory (config.json and float32 safetensors, single or sharded,
either published tensor layout) and raw float32 pixel values [3, S, S], and writes the selected
vision hidden state [n_tokens, vision_hidden] and the projector output [n_tokens, text_hidden]
as raw float32, following transformers' CLIPVisionTransformer and LlavaMultiModalProjector:
patch convolution (written here as an explicit loop over kernel offsets, not a matmul), class and
position embeddings, pre_layrnorm, encoder layers (layer_norm1, attention with bias, residual,
layer_norm2, fc1, quick_gelu, fc2, residual), hidden state vision_feature_layer, the class token
dropped for the "default" strategy, linear_1, exact GELU, linear_2.

Usage: llava_reference.py MODEL_DIR PIXELS.f32 FEATURES_OUT.f32 EMBEDDINGS_OUT.f32
"""
import json
import math
import os
import struct
import sys

import numpy as np


def load_tensors(model_dir):
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values()))
             if os.path.exists(index) else ["model.safetensors"])
    tensors = {}
    for name in files:
        data = open(os.path.join(model_dir, name), "rb").read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            assert meta["dtype"] == "F32", f"{key}: the reference reads float32 checkpoints only"
            begin, end = meta["data_offsets"]
            tensors[key] = np.frombuffer(data[8 + n + begin:8 + n + end], dtype="<f4").reshape(
                meta["shape"]).astype(np.float64)
    return tensors


def layer_norm(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def main():
    model_dir, pixels_path, features_out, embeds_out = sys.argv[1:5]
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    vc = cfg["vision_config"]
    hidden, heads, n_layers = vc["hidden_size"], vc["num_attention_heads"], vc["num_hidden_layers"]
    size, patch, eps = vc["image_size"], vc["patch_size"], vc.get("layer_norm_eps", 1e-5)
    t = load_tensors(model_dir)
    vp = "vision_tower." if "vision_tower.vision_model.pre_layrnorm.weight" in t \
        else "model.vision_tower."
    pp = "multi_modal_projector." if "multi_modal_projector.linear_1.weight" in t \
        else "model.multi_modal_projector."
    V = lambda name: t[vp + "vision_model." + name]

    px = np.fromfile(pixels_path, dtype="<f4").astype(np.float64).reshape(3, size, size)
    side = size // patch
    kernel = V("embeddings.patch_embedding.weight")  # [hidden, 3, p, p]
    conv = np.zeros((hidden, side, side))
    for c in range(3):
        for ky in range(patch):
            for kx in range(patch):
                sub = px[c, ky:ky + side * patch:patch, kx:kx + side * patch:patch]  # [side, side]
                conv += kernel[:, c, ky, kx][:, None, None] * sub[None]
    x = np.concatenate([V("embeddings.class_embedding")[None],
                        conv.reshape(hidden, side * side).T], axis=0)
    x = x + V("embeddings.position_embedding.weight")
    x = layer_norm(x, V("pre_layrnorm.weight"), V("pre_layrnorm.bias"), eps)
    states = [x]
    hd = hidden // heads
    for layer in range(n_layers):
        L = lambda name: V(f"encoder.layers.{layer}.{name}")
        h = layer_norm(x, L("layer_norm1.weight"), L("layer_norm1.bias"), eps)
        proj = lambda name: h @ L(f"self_attn.{name}.weight").T + L(f"self_attn.{name}.bias")
        q, k, v = (proj(n).reshape(-1, heads, hd).transpose(1, 0, 2)
                   for n in ("q_proj", "k_proj", "v_proj"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        attn = (probs @ v).transpose(1, 0, 2).reshape(-1, hidden)
        x = x + attn @ L("self_attn.out_proj.weight").T + L("self_attn.out_proj.bias")
        h = layer_norm(x, L("layer_norm2.weight"), L("layer_norm2.bias"), eps)
        m = h @ L("mlp.fc1.weight").T + L("mlp.fc1.bias")
        m = m / (1.0 + np.exp(-1.702 * m))
        x = x + m @ L("mlp.fc2.weight").T + L("mlp.fc2.bias")
        states.append(x)
    features = states[cfg.get("vision_feature_layer", -2)]
    if cfg.get("vision_feature_select_strategy", "default") == "default":
        features = features[1:]
    m = features @ t[pp + "linear_1.weight"].T + t.get(pp + "linear_1.bias", 0)
    erf = np.vectorize(math.erf)
    m = 0.5 * m * (1.0 + erf(m / math.sqrt(2.0)))
    embeds = m @ t[pp + "linear_2.weight"].T + t.get(pp + "linear_2.bias", 0)
    features.astype("<f4").tofile(features_out)
    embeds.astype("<f4").tofile(embeds_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
