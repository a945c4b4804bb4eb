#!/usr/bin/env python3
"""Writes the golden files of the tokenizer tests (tests/golden/tokenizer/).

For each tokenizer under --assets (llama2, llama3, llama3_1, qwen3) it loads the reference
implementation with `transformers.AutoTokenizer.from_pretrained(dir)` and records, for a fixed
corpus of texts:
  - encode(text, add_special_tokens=False) and encode(text, add_special_tokens=True),
  - decode(ids, skip_special_tokens=False) and decode(ids, skip_special_tokens=True),
  - decode of pseudo-random id sequences (broken UTF-8, special tokens in the middle),
  - apply_chat_template(messages, tokenize=False, add_generation_prompt=True/False) for a few
    conversations, with the tokenizer's own chat template and with the extra templates of
    tests/golden/tokenizer/templates/ (passed as chat_template=...),
plus what the plain `tokenizers.Tokenizer.from_file(tokenizer.json)` does where it differs from
transformers (kept for diagnosis only: the tests follow transformers).

Output (compact JSON, small enough to commit):
  corpus.json          {"texts": [...], "conversations": [...], "templates": {...}}
  <tokenizer>.json     {"meta": {...}, "encode": [...], "decode": [...], "chat": [...]}

Usage: python3 make_tokenizer_golden.py --assets ../../assets/tokenizers --out OUT_DIR
"""

import argparse
import json
import os
import random
import sys
import traceback

TOKENIZER_NAMES = ["llama2", "llama3", "llama3_1", "qwen3"]
HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE_DIR = os.path.join(HERE, "tokenizer", "templates")
# Extra chat templates (file stem) and the tokenizer whose special tokens they are rendered with.
EXTRA_TEMPLATES = {
    "llama2_chat": "llama2",
    "llama3_1_tools": "llama3_1",
    "qwen2_5": "qwen3",
    "constructs": "qwen3",
}


