#!/usr/bin/env python3
"""References for the vision preprocessing (services/vision/clip_preprocess.h).

--write-images writes the small test images into tests/golden/images/ (deterministic: numpy's
generator from a fixed seed, saved by Pillow; PNG and JPEG, odd sizes, greyscale, 16-bit
greyscale, greyscale+alpha, RGBA, palette, 1-bit, CMYK JPEG).

--backend pillow (the default; Debian's python3-pil + python3-numpy, runs anywhere) performs
CLIPImageProcessor's steps with Pillow and numpy as transformers' slow processor does them:
Image.open(...).convert("RGB"), resize of the shortest edge to size as transformers computes the
output size (int(short * long / short_side)) with Image.resize(resample), transformers'
center_crop (zero padding where the image is smaller), rescale in float64 then float32,
normalize in float32, channels first. It writes preprocess_pillow.json.

--backend transformers (a machine with transformers) runs the real processor,
AutoImageProcessor.from_pretrained(dir, use_fast=False) on each case's preprocessor_config.json,
and writes preprocess_transformers.json with the same cases. The pad-to-square cases apply the
original LLaVA's expand2square with Pillow first, as LLaVA does before its processor.

The C++ test (tests/vision/clip_preprocess_test.cpp) reads every preprocess_*.json present.

Usage: make_image_golden.py [--write-images] [--backend pillow|transformers] [--dir DIR]
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
from PIL import Image

SEED = 30
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
# Outputs with more values than this store every value_stride-th value (flat [3, h, w] order).
MAX_FULL_VALUES = 4000


def base_rgb(w, h, salt):
    """Smooth gradients, a sinusoid, noise and a hard-edged checkerboard block (overshoot)."""
    rng = np.random.default_rng(SEED * 100 + salt)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    img[..., 0] = 255 * x / max(w - 1, 1)
    img[..., 1] = 127.5 + 127.5 * np.sin(x * 0.7 + y * 0.45)
    img[..., 2] = 255 * y / max(h - 1, 1)
    img += rng.normal(0, 18, size=img.shape)
    cb = ((np.floor(x / 2) + np.floor(y / 2)) % 2) * 255
    block = (x < w / 3) & (y > h / 2)
    img[block] = cb[block][:, None]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def write_images(d):
    os.makedirs(d, exist_ok=True)
    Image.fromarray(base_rgb(37, 23, 1), "RGB").save(os.path.join(d, "rgb_37x23.png"))
    Image.fromarray(base_rgb(400, 300, 2), "RGB").save(os.path.join(d, "rgb_400x300.jpg"),
                                                       quality=70)
    Image.fromarray(base_rgb(61, 45, 3), "RGB").save(os.path.join(d, "rgb_61x45.jpg"),
                                                     quality=85)
    rgba = np.dstack([base_rgb(19, 41, 4), base_rgb(19, 41, 5)[..., 0]])
    Image.fromarray(rgba, "RGBA").save(os.path.join(d, "rgba_19x41.png"))
    gray = base_rgb(50, 31, 6)[..., 1]
    Image.fromarray(gray, "L").save(os.path.join(d, "gray_50x31.png"))
    Image.fromarray(base_rgb(29, 40, 7)[..., 0], "L").save(os.path.join(d, "gray_29x40.jpg"),
                                                          quality=92)
    # 16-bit greyscale: values past 255 (Pillow clips them when converting to RGB).
    g16 = (base_rgb(17, 13, 8)[..., 0].astype(np.int32) * 3).astype(np.uint16)
    Image.fromarray(g16, "I;16").save(os.path.join(d, "gray16_17x13.png"))
    la = Image.fromarray(np.dstack([base_rgb(23, 29, 9)[..., 2], base_rgb(23, 29, 10)[..., 0]]),
                         "LA")
    la.save(os.path.join(d, "la_23x29.png"))
    Image.fromarray(base_rgb(33, 21, 11), "RGB").quantize(colors=40).save(
        os.path.join(d, "palette_33x21.png"))
    Image.fromarray(base_rgb(13, 9, 12)[..., 0], "L").convert("1").save(
        os.path.join(d, "bilevel_13x9.png"))
    Image.fromarray(base_rgb(20, 16, 13), "RGB").convert("CMYK").save(
        os.path.join(d, "cmyk_20x16.jpg"), quality=90)


def clip_config(shortest, crop_h, crop_w, resample=3, **extra):
    c = {"do_resize": True, "size": {"shortest_edge": shortest}, "resample": resample,
         "do_center_crop": True, "crop_size": {"height": crop_h, "width": crop_w},
         "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
         "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "do_convert_rgb": True}
    c.update(extra)
    return c


SMALL_IMAGES = ["rgb_37x23.png", "rgb_61x45.jpg", "rgba_19x41.png", "gray_50x31.png",
                "gray_29x40.jpg", "gray16_17x13.png", "la_23x29.png", "palette_33x21.png",
                "bilevel_13x9.png", "cmyk_20x16.jpg"]


def cases():
    out = []
    # LLaVA-1.5's processor (llava-hf/llava-1.5-7b-hf preprocessor_config.json) on a photo-sized
    # image and on an upscaled small one.
    llava = clip_config(336, 336, 336)
    out.append(("llava336", "rgb_400x300.jpg", llava, False))
    out.append(("llava336", "rgb_61x45.jpg", llava, False))
    out.append(("llava336-pad", "rgb_400x300.jpg", llava, True))
    # Every small image, downscaled (odd target, crop of another aspect).
    for name in SMALL_IMAGES:
        out.append(("bicubic-11", name, clip_config(11, 11, 9), False))
    # Upscaling, crops larger than the resized image (zero padding), other filters.
    out.append(("bicubic-up-47", "rgb_37x23.png", clip_config(47, 40, 45), False))
    out.append(("bicubic-pad-crop", "rgba_19x41.png", clip_config(12, 30, 15), False))
    for resample, label in [(1, "lanczos"), (2, "bilinear"), (4, "box"), (5, "hamming")]:
        out.append((label + "-13", "rgb_61x45.jpg", clip_config(13, 13, 13, resample), False))
        out.append((label + "-up-29", "gray_29x40.jpg", clip_config(31, 29, 29, resample), False))
    out.append(("pad-square-11", "rgba_19x41.png", clip_config(11, 11, 11), True))
    out.append(("no-crop-no-norm", "rgb_37x23.png",
                clip_config(10, 10, 10, do_center_crop=False, do_normalize=False), False))
    out.append(("exact-size", "gray_50x31.png",
                dict(clip_config(0, 8, 8), size={"height": 9, "width": 14}), False))
    out.append(("no-resize", "palette_33x21.png",
                clip_config(20, 17, 17, do_resize=False, rescale_factor=0.5), False))
    return out


def expand2square(img, mean):
    w, h = img.size
    if w == h:
        return img
    bg = tuple(int(x * 255) for x in mean)
    side = max(w, h)
    result = Image.new(img.mode, (side, side), bg)
    result.paste(img, ((side - w) // 2, (side - h) // 2))
    return result


def output_size(h, w, cfg):
    size = cfg["size"]
    if "height" in size:
        return size["height"], size["width"]
    s = size["shortest_edge"]
    short, long = (w, h) if w <= h else (h, w)
    if short == s:
        return h, w
    new_short, new_long = s, int(s * long / short)
    return (new_long, new_short) if w <= h else (new_short, new_long)


def center_crop(arr, ch, cw):
    """transformers.image_transforms.center_crop on [h, w, c]."""
    h, w = arr.shape[:2]
    top, left = (h - ch) // 2, (w - cw) // 2
    if top >= 0 and left >= 0 and top + ch <= h and left + cw <= w:
        return arr[top:top + ch, left:left + cw]
    nh, nw = max(ch, h), max(cw, w)
    new = np.zeros((nh, nw) + arr.shape[2:], dtype=arr.dtype)
    tp, lp = -(-(nh - h) // 2), -(-(nw - w) // 2)
    new[tp:tp + h, lp:lp + w] = arr
    top, left = top + tp, left + lp
    return new[max(0, top):min(nh, top + ch), max(0, left):min(nw, left + cw)]


def pillow_pixel_values(path, cfg, pad):
    img = Image.open(path)
    if cfg["do_convert_rgb"]:
        img = img.convert("RGB")
    if pad:
        img = expand2square(img, cfg["image_mean"])
    arr = np.array(img)
    if cfg["do_resize"]:
        h, w = output_size(arr.shape[0], arr.shape[1], cfg)
        arr = np.array(Image.fromarray(arr).resize((w, h), resample=cfg["resample"]))
    if cfg["do_center_crop"]:
        arr = center_crop(arr, cfg["crop_size"]["height"], cfg["crop_size"]["width"])
    out = arr
    if cfg["do_rescale"]:
        out = (out.astype(np.float64) * cfg["rescale_factor"]).astype(np.float32)
    if cfg["do_normalize"]:
        out = out.astype(np.float32)
        mean = np.array(cfg["image_mean"], dtype=np.float32)
        std = np.array(cfg["image_std"], dtype=np.float32)
        out = (out - mean) / std
    return np.ascontiguousarray(out.astype(np.float32).transpose(2, 0, 1))


def transformers_pixel_values(path, cfg, pad):
    from transformers import AutoImageProcessor
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "preprocessor_config.json"), "w") as f:
            json.dump(dict(cfg, image_processor_type="CLIPImageProcessor"), f)
        proc = AutoImageProcessor.from_pretrained(tmp, use_fast=False)
    img = Image.open(path)
    if pad:
        img = expand2square(img.convert("RGB"), cfg["image_mean"])
    pv = proc(images=img, return_tensors="np")["pixel_values"][0]
    return np.ascontiguousarray(pv.astype(np.float32))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "images"))
    ap.add_argument("--write-images", action="store_true")
    ap.add_argument("--backend", default="pillow", choices=["pillow", "transformers"])
    args = ap.parse_args()
    if args.write_images:
        write_images(args.dir)
    run = pillow_pixel_values if args.backend == "pillow" else transformers_pixel_values
    records = []
    for label, image, cfg, pad in cases():
        pv = run(os.path.join(args.dir, image), cfg, pad)
        flat = pv.reshape(-1)
        stride = 1 if flat.size <= MAX_FULL_VALUES else -(-flat.size // MAX_FULL_VALUES)
        records.append({
            "label": label, "image": image, "config": cfg, "pad_to_square": pad,
            "shape": list(pv.shape), "value_stride": stride,
            "values": [round(float(v), 6) for v in flat[::stride]],
            "sum": float(flat.astype(np.float64).sum()),
        })
        print(f"{label} {image}: {list(pv.shape)}", flush=True)
    meta = {"backend": args.backend, "seed": SEED}
    if args.backend == "pillow":
        import PIL
        meta["pillow_version"] = PIL.__version__
    else:
        import transformers
        import PIL
        meta["transformers_version"] = transformers.__version__
        meta["pillow_version"] = PIL.__version__
    with open(os.path.join(args.dir, f"preprocess_{args.backend}.json"), "w") as f:
        json.dump(dict(meta, cases=records), f, separators=(",", ":"))
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
