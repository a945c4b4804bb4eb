#!/usr/bin/env python3
"""Packed quantized linear layers and their dequantized weights, from each layout's description.

This is a second, independent unpacker of the layouts services/worker/quantized_linear.h reads
(docs/quantization.md describes them). For each case it draws random integers, scales and zero
points with numpy, packs them the way the format's writer does (AutoAWQ's GEMM packer, GPTQ's
packer, compressed-tensors' float- and int-quantized compressors), unpacks the packed words again
(checking that it gets the integers back), and computes the dense float32 weight [out, in] in
float32 arithmetic: (q - z) * scale for AWQ and GPTQ, q * scale for FP8 and int8.

Output (committed; tests/worker/quantized_linear_test.cpp compares the engine's dequantization
with it bit for bit):
  <out>/layouts.safetensors  "<case>.<tensor>" for every stored tensor, "<case>.expected" (F32)
  <out>/layouts.json         for each case: its module name, out/in features and the
                             quantization_config a checkpoint of that layout would carry

Usage: make_quant_golden.py --out tests/golden/quant
"""
import argparse
import json
import os
import struct

import numpy as np

SEED = 31
N_OUT, N_IN = 16, 64

# AutoAWQ's GEMM packer stores output column AWQ_ORDER[i] of each group of eight in nibble i.
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def bf16_bits(x):
    """float32 -> bfloat16 bits, rounding to nearest even."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def fp8_e4m3_value(byte):
    """OCP FP8 E4M3 (PyTorch float8_e4m3fn): bias 7, no infinities, 0x7f/0xff NaN."""
    byte = np.asarray(byte, dtype=np.uint8)
    sign = np.where(byte & 0x80, -1.0, 1.0).astype(np.float32)
    exp = ((byte >> 3) & 0xF).astype(np.int32)
    mant = (byte & 0x7).astype(np.float32)
    normal = np.ldexp((8.0 + mant).astype(np.float32), exp - 10).astype(np.float32)
    subnormal = np.ldexp(mant, -9).astype(np.float32)
    value = np.where(exp == 0, subnormal, normal).astype(np.float32)
    value = np.where((exp == 15) & (mant == 7), np.float32(np.nan), value)
    return (sign * value).astype(np.float32)


def pack_along_last(values, bits, order=None):
    """Packs unsigned ints of `bits` along the last axis, 32 // bits per int32 word."""
    per = 32 // bits
    v = values.astype(np.uint32).reshape(*values.shape[:-1], values.shape[-1] // per, per)
    if order is not None:
        v = v[..., order]
    words = np.zeros(v.shape[:-1], dtype=np.uint32)
    for i in range(per):
        words |= (v[..., i] & ((1 << bits) - 1)) << np.uint32(bits * i)
    return words.view(np.int32)


def unpack_along_last(words, bits, order=None):
    per = 32 // bits
    w = words.view(np.uint32)
    nib = np.stack([(w >> np.uint32(bits * i)) & ((1 << bits) - 1) for i in range(per)], axis=-1)
    if order is not None:
        out = np.empty_like(nib)
        out[..., order] = nib  # nibble i holds column order[i]
        nib = out
    return nib.reshape(*words.shape[:-1], words.shape[-1] * per).astype(np.int32)


def awq_case(rng, group):
    g = N_IN if group == -1 else group
    q = rng.integers(0, 16, size=(N_IN, N_OUT))
    z = rng.integers(0, 16, size=(N_IN // g, N_OUT))
    scales = rng.uniform(0.002, 0.05, size=(N_IN // g, N_OUT)).astype(np.float16)
    qweight = pack_along_last(q, 4, AWQ_ORDER)
    qzeros = pack_along_last(z, 4, AWQ_ORDER)
    uq = unpack_along_last(qweight, 4, AWQ_ORDER)
    uz = unpack_along_last(qzeros, 4, AWQ_ORDER)
    assert (uq == q).all() and (uz == z).all()
    rows = np.arange(N_IN) // g
    dense = (uq - uz[rows]).astype(np.float32) * scales.astype(np.float32)[rows]
    config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
              "version": "gemm", "modules_to_not_convert": None}
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales}
    return config, tensors, dense.T


def gptq_case(rng, bits, group, sym, act_order, v2, scale_dtype=np.float16):
    g = N_IN if group == -1 else group
    groups = N_IN // g
    top = 1 << bits
    q = rng.integers(0, top, size=(N_IN, N_OUT))
    if sym:
        zeros = np.full((groups, N_OUT), top // 2)
    else:
        # The original format cannot hold a zero point of 0 (stored less one, it would read back
        # as 2^bits), so its writers produce 1 to 2^bits - 1; gptq_v2 holds any.
        zeros = rng.integers(0 if v2 else 1, top, size=(groups, N_OUT))
    # The original format stores each zero point less one (masked to `bits`); gptq_v2 as it is.
    stored_zeros = zeros if v2 else (zeros - 1) & (top - 1)
    scales = rng.uniform(0.002, 0.05, size=(groups, N_OUT)).astype(scale_dtype)
    if act_order:
        g_idx = rng.permutation(np.repeat(np.arange(groups), g)).astype(np.int32)
    else:
        g_idx = (np.arange(N_IN) // g).astype(np.int32)
    qweight = pack_along_last(q.T, bits).T.copy()  # packed along the input dimension
    qzeros = pack_along_last(stored_zeros, bits)
    uq = unpack_along_last(qweight.T.copy(), bits).T
    uz = unpack_along_last(qzeros, bits) + (0 if v2 else 1)
    assert (uq == q).all() and (uz == zeros).all()
    scales_f32 = scales.astype(np.float32)
    dense = (uq - uz[g_idx]).astype(np.float32) * scales_f32[g_idx]
    config = {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": sym,
              "desc_act": act_order, "checkpoint_format": "gptq_v2" if v2 else "gptq"}
    tensors = {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx}
    return config, tensors, dense.T


def ct_config(kind, strategy, static_input):
    weights = {"num_bits": 8, "type": kind, "strategy": strategy, "symmetric": True,
               "dynamic": False, "group_size": None}
    inputs = {"num_bits": 8, "type": kind, "symmetric": True,
              "strategy": "tensor" if static_input else "token", "dynamic": not static_input}
    return {"quant_method": "compressed-tensors",
            "format": "float-quantized" if kind == "float" else "int-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": inputs}},
            "ignore": ["lm_head"], "quantization_status": "compressed"}


def fp8_case(rng, strategy, scale_bf16, static_input):
    codes = rng.integers(0, 256, size=(N_OUT, N_IN)).astype(np.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x3C  # no NaN codes
    shape = (1,) if strategy == "tensor" else (N_OUT, 1)
    scale = rng.uniform(0.001, 0.02, size=shape).astype(np.float32)
    tensors = {"weight": ("F8_E4M3", codes)}
    if scale_bf16:
        tensors["weight_scale"] = ("BF16", bf16_bits(scale))
        scale = bf16_value(bf16_bits(scale))
    else:
        tensors["weight_scale"] = scale
    if static_input:
        tensors["input_scale"] = np.array([0.05], dtype=np.float32)
    dense = fp8_e4m3_value(codes) * scale
    return ct_config("float", strategy, static_input), tensors, dense.astype(np.float32)


def int8_case(rng, strategy):
    q = rng.integers(-128, 128, size=(N_OUT, N_IN)).astype(np.int8)
    shape = () if strategy == "tensor" else (N_OUT, 1)
    scale = np.asarray(rng.uniform(0.001, 0.02, size=shape), dtype=np.float32)
    dense = q.astype(np.float32) * scale
    return ct_config("int", strategy, False), {"weight": q, "weight_scale": scale}, dense


def dequantize_stored(config, get, n_out, n_in):
    """Dense float32 [n_out, n_in] of one module from its stored tensors (get(name) -> array, or
    None when absent), by the layout descriptions alone; used by make_quant_model_golden.py."""
    method = config["quant_method"]
    if method == "awq":
        g = n_in if config["group_size"] == -1 else config["group_size"]
        q = unpack_along_last(get("qweight"), 4, AWQ_ORDER)
        z = unpack_along_last(get("qzeros"), 4, AWQ_ORDER)
        rows = np.arange(n_in) // g
        return ((q - z[rows]).astype(np.float32) * get("scales").astype(np.float32)[rows]).T
    if method == "gptq":
        bits = config["bits"]
        g = n_in if config["group_size"] == -1 else config["group_size"]
        q = unpack_along_last(get("qweight").T.copy(), bits).T
        v2 = config.get("checkpoint_format", "gptq").lower() == "gptq_v2"
        z = unpack_along_last(get("qzeros"), bits) + (0 if v2 else 1)
        g_idx = get("g_idx")
        if g_idx is None:
            g_idx = np.arange(n_in) // g
        return ((q - z[g_idx]).astype(np.float32) * get("scales").astype(np.float32)[g_idx]).T
    weight, scale = get("weight"), get("weight_scale").astype(np.float32)
    values = fp8_e4m3_value(weight) if weight.dtype == np.uint8 else weight.astype(np.float32)
    return (values * scale.reshape(-1, 1) if scale.size > 1 else values * scale.reshape(())) \
        .astype(np.float32)


DTYPES = {np.dtype(np.int32): "I32", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32",
          np.dtype(np.int8): "I8"}


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        dtype, array = value if isinstance(value, tuple) else (DTYPES[value.dtype], value)
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)
    cases = {
        "awq_g16": awq_case(rng, 16),
        "awq_g_all": awq_case(rng, -1),
        "gptq4_g16_sym": gptq_case(rng, 4, 16, True, False, False),
        "gptq4_g16_asym": gptq_case(rng, 4, 16, False, False, False),
        "gptq4_act_order": gptq_case(rng, 4, 16, False, True, False),
        "gptq8_g32_v2": gptq_case(rng, 8, 32, False, False, True, np.float32),
        "fp8_tensor_static": fp8_case(rng, "tensor", False, True),
        "fp8_channel_bf16": fp8_case(rng, "channel", True, False),
        "int8_channel": int8_case(rng, "channel"),
        "int8_tensor": int8_case(rng, "tensor"),
    }
    tensors, listing = {}, []
    for name, (config, stored, dense) in cases.items():
        assert dense.shape == (N_OUT, N_IN) and np.isfinite(dense).all()
        for tensor, value in stored.items():
            tensors[f"{name}.{tensor}"] = value
        tensors[f"{name}.expected"] = np.ascontiguousarray(dense, dtype=np.float32)
        listing.append({"case": name, "module": name, "out_features": N_OUT, "in_features": N_IN,
                        "quantization_config": config})
    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "layouts.safetensors"), tensors)
    with open(os.path.join(args.out, "layouts.json"), "w") as f:
        json.dump({"seed": SEED, "numpy_version": np.__version__, "cases": listing}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