def build_corpus():
    texts = [
        # English, punctuation, contractions
        "Hello world",
        "Hello, world! How are you today?",
        "The quick brown fox jumps over the lazy dog.",
        "I'm sure you'll see they've done it; we'd say it's fine, isn't it?",
        "DON'T SHOUT. I'M HERE. WE'VE GOT IT. THEY'LL COME. SHE'D KNOW. IT'S OK.",
        "rock 'n' roll, 'quoted', \"double quoted\", `backticks`",
        "e.g. i.e. etc. Mr. Smith vs. Dr. Jones",
        "Hello .  world ,  yes ? no ! don 't I 'm we 've they 're it 's",
        "a . b , c ? d ! e ' f",
        "Ünïcödé àccents: café, naïve, résumé, Straße, façade",
        "ſ long s and 'Ş with 'ſ case-folding",
        # numbers
        "1234567890",
        "3.14159265358979 and 2.71828, 1,000,000 and 1e-9, -42, +7, 0x1F",
        "Call 555-0123 at 10:30am on 2024-07-26; version v1.2.3-rc4",
        "١٢٣٤٥ ٦٧٨٩٠ (Arabic-Indic digits) ¼ ½ ¾ ² ³ Ⅻ",
        # code
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
        "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
        "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot product",
        "const x = {a: 1, 'b': [2, 3], \"c\": null};\nconsole.log(x?.a ?? 0);",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
        "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
        "$ ls -la | grep '\\.cpp$' && echo \"done\" > /dev/null 2>&1",
        "    indented with four spaces\n\tindented with a tab\n  \t mixed\n",
        "@decorator\nclass Foo(Bar):\n    pass\n\n\n",
        "lambda x: x**2 if x>0 else -x  # comment ~~~ !!! ??? ...",
        # CJK
        "你好，世界！今天天气很好。",
        "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
        "日本語のテキストです。ひらがな、カタカナ、漢字を含みます。",
        "한국어 텍스트입니다. 안녕하세요!",
        "中文English混合text测试123个数字",
        "繁體中文：這是一個測試。",
        "𠀀𠀁𪚥 rare CJK extension characters",
        # other scripts
        "مرحبا بالعالم! هذا نص عربي.",
        "שלום עולם, זה טקסט בעברית.",
        "Привет, мир! Это русский текст. Ёлка, щётка.",
        "Γειά σου Κόσμε! Ελληνικά κείμενα.",
        "नमस्ते दुनिया! यह हिंदी पाठ है।",
        "สวัสดีชาวโลก ภาษาไทย",
        "Xin chào thế giới! Tiếng Việt có dấu.",
        "ሰላም ልዑል (Amharic) ᚠᛇᚻ (runes) ꦲꦤꦕꦫꦏ (Javanese)",
        # emoji
        "I love 🍕 and 🍣!",
        "Family: 👨‍👩‍👧‍👦 Rainbow flag: 🏳️‍🌈 Thumbs: 👍🏽 👍🏿",
        "Flags: 🇺🇸🇯🇵🇫🇷 keycap: 1️⃣ #️⃣",
        "😀😃😄😁😆😅😂🤣🥲☺️😊",
        "🧑‍💻 writes code; 👩‍🔬 does science; ❤️‍🔥",
        "emoji at end 🎉",
        "🎉",
        # whitespace
        "",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "a  b   c    d",
        "   leading spaces",
        "trailing spaces   ",
        "\tleading tab",
        "line one\nline two\n\nline four",
        "windows\r\nline\r\nendings\r\n",
        "old mac\rline\rendings",
        "mixed \n \t \r\n  \n\n  end",
        "     \n     \n",
        "no-break\u00a0space, ideographic\u3000space, line\u2028separator, next\u0085line",
        "thin\u2009space\u200bzero-width\u200djoiner\ufeffbom",
        "vertical\x0btab and form\x0cfeed",
        "control \x00 chars \x01\x02\x1b[31mred\x1b[0m \x7f",
        # normalization-sensitive
        "e\u0301 (decomposed) vs \u00e9 (composed)",
        "A\u030a ring, \u212b angstrom sign, \u00c5 composed",
        "\u1100\u1161\u11a8 (Hangul jamo) vs \uac01",
        "ﬁ ligature, ① circled, ｆｕｌｌｗｉｄｔｈ",
        "▁ lower one eighth block ▁▁ and ▁word",
        "Ġ and Ċ and ĉ (byte-level lookalikes)",
        "replacement char: \ufffd and private use \ue000",
        # special-token-looking text
        "<|begin_of_text|>Hello<|end_of_text|>",
        "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
        "<|reserved_special_token_5|> and <|reserved_special_token_250|>",
        "<s>Hello</s> <s> spaced </s>",
        "Hello <s>.",
        "<unk> unknown",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
        "<|endoftext|><|endoftext|>",
        "<think>\nreasoning here\n</think>\n\nanswer",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "<|im_start",
        "im_start|>",
        "< s >",
        "<|eot_id|",
        "<|eot_id|><|eot_id|>x",
        "text<|eot_id|>text",
        " <|eot_id|> spaced ",
        "<0x0A> literal byte token text",
        "[INST] <<SYS>>\nsys\n<</SYS>>\n\nquestion [/INST]",
        # mixed, misc
        "Mix: English, Русский, 中文, العربية, 😀, 123, \t tab, and <s>!",
        "URL: https://example.com/path?query=1&x=y#frag, email: a.b@c.io",
        "JSON: {\"key\": [1, 2, {\"nested\": true}], \"uni\": \"\\u00e9\"}",
        "Math: ∑_{i=1}^{n} x_i² ≤ ∞, ∀ε>0 ∃δ, √2 ≈ 1.414, α β γ",
        "Currency: $100, €50, £30, ¥1000, ₹500, ₿0.01",
        "Box drawing: ┌──┐ │ok│ └──┘ ░▒▓█",
        "'s 't 're 've 'm 'll 'd at start",
        "'S'T'RE'VE'M'LL'D",
        "x's y't z're",
        "....!!!???,,,;;;:::",
        "a\n\n\n\n\nb",
        "a \n b",
        "a\t\t\tb",
        "word\u00a0\u00a0word",
        "123abc456def",
        "1 2 3 4 5 6 7 8 9 10 11 12 100 1000 10000 100000",
        "OpenAI's GPT-4 and Meta's Llama-3.1-8B-Instruct, Qwen3-0.6B",
    ]
    # long inputs
    texts += [
        "a" * 2000,
        " " * 700,
        "ab " * 300,
        "\n" * 200 + "x",
        "😀" * 100,
        "1234567890" * 50,
        "的" * 400,
        "\t" * 300,
        " x" * 400,
        "!" * 500,
        ("The quick brown fox jumps over the lazy dog. " * 20).strip(),
        "Ä" * 300 + "\u0308" * 10,
    ]
    texts += build_whitespace_corpus()
    return texts


