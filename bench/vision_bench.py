#!/usr/bin/env python3
"""LLaVA-1.5 on the GPU against transformers on the same checkpoint, in one run.

  encode   one image through the vision tower and projector: the vision service's device time
           per encode (litellama_vision_encode_device_seconds) and its wall time with decoding
           and preprocessing (litellama_vision_encode_seconds), against transformers'
           get_image_features on the processor's pixel values (CUDA-synchronized)
  handoff  from the vision service completing an image's rows to the worker launching the
           prefill that reads them, on an idle server (litellama_worker_image_handoff_seconds)
  ttft     a prompt of one image and 32 text tokens against the same prompt with 576 text tokens
           in the image's place: time to first token through `litellama serve` (the scheduler's
           histogram; a fresh image per request, prefix cache off, so every request encodes) and
           through transformers (processor, then one forward of the whole prompt to the first
           token)
  reuse    a new image sent twice is encoded once (litellama_vision_encodes_total)

Every figure is the mean (ours, from metric deltas) or the median (transformers) over --n
requests after two warm-up requests of each kind. The checkpoint is `litellama make-model
--preset llava1.5-7b` (random weights, bf16) unless --model names one.

Usage: bench/vision_bench.py --bin build/bin --out DIR [--n 20] [--model DIR]
Writes DIR/vision_bench.json and prints one table.
"""
import argparse
import io
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_bench import Server  # noqa: E402

IMAGE_TOKEN = 32000
N_IMAGE_TOKENS = 576


def make_images(count, seed):
    """Distinct 640x480 JPEGs of smooth random colour fields (resized and cropped to 336)."""
    from PIL import Image
    import numpy as np
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        small = rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
        img = Image.fromarray(small).resize((640, 480), Image.BICUBIC)
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        images.append(buf.getvalue())
    return images


def metric(port, series):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(series + " ") or line.startswith(series + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def find_port(base, series, span=8):
    for port in range(base, base + span):
        try:
            if metric(port, series) is not None:
                return port
        except Exception:
            pass
    raise RuntimeError(f"no metrics port near {base} exports {series}")


def text_ids(rng, n):
    return [rng.randrange(1000, 31000) for _ in range(n)]


def transformers_side(model_dir, images, n, rng):
    import torch
    from transformers import CLIPImageProcessor, LlavaForConditionalGeneration
    from PIL import Image

    processor = CLIPImageProcessor.from_pretrained(model_dir)
    model = LlavaForConditionalGeneration.from_pretrained(
        model_dir, torch_dtype=torch.bfloat16).cuda().eval()

    def pixels(data):
        img = Image.open(io.BytesIO(data)).convert("RGB")
        return processor(images=img, return_tensors="pt")["pixel_values"].to(
            "cuda", torch.bfloat16)

    def image_features(pix):
        fn = getattr(model, "get_image_features", None) or model.model.get_image_features
        return fn(pixel_values=pix, vision_feature_layer=-2,
                  vision_feature_select_strategy="default")

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    out = {}
    with torch.no_grad():
        pix = pixels(images[0])
        for _ in range(3):
            image_features(pix)
        out["encode_ms"] = 1e3 * statistics.median(
            timed(lambda: image_features(pix)) for _ in range(n))

        def first_token(ids, data=None):
            input_ids = torch.tensor([ids], device="cuda")
            kwargs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
            if data is not None:
                kwargs["pixel_values"] = pixels(data)
            return model(**kwargs).logits[0, -1].argmax().item()

        after = text_ids(rng, 32)
        image_prompt = [1] + [IMAGE_TOKEN] * N_IMAGE_TOKENS + after
        text_prompt = [1] + text_ids(rng, N_IMAGE_TOKENS) + after
        for i in range(2):
            first_token(image_prompt, images[i])
            first_token(text_prompt)
        out["ttft_image_ms"] = 1e3 * statistics.median(
            timed(lambda i=i: first_token(image_prompt, images[2 + i])) for i in range(n))
        out["ttft_text_ms"] = 1e3 * statistics.median(
            timed(lambda: first_token(text_prompt)) for _ in range(n))
    del model
    torch.cuda.empty_cache()
    return out


def generate(bin_dir, server, ids, image_path=None):
    cmd = [f"{bin_dir}/litellama", "generate", "--server", server, "--input-ids",
           ",".join(map(str, ids)), "--max-new-tokens", "1", "--ignore-eos", "--json"]
    if image_path:
        cmd += ["--image", image_path]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"generate failed: {out.stdout[-400:]} {out.stderr[-400:]}")


