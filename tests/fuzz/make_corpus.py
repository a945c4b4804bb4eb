#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/ (committed; rerun only to change the seeds).

Seeds are small valid inputs of each format plus a few near misses, so the fuzzers start from
inputs that reach deep into the parsers:
  msgpack_fuzzer             one frame of every message type (a minimal msgpack encoder below)
  model_config_fuzzer        config.json of each supported architecture, RoPE variant and
                             quantization layout
  safetensors_fuzzer         small safetensors files (f32/bf16/f16/int, empty, truncated)
  chat_template_fuzzer       the chat templates of assets/tokenizers/* and constructs they use
  tokenizer_json_fuzzer      assets/tokenizers/*/tokenizer.json cut down to a few hundred tokens
  tokenizer_roundtrip_fuzzer multilingual text, special tokens, ill-formed UTF-8
  image_fuzzer               the small test images of tests/golden/images, whole and truncated
Usage: python3 tests/fuzz/make_corpus.py   (from the repository root, after scripts/fetch-assets.sh)
"""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fuzz", "corpus")


def save(target, name, data):
    if isinstance(data, str):
        data = data.encode("utf-8")
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- msgpack (the subset the codec uses: maps, arrays, str, int, float, bool, nil) -------------
def mp(v):
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        if 0 <= v < 2**32:
            return b"\xce" + struct.pack(">I", v)
        if 0 <= v < 2**64:
            return b"\xcf" + struct.pack(">Q", v)
        return b"\xd3" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode("utf-8")
        if len(b) < 32:
            return bytes([0xA0 | len(b)]) + b
        return b"\xdb" + struct.pack(">I", len(b)) + b
    if isinstance(v, (list, tuple)):
        head = bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdd" + struct.pack(">I", len(v))
        return head + b"".join(mp(x) for x in v)
    if isinstance(v, dict):
        head = bytes([0x80 | len(v)]) if len(v) < 16 else b"\xdf" + struct.pack(">I", len(v))
        return head + b"".join(mp(k) + mp(x) for k, x in v.items())
    raise TypeError(type(v))


def frame(type_name, body):
    return mp(dict({"v": 3, "type": type_name}, **body))


SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.0,
            "repetition_penalty": 1.1, "frequency_penalty": 0.0, "presence_penalty": 0.0,
            "seed": 42}
MESSAGES = {
    "generate_request": {"request_id": 7, "prompt": "Hello", "messages": [
        {"role": "user", "content": "hi"}], "prompt_ids": [1, 2, 3], "add_special_tokens": True,
        "sampling": SAMPLING, "max_tokens": 16, "stop_token_ids": [2], "stop": ["\n\n"],
        "ignore_eos": False, "skip_special_tokens": True, "top_logits": 3},
    "generate_chunk": {"request_id": 7, "text": "Hi", "token_ids": [5, 6], "finished": True,
                       "finish_reason": "stop", "n_prompt_tokens": 3, "n_generated_tokens": 2,
                       "top_logits": [[5, 1.5], [6, -0.25]]},
    "abort_request": {"request_id": 7},
    "request_error": {"request_id": 7, "code": "INVALID_ARGUMENT", "message": "bad"},
    "server_info_request": {"request_id": 1},
    "server_info_reply": {"request_id": 1, "ready": True, "worker_up": True, "n_tokenizers": 1,
                          "model": "m", "device": "cpu", "dtype": "float32", "n_kv_slots": 2048,
                          "n_kv_slots_used": 0, "n_requests_running": 0, "n_requests_waiting": 0,
                          "max_model_len": 4096, "vocab_size": 128256,
                          "eos_token_ids": [128001, 128009]},
    "tokenizer_heartbeat": {"incarnation": 2**63 + 5, "eos_token_ids": [2]},
    "encode_request": {"op_id": 3, "text": "abc", "messages": [
        {"role": "system", "content": "s"}], "add_special_tokens": False,
        "sent_unix_ns": 1700000000000000000},
    "encode_reply": {"op_id": 3, "token_ids": [1, 99], "error": ""},
    "detokenize_request": {"op_id": 9, "items": [
        {"request_id": 3, "token_ids": [1, 2, 3], "read_offset": 1, "skip_special_tokens": True,
         "final": False}], "sent_unix_ns": 5},
    "detokenize_reply": {"op_id": 9, "items": [
        {"request_id": 3, "text": "x", "advanced": True}], "error": ""},
    "worker_heartbeat": {"incarnation": 11, "ready": True, "step_ring_name": "litellama-ring",
                         "model": "m", "device": "cpu", "dtype": "float32", "n_kv_slots": 64,
                         "vocab_size": 1000, "max_position_embeddings": 2048,
                         "eos_token_ids": [2]},
    "step_request": {"step_id": 1, "buffer": 0, "incarnation": 11, "sent_unix_ns": -1},
    "step_result": {"step_id": 1, "ok": False, "error": "boom"},
    "scheduler_heartbeat": {"incarnation": 12},
}


def msgpack_corpus():
    for name, body in MESSAGES.items():
        save("msgpack_fuzzer", name, frame(name, body))
        save("msgpack_fuzzer", name + "-empty", frame(name, {}))
    save("msgpack_fuzzer", "wrong-field-type", frame("generate_request", {"max_tokens": "many"}))
    save("msgpack_fuzzer", "bad-version", mp({"v": 99, "type": "abort_request"}))
    save("msgpack_fuzzer", "not-a-map", mp([1, 2, 3]))
    save("msgpack_fuzzer", "huge-array", b"\xdd\xff\xff\xff\xff")


# ---- config.json --------------------------------------------------------------------------------
def model_config_corpus():
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "vocab_size": 1000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
            "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": [2, 3], "hidden_act": "silu"}
    variants = {
        "llama": {},
        "llama3-rope": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192}},
        "linear-rope": {"rope_scaling": {"type": "linear", "factor": 2.0}},
        "dynamic-rope": {"rope_scaling": {"type": "dynamic", "factor": 2.0}},
        "mistral": {"architectures": ["MistralForCausalLM"], "sliding_window": None},
        "qwen2-yarn": {"architectures": ["Qwen2ForCausalLM"], "rope_scaling": {
            "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}},
        "qwen3": {"architectures": ["Qwen3ForCausalLM"], "head_dim": 32, "attention_bias": False},
        "llava": {"architectures": ["LlavaForConditionalGeneration"], "text_config": {
            "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000,
            "max_position_embeddings": 2048}},
        "float32": {"torch_dtype": "float32", "eos_token_id": 2, "attention_bias": True},
    }
    # Each quantization_config layout of tests/golden/quant (docs/quantization.md).
    with open(os.path.join(ROOT, "tests/golden/quant/layouts.json")) as f:
        layouts = {c["case"]: c["quantization_config"] for c in json.load(f)["cases"]}
    for name, case in [("awq", "awq_g16"), ("gptq", "gptq4_act_order"),
                       ("fp8", "fp8_tensor_static"), ("int8", "int8_channel")]:
        variants["quant-" + name] = {"quantization_config": layouts[case]}
    for name, delta in variants.items():
        save("model_config_fuzzer", name + ".json", json.dumps(dict(base, **delta), indent=1))
    save("model_config_fuzzer", "not-json", "{\"hidden_size\": ")
    save("model_config_fuzzer", "array", "[1, 2]")


# ---- safetensors -------------------------------------------------------------------------------
def safetensors_file(tensors, pad=True):
    header, data = {}, b""
    for name, dtype, shape, blob in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def safetensors_corpus():
    save("safetensors_fuzzer", "f32", safetensors_file([
        ("a", "F32", [2, 3], struct.pack("<6f", *range(6))),
        ("b", "F32", [], struct.pack("<f", 1.0))]))
    save("safetensors_fuzzer", "mixed", safetensors_file([
        ("w.bf16", "BF16", [4], b"\x80\x3f" * 4), ("w.f16", "F16", [2, 2], b"\x00\x3c" * 4),
        ("i", "I64", [1], struct.pack("<q", 5)), ("empty", "F32", [0, 4], b"")]))
    full = safetensors_file([("a", "F32", [4], struct.pack("<4f", 1, 2, 3, 4))])
    save("safetensors_fuzzer", "truncated", full[:-5])
    save("safetensors_fuzzer", "unpadded", safetensors_file(
        [("x", "F16", [3], b"\x00\x3c" * 3)], pad=False))
    save("safetensors_fuzzer", "short", b"\x08\x00\x00")


# ---- chat templates ----------------------------------------------------------------------------
def chat_template_corpus():
    for n in ("llama2", "llama3", "llama3_1", "qwen3"):
        p = os.path.join(ROOT, "assets", "tokenizers", n, "tokenizer_config.json")
        t = json.load(open(p)).get("chat_template")
        if isinstance(t, str):
            save("chat_template_fuzzer", n + ".jinja", t)
    snippets = {
        "loop": "{% for m in messages %}{{ loop.index }}{{ m.role|upper }}{% if not loop.last %},"
                "{% endif %}{% else %}none{% endfor %}",
        "ns": "{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
              "{% endfor %}{{ ns.n }}",
        "filters": "{{ messages|map(attribute='role')|join('|') }}{{ messages|length }}"
                   "{{ 'x'|default('y') }}{{ messages[0]|tojson }}{{ ' a '|trim }}",
        "strings": "{{ 'a-b'.split('-')[::-1] }}{{ 'ab'.startswith('a') }}{{ '%d'|format(3) }}",
        "raise": "{% if messages[0].role != 'system' %}{{ raise_exception('no system') }}"
                 "{% endif %}",
        "dict": "{% for k, v in {'a': 1, 'b': [1, 2]}.items() %}{{ k }}={{ v }};{% endfor %}",
        "ws": "  {%- if add_generation_prompt +%}\n  x {{- bos_token -}}  {% endif %}{# c #}",
        "set-block": "{% set x %}inner {{ eos_token }}{% endset %}{{ x }}",
        "unsupported": "{% macro m() %}x{% endmacro %}{{ m() }}",
        "slices": "{{ messages[1:] }}{{ messages[-1]['content'][:3] }}{{ (1, 2)[0] }}",
        "math": "{{ 7 // 2 }}{{ 2 ** 10 }}{{ -7 % 3 }}{{ 1 / 4 }}{{ 'a' ~ 1 ~ none }}",
        "tests": "{{ x is defined }}{{ messages is iterable }}{{ 3 is divisibleby 3 }}"
                 "{{ tools is none }}",
        "break": "{% for i in range(10) %}{% if i > 2 %}{% break %}{% endif %}{{ i }}"
                 "{% continue %}{% endfor %}",
        "cond": "{{ 'a' if messages else 'b' }}{{ messages|selectattr('role', 'equalto', "
                "'user')|list|length }}",
        "generation": "{% generation %}{{ messages[-1].content }}{% endgeneration %}",
    }
    for name, src in snippets.items():
        save("chat_template_fuzzer", name + ".jinja", src)


# ---- tokenizer.json ----------------------------------------------------------------------------
def shrink_tokenizer(tj, n_vocab):
    vocab = tj["model"]["vocab"]
    keep = {t: i for t, i in vocab.items() if i < n_vocab}
    merges = []
    for m in tj["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in keep and b in keep and a + b in keep:
            merges.append(m)
    out = dict(tj)
    out["model"] = dict(tj["model"], vocab=keep, merges=merges)
    added = []
    for k, t in enumerate(tj.get("added_tokens", [])[:4]):
        added.append(dict(t, id=n_vocab + k))
    out["added_tokens"] = added
    # The post-processor's special tokens become the first added token (their ids must exist).
    def remap(pp):
        if not isinstance(pp, dict):
            return
        if pp.get("type") == "TemplateProcessing":
            for tok in pp.get("special_tokens", {}).values():
                tok["ids"] = [n_vocab]
        for inner in pp.get("processors", []):
            remap(inner)
    if out.get("post_processor"):
        out["post_processor"] = json.loads(json.dumps(out["post_processor"]))
        remap(out["post_processor"])
    return out


def tokenizer_json_corpus():
    # The first byte of each seed picks the tokenizer_config.json variant (tokenizer_json_fuzzer).
    for n, cfg in (("llama2", 1), ("llama3_1", 3), ("qwen3", 0)):
        p = os.path.join(ROOT, "assets", "tokenizers", n, "tokenizer.json")
        tj = json.load(open(p, encoding="utf-8"))
        small = shrink_tokenizer(tj, 400)
        save("tokenizer_json_fuzzer", n, bytes([cfg]) + json.dumps(small, ensure_ascii=False,
                                                                     separators=(",", ":")).encode())
    minimal = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3},
                         "merges": ["a b"], "unk_token": "<unk>"},
               "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "Whitespace"},
               "decoder": None, "post_processor": None,
               "added_tokens": [{"id": 4, "content": "<s>", "special": True}]}
    save("tokenizer_json_fuzzer", "minimal", b"\x00" + json.dumps(minimal).encode())
    save("tokenizer_json_fuzzer", "not-bpe", b"\x00" + b'{"model": {"type": "WordPiece"}}')


def roundtrip_corpus():
    texts = {
        "english": "Hello, world! It's a test: 1234 + 5678 = 6912.",
        "spaces": "  leading\n\n\ttabs   and trailing  ",
        "multilingual": "Grüße, 日本語のテキスト, русский, عربى, 😀👍🏽 e\u0301",
        "special": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                   "<s>[INST] x [/INST]</s><|im_start|>user\nq<|im_end|>",
        "code": "def f(x):\n    return x ** 2  # square\n",
    }
    for i, (name, t) in enumerate(texts.items()):
        for which in range(3):
            save("tokenizer_roundtrip_fuzzer", f"{name}-{which}", bytes([which + 4 * i]) + t.encode())
    save("tokenizer_roundtrip_fuzzer", "ill-formed", b"\x00\xff\xfe\xc3(\xe2\x82\xf0\x9f\x98 ok \xed\xa0\x80")


def image_corpus():
    # The first byte of each seed picks the preprocessing variant (image_fuzzer).
    d = os.path.join(ROOT, "tests", "golden", "images")
    for i, name in enumerate(sorted(os.listdir(d))):
        if not name.endswith((".png", ".jpg")) or os.path.getsize(os.path.join(d, name)) > 4096:
            continue
        data = open(os.path.join(d, name), "rb").read()
        save("image_fuzzer", name, bytes([i * 37 % 256]) + data)
        save("image_fuzzer", "cut-" + name, bytes([i]) + data[:len(data) * 2 // 3])


def http_body_corpus():
    # The first byte picks the endpoint: odd chat, even completions (http_body_fuzzer).
    chat = [
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
        {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
         "stream": True, "stream_options": {"include_usage": True}, "n": 3, "seed": 5,
         "temperature": 0.7, "top_p": 0.9, "top_k": 40, "stop": ["\n", "END"],
         "logprobs": True, "top_logprobs": 5, "max_completion_tokens": 8},
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "tools": []},
        {"model": "other", "messages": []},
    ]
    completions = [
        {"model": "m", "prompt": "The sky is", "echo": True, "logprobs": 2},
        {"model": "m", "prompt": [[1, 2, 3], [4, 5]], "max_tokens": 2, "ignore_eos": True},
        {"model": "m", "prompt": ["a", "b"], "n": 2, "stop_token_ids": [7], "min_p": 0.1,
         "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.5},
        {"model": "m", "prompt": "x", "max_tokens": -1},
    ]
    for i, b in enumerate(chat):
        save("http_body_fuzzer", f"chat-{i}.bin", b"\x01" + json.dumps(b).encode())
    for i, b in enumerate(completions):
        save("http_body_fuzzer", f"completions-{i}.bin", b"\x00" + json.dumps(b).encode())
    save("http_body_fuzzer", "not-json.bin", b"\x01{\"model\": ")
    save("http_body_fuzzer", "bad-utf8.bin", b"\x00{\"model\": \"m\", \"prompt\": \"\xff\xfe\"}")


def main():
    http_body_corpus()
    image_corpus()
    msgpack_corpus()
    model_config_corpus()
    safetensors_corpus()
    chat_template_corpus()
    tokenizer_json_corpus()
    roundtrip_corpus()
    for d in sorted(os.listdir(OUT)):
        files = os.listdir(os.path.join(OUT, d))
        size = sum(os.path.getsize(os.path.join(OUT, d, f)) for f in files)
        print(f"{d}: {len(files)} files, {size} bytes")


if __name__ == "__main__":
    sys.exit(main())