CODE_SAMPLES = [
    # Python, four-space indentation, a blank line inside a block, trailing spaces
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):  \n"
    "        self.items.append(x)\n        return self\n\n\n"
    "if __name__ == \"__main__\":\n    s = Stack()\n    for i in range(3):\n"
    "        s.push(i)    # aligned comment\n",
    # C with tabs, and alignment with spaces after tabs
    "static int\nsum(const int *a, size_t n)\n{\n\tint s = 0;\n\tfor (size_t i = 0; i < n; i++) {\n"
    "\t\ts += a[i];\t/* accumulate */\n\t}\n\treturn s;\n}\n",
    # Go (gofmt: tabs for indentation, spaces for alignment)
    "package main\n\nimport \"fmt\"\n\ntype Point struct {\n\tX    int\n\tY    int\n\tName string\n}\n\n"
    "func main() {\n\tp := Point{X: 1, Y: 2}\n\tfmt.Println(p)\n}\n",
    # Makefile: recipe lines start with a tab
    "CC ?= cc\nCFLAGS += -O2 -Wall\n\nall: app\n\napp: main.o util.o\n\t$(CC) $(CFLAGS) -o $@ $^\n\n"
    "clean:\n\trm -f *.o app\n",
    # YAML, two-space indentation and a list
    "services:\n  web:\n    image: \"nginx:1.25\"\n    ports:\n      - \"80:80\"\n      - \"443:443\"\n"
    "    environment:\n      KEY: value   \n",
    # JavaScript, two-space indentation
    "function debounce(fn, ms) {\n  let t;\n  return (...args) => {\n    clearTimeout(t);\n"
    "    t = setTimeout(() => fn(...args), ms);\n  };\n}\n",
    # Rust, four spaces, a doc comment, a match with aligned arms
    "/// Returns the sign.\nfn sign(x: i64) -> i8 {\n    match x {\n        i64::MIN..=-1 => -1,\n"
    "        0             =>  0,\n        _             =>  1,\n    }\n}\n",
    # Haskell, where-clause alignment
    "quicksort :: Ord a => [a] -> [a]\nquicksort []     = []\nquicksort (p:xs) = lesser ++ [p] ++ greater\n"
    "  where\n    lesser  = filter (< p) xs\n    greater = filter (>= p) xs\n",
    # shell heredoc with mixed tabs and spaces
    "#!/bin/sh\nset -eu\nfor f in *.txt; do\n    if [ -s \"$f\" ]; then\n\t\techo \"$f\"\n    fi\ndone\n"
    "cat <<EOF\n  indented heredoc\n\ttabbed heredoc\nEOF\n",
    # pretty-printed JSON with deep indentation
    "{\n  \"a\": {\n    \"b\": {\n      \"c\": {\n        \"d\": [\n          1,\n          2\n        ]\n"
    "      }\n    }\n  }\n}\n",
    # a unified diff: context lines start with one space
    "--- a/x.py\n+++ b/x.py\n@@ -1,4 +1,4 @@\n def f(x):\n-    return x\n+    return  x + 1\n \n"
    " # end\n",
    # Markdown: two trailing spaces are a line break, indented code block, nested list
    "# Title\n\nFirst line  \nsecond line\n\n    code block line\n    another\n\n- item\n  - nested\n"
    "    - deeper\n",
    # SQL with aligned columns
    "SELECT  u.id,\n        u.name,\n        COUNT(*)  AS n\nFROM    users u\nGROUP BY u.id, u.name;\n",
    # Python with CRLF line endings
    "def f():\r\n    x = 1\r\n\r\n    return x\r\n",
    # C with tabs and CRLF
    "int g(void)\r\n{\r\n\treturn 0;\r\n}\r\n",
    # code with non-ASCII identifiers, strings and comments
    "def grüße(名前):\n    # 挨拶を返す\n    return f\"  こんにちは、{名前}  \"\n\n\tprint(grüße(\"世界\"))\n",
    "    let ω = 2.0 * π;   // angular frequency\n    let λ = c / f;     // 波長\n",
]