def our_side(a, model_dir, images, n, rng):
    image_dir = os.path.join(a.out, "images")
    os.makedirs(image_dir, exist_ok=True)
    paths = []
    for i, data in enumerate(images):
        paths.append(os.path.join(image_dir, f"{i}.jpg"))
        with open(paths[-1], "wb") as f:
            f.write(data)
    s = Server(a.bin, model_dir, "llava", a.port, a.metrics_port,
               ["--no-prefix-cache", "--gpu-memory-utilization", "0.45"],
               os.path.join(a.out, "logs"))
    try:
        sched = a.metrics_port
        worker = a.metrics_port + 1
        vision = find_port(a.metrics_port + 2, "litellama_vision_encodes_total")

        def totals():
            def pair(port, name):
                return (metric(port, name + "_sum") or 0.0, metric(port, name + "_count") or 0.0)
            return {
                "ttft": pair(sched, "litellama_scheduler_time_to_first_token_seconds"),
                "device": pair(vision, "litellama_vision_encode_device_seconds"),
                "wall": pair(vision, "litellama_vision_encode_seconds"),
                "handoff": pair(worker, "litellama_worker_image_handoff_seconds"),
                "encodes": metric(vision, "litellama_vision_encodes_total") or 0.0,
            }

        def mean_ms(before, after, key):
            d_sum = after[key][0] - before[key][0]
            d_count = after[key][1] - before[key][1]
            return 1e3 * d_sum / d_count if d_count else float("nan")

        after_ids = text_ids(rng, 32)
        for i in range(2):  # warm-up: the first encode and prefill of each shape
            generate(a.bin, s.zmq, [1, IMAGE_TOKEN] + after_ids, paths[i])
            generate(a.bin, s.zmq, [1] + text_ids(rng, N_IMAGE_TOKENS) + after_ids)
        t0 = totals()
        for i in range(n):
            generate(a.bin, s.zmq, [1, IMAGE_TOKEN] + after_ids, paths[2 + i])
        t1 = totals()
        for _ in range(n):
            generate(a.bin, s.zmq, [1] + text_ids(rng, N_IMAGE_TOKENS) + after_ids)
        t2 = totals()
        # An image not seen yet, sent twice: encoded once.
        generate(a.bin, s.zmq, [1, IMAGE_TOKEN] + after_ids, paths[-1])
        generate(a.bin, s.zmq, [1, IMAGE_TOKEN] + after_ids, paths[-1])
        t3 = totals()
        return {
            "encode_device_ms": mean_ms(t0, t1, "device"),
            "encode_wall_ms": mean_ms(t0, t1, "wall"),
            "handoff_us": 1e3 * mean_ms(t0, t1, "handoff"),
            "ttft_image_ms": mean_ms(t0, t1, "ttft"),
            "ttft_text_ms": mean_ms(t1, t2, "ttft"),
            "encodes_per_image": (t1["encodes"] - t0["encodes"]) / n,
            "repeat_encodes": t3["encodes"] - t2["encodes"],
        }
    finally:
        s.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default="build/bin")
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="")
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--port", type=int, default=18300)
    p.add_argument("--metrics-port", type=int, default=18310)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    # The generated checkpoint (about 14 GB) lives outside --out, which keeps only results.
    model_dir = a.model or "/tmp/litellama-vision-bench/llava1.5-7b"
    if not a.model and not os.path.exists(os.path.join(model_dir, "config.json")):
        subprocess.run([f"{a.bin}/litellama", "make-model", "--preset", "llava1.5-7b",
                        "--dtype", "bfloat16", "--out", model_dir], check=True)
    images = make_images(a.n + 3, seed=11)  # warm-up, timed, and one sent twice
    ours = our_side(a, model_dir, images, a.n, random.Random(5))
    theirs = transformers_side(model_dir, images, a.n, random.Random(5))
    result = {"ours": ours, "transformers": theirs, "n": a.n}
    with open(os.path.join(a.out, "vision_bench.json"), "w") as f:
        json.dump(result, f, indent=2)
    o, t = ours, theirs
    print("| figure | ours | transformers | ratio |")
    print("| --- | --- | --- | --- |")
    print(f"| encode, device (ms) | {o['encode_device_ms']:.3f} | {t['encode_ms']:.3f} | "
          f"{t['encode_ms'] / o['encode_device_ms']:.2f}x |")
    print(f"| encode, with decode and preprocess (ms) | {o['encode_wall_ms']:.3f} | | |")
    print(f"| hand-off to prefill (us) | {o['handoff_us']:.1f} | | |")
    print(f"| TTFT, image + 32 tokens (ms) | {o['ttft_image_ms']:.2f} | {t['ttft_image_ms']:.2f} | "
          f"{t['ttft_image_ms'] / o['ttft_image_ms']:.2f}x |")
    print(f"| TTFT, 576 + 32 text tokens (ms) | {o['ttft_text_ms']:.2f} | {t['ttft_text_ms']:.2f} | "
          f"{t['ttft_text_ms'] / o['ttft_text_ms']:.2f}x |")
    print(f"| TTFT image / text | {o['ttft_image_ms'] / o['ttft_text_ms']:.3f} | "
          f"{t['ttft_image_ms'] / t['ttft_text_ms']:.3f} | |")
    print(f"| encodes per fresh image; of a new image sent twice | "
          f"{o['encodes_per_image']:.2f}; {o['repeat_encodes']:.0f} | | |")


if __name__ == "__main__":
    main()