def build_whitespace_corpus():
    """Whitespace-heavy texts: where SentencePiece-style (Metaspace) pre-tokenization, BPE merges
    of runs of U+2581 and the regex splits of the byte-level tokenizers are easiest to get wrong."""
    texts = list(CODE_SAMPLES)
    # runs of 1..40 spaces: alone, between words, leading, trailing, after a newline
    for n in range(1, 41):
        sp = " " * n
        texts += [sp, "a" + sp + "b", sp + "word", "word" + sp, "x\n" + sp + "y"]
    # runs of tabs and mixed tabs/spaces
    for n in (1, 2, 3, 4, 5, 8, 16):
        texts += ["\t" * n + "x", "x" + "\t" * n, "a" + "\t" * n + "b", "\t" * n]
    texts += ["\t \t \tx", " \t  \t   x", "x \t", "\t\n\t\n", "  \t  \n\t  \t\n"]
    # leading and trailing spaces around words and punctuation
    texts += [" x", "  x", "x ", "x  ", " x ", "  x  ", " .", "  .", ". ", " , ", "  (a)  ",
              " Hello world", "  Hello  world  ", "Hello world ", " 123", "  123  ", " ' s",
              " 's", "  'll", "  \"quoted\"  "]
    # blank lines and lines of only whitespace
    texts += ["a\n\nb", "a\n\n\nb", "a\n \nb", "a\n  \nb", "a\n\t\nb", "a\n \t \nb",
              "\n\n", "\n\n\n\n", " \n", "  \n", "\n ", "\n  ", " \n \n ", "   \n\n   \n",
              "\n\nx", "x\n\n", "\n \n\t\n  \n", "para one.\n\n\n\npara two.\n   \n\npara three."]
    # CRLF and lone CR
    texts += ["a\r\n\r\nb", " \r\n", "\r\n  x", "x  \r\n", "\r\n\r\n", "\r\n \r\n",
              "a\r\n\tb\r\n", "a\r \rb", "\r", "  \r  ", "line\r\n    indented\r\n\r\n"]
    # whitespace mixed with multi-byte text
    texts += ["  你好  世界  ", "\t日本語\n    テキスト", "  😀  ", "😀   😀", "Привет,   мир",
              "café  ", "  naïve\t\tcafé", "  مرحبا   بالعالم  ", "\u05e9\u05dc\u05d5\u05dd  \u05e2",
              "नमस्ते    दुनिया", "   ▁  ▁▁ ", "▁▁▁x", " ▁x", "x▁ ", "한국어  \n  텍스트",
              "  \u00a0  nbsp", "\u00a0\u00a0\u00a0", "\u3000\u3000x\u3000", " \u2003 em space",
              "x\u200b \u200by", "  \ufeff  "]
    # whitespace next to text that is a special token of some tokenizer
    texts += ["<s>  x", "<s> x", " <s>", "  </s>  ", "</s>\n  y", "x\n<s>\n", "<|eot_id|>  z",
              "<|begin_of_text|>\n\n  hi", "<|im_start|>user\n  hi  <|im_end|>\n",
              "a <unk>  b", "<s>\t\tx", "<s>\r\n"]
    # long whitespace-heavy inputs
    texts += ["    " * 100 + "x", "\t" * 50 + "\n" + " " * 50, (" a" + " " * 7) * 60,
              ("def f():\n    pass\n\n") * 40, ("\tx = 1;\r\n") * 40]
    return texts


def build_conversations():
    return [
        {
            "name": "system_user_assistant_user",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Hello! What is 2+2?"},
                {"role": "assistant", "content": "2+2 is 4."},
                {"role": "user", "content": "And 3+3?"},
            ],
        },
        {"name": "user_only", "messages": [{"role": "user", "content": "Hi there"}]},
        {
            "name": "user_assistant_user",
            "messages": [
                {"role": "user", "content": "Tell me a joke."},
                {"role": "assistant", "content": "Why did the chicken cross the road?"},
                {"role": "user", "content": "Why?"},
            ],
        },
        {
            "name": "whitespace_and_unicode",
            "messages": [
                {"role": "system", "content": "  Be concise.\n\n"},
                {"role": "user", "content": "\n  Résumé en français: 你好 😀 <b>bold</b> \"q\" \t\n"},
                {"role": "assistant", "content": "  D'accord.  \n"},
                {"role": "user", "content": "Merci ! "},
            ],
        },
        {
            "name": "assistant_with_think",
            "messages": [
                {"role": "user", "content": "What is 6*7?"},
                {"role": "assistant", "content": "<think>\nSix times seven.\n</think>\n\n42"},
                {"role": "user", "content": "Thanks"},
            ],
        },
        {
            "name": "ends_with_assistant",
            "messages": [
                {"role": "user", "content": "Say hi"},
                {"role": "assistant", "content": "<think>\nEasy.\n</think>\n\nhi"},
            ],
        },
        {
            "name": "roles_not_alternating",
            "messages": [
                {"role": "user", "content": "one"},
                {"role": "user", "content": "two"},
            ],
        },
        {
            "name": "system_only",
            "messages": [{"role": "system", "content": "System prompt only."}],
        },
    ]


def compact_special(with_special, without):
    """Encodes with_special as prefix/suffix around `without` when that is what it is."""
    n = len(without)
    for p in range(len(with_special) - n + 1):
        if with_special[p:p + n] == without:
            return {"prefix": with_special[:p], "suffix": with_special[p + n:]}
    return {"ids": with_special}


def render_chat(tok, messages, add_generation_prompt, chat_template=None):
    try:
        kwargs = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
        if chat_template is not None:
            kwargs["chat_template"] = chat_template
        out = tok.apply_chat_template(messages, **kwargs)
        if not isinstance(out, str):
            return {"error": "non-string result: " + repr(type(out)), "error_type": "TypeError"}
        return {"text": out}
    except Exception as e:  # noqa: BLE001 - the error itself is golden data
        return {"error": str(e), "error_type": type(e).__name__}


def random_id_sequences(rng, vocab_size, special_ids, encodings, n_sequences):
    seqs = []
    for k in range(n_sequences):
        kind = k % 4
        if kind == 0:  # uniform random ids
            seqs.append([rng.randrange(vocab_size) for _ in range(rng.randint(1, 24))])
        elif kind == 1:  # low ids: byte tokens / single bytes of the byte-level alphabet
            seqs.append([rng.randrange(min(vocab_size, 600)) for _ in range(rng.randint(1, 24))])
        elif kind == 2:  # a slice of a real encoding (may cut a character) with specials mixed in
            src = rng.choice([e for e in encodings if len(e) > 3] or [[1, 2, 3, 4]])
            a = rng.randrange(len(src))
            b = rng.randrange(a, len(src)) + 1
            s = list(src[a:b])
            for _ in range(rng.randint(0, 3)):
                if special_ids:
                    s.insert(rng.randrange(len(s) + 1), rng.choice(special_ids))
            seqs.append(s)
        else:  # real encoding reversed (scrambles multi-byte pieces)
            src = rng.choice([e for e in encodings if len(e) > 1] or [[1, 2]])
            seqs.append(list(reversed(src))[:40])
    return seqs


def pipeline_of(tok):
    try:
        d = json.loads(tok.backend_tokenizer.to_str())
        model = d.get("model", {})
        model = {k: v for k, v in model.items() if k not in ("vocab", "merges")}
        return {
            "normalizer": d.get("normalizer"),
            "pre_tokenizer": d.get("pre_tokenizer"),
            "post_processor": d.get("post_processor"),
            "decoder": d.get("decoder"),
            "model": model,
            "n_added_tokens": len(d.get("added_tokens", [])),
        }
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)}


def safe(fn, default=None):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)} if default is None else default


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", required=True, help="folder holding <name>/tokenizer.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--names", default=",".join(TOKENIZER_NAMES))
    args = ap.parse_args()

    os.makedirs(args.out, exist_ok=True)
    texts = build_corpus()
    conversations = build_conversations()
    templates = {}
    for stem in EXTRA_TEMPLATES:
        with open(os.path.join(TEMPLATE_DIR, stem + ".jinja"), encoding="utf-8") as f:
            templates[stem] = f.read()
    with open(os.path.join(args.out, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump({"texts": texts, "conversations": conversations}, f, ensure_ascii=False,
                  separators=(",", ":"))

    n_failed = 0
    for t_index, name in enumerate(args.names.split(",")):
        try:
            write_one(args, t_index, name, texts, conversations, templates)
        except Exception:  # noqa: BLE001 - report and go on with the other tokenizers
            traceback.print_exc()
            n_failed += 1
    return 1 if n_failed else 0


def write_one(args, t_index, name, texts, conversations, templates):
    import tokenizers  # imported here so that --help works anywhere
    import transformers
    from transformers import AutoTokenizer

    d = os.path.join(args.assets, name)
    tok = AutoTokenizer.from_pretrained(d)
    raw = tokenizers.Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    probes = ["<s>", "</s>", "<unk>", "<|begin_of_text|>", "<|eot_id|>", "<|im_end|>",
              "<think>", "hello", "Ġhello", "▁hello", "<0x0A>", "no-such-token-xyz"]
    meta = {
        "versions": {"transformers": transformers.__version__,
                     "tokenizers": tokenizers.__version__},
        "class": type(tok).__name__,
        "len": len(tok),
        "bos_token": safe(lambda: tok.bos_token),
        "bos_token_id": safe(lambda: tok.bos_token_id),
        "eos_token": safe(lambda: tok.eos_token),
        "eos_token_id": safe(lambda: tok.eos_token_id),
        "all_special_ids": safe(lambda: list(tok.all_special_ids)),
        "all_special_tokens": safe(lambda: list(tok.all_special_tokens)),
        "clean_up_tokenization_spaces": safe(lambda: tok.clean_up_tokenization_spaces),
        "add_bos_token": safe(lambda: getattr(tok, "add_bos_token", None)),
        "add_eos_token": safe(lambda: getattr(tok, "add_eos_token", None)),
        "token_to_id": {p: safe(lambda p=p: tok.convert_tokens_to_ids(p)) for p in probes},
        "pipeline": pipeline_of(tok),
    }
    print(f"[{name}] {meta['class']} len={meta['len']} bos={meta['bos_token_id']} "
          f"eos={meta['eos_token_id']}", flush=True)

    encode_cases = []
    all_with_special = []
    n_raw_diff = 0
    for i, text in enumerate(texts):
        case = {"i": i}
        try:
            ids = tok.encode(text, add_special_tokens=False)
            ids_sp = tok.encode(text, add_special_tokens=True)
            case["ids"] = ids
            case["special"] = compact_special(ids_sp, ids)
            all_with_special.append(ids_sp)
            dec = tok.decode(ids_sp, skip_special_tokens=False)
            dec_skip = tok.decode(ids_sp, skip_special_tokens=True)
            if dec != text:
                case["decoded"] = dec
            if dec_skip != text:
                case["decoded_skip"] = dec_skip
            r = raw.encode(text, add_special_tokens=False).ids
            r_sp = raw.encode(text, add_special_tokens=True).ids
            if r != ids:
                case["raw_ids"] = r
            if r_sp != ids_sp:
                case["raw_special"] = compact_special(r_sp, r)
            if r != ids or r_sp != ids_sp:
                n_raw_diff += 1
            rd = raw.decode(ids_sp, skip_special_tokens=False)
            if rd != dec:
                case["raw_decoded"] = rd
        except Exception as e:  # noqa: BLE001
            case["error"] = repr(e)
            traceback.print_exc()
        encode_cases.append(case)

    rng = random.Random(1000 + t_index)
    special_ids = [i for i in (meta["all_special_ids"] or []) if isinstance(i, int)]
    decode_cases = []
    for seq in random_id_sequences(rng, len(tok), special_ids, all_with_special, 40):
        c = {"ids": seq}
        try:
            c["text"] = tok.decode(seq, skip_special_tokens=False)
            c["text_skip"] = tok.decode(seq, skip_special_tokens=True)
            rd = raw.decode(seq, skip_special_tokens=False)
            if rd != c["text"]:
                c["raw_text"] = rd
        except Exception as e:  # noqa: BLE001
            c["error"] = repr(e)
        decode_cases.append(c)

    chat_cases = []
    for conv in conversations:
        for agp in (True, False):
            r = render_chat(tok, conv["messages"], agp)
            r.update({"template": "own", "conversation": conv["name"],
                      "add_generation_prompt": agp})
            chat_cases.append(r)
            for stem, owner in EXTRA_TEMPLATES.items():
                if owner != name:
                    continue
                r = render_chat(tok, conv["messages"], agp, templates[stem])
                r.update({"template": stem, "conversation": conv["name"],
                          "add_generation_prompt": agp})
                chat_cases.append(r)

    out = {"meta": meta, "encode": encode_cases, "decode": decode_cases, "chat": chat_cases}
    with open(os.path.join(args.out, name + ".json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    n_err = sum(1 for c in chat_cases if "error" in c)
    print(f"[{name}] {len(encode_cases)} texts ({n_raw_diff} differ from plain tokenizers), "
          f"{len(decode_cases)} decodes, {len(chat_cases)} chats ({n_err} errors)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
