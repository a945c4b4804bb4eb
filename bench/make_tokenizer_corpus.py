#!/usr/bin/env python3
"""Writes the corpus of the tokenizer encode benchmark (bench/tokenizer_bench.py).

About 2 MB of mixed text, one record per line of the output (each record a JSON string, so that
records may hold any character), made only from text that Debian packages ship plus the golden
tokenizer corpus:
  - English prose: the licence texts of /usr/share/common-licenses (base-files) and the
    /usr/share/doc/*/copyright files, about 700 KB;
  - source code: the Python standard library (/usr/lib/python3.*/*.py, libpython3-stdlib) and C
    headers (/usr/include/*.h, libc6-dev), about 700 KB;
  - multilingual: the translated messages of the gettext catalogues under /usr/share/locale
    (coreutils, bash, apt, dpkg, Linux-PAM, glib, gtk, ...) in 24 languages, about 600 KB;
  - every text of tests/golden/tokenizer/corpus.json (one record each).
Prose and code are cut into lines (a record keeps its newline); a translated message is split at
its newlines. Files are taken in sorted order until each budget is filled, so the same Debian
installation always gives the same corpus; the script prints what it used. It fails when the
result is smaller than 1.5 MB (a stripped installation), instead of measuring on too little.

Usage: python3 bench/make_tokenizer_corpus.py --out corpus.jsonl
"""

import argparse
import gettext
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN_CORPUS = os.path.join(HERE, "..", "tests", "golden", "tokenizer", "corpus.json")
LANGUAGES = ["zh_CN", "zh_TW", "ja", "ko", "ru", "uk", "ar", "he", "fa", "hi", "bn", "ta", "th",
             "el", "vi", "tr", "pl", "de", "fr", "es", "pt_BR", "it", "sv", "cs"]
CATALOGUES = ["coreutils", "bash", "apt", "dpkg", "Linux-PAM", "glib20", "gtk20", "findutils",
              "grep", "diffutils", "gettext-tools", "binutils", "git", "gnupg2"]
PROSE_BYTES = 700_000
CODE_BYTES = 700_000
MULTILINGUAL_BYTES = 600_000


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def take_lines(paths, budget, records, used):
    n = 0
    for path in paths:
        if n >= budget:
            break
        text = read_text(path)
        if not text:
            continue
        used.append(path)
        for line in text.splitlines(keepends=True):
            if line.strip() == "" and len(line) < 2:
                continue  # lone newlines would only measure call overhead
            records.append(line)
            n += len(line.encode("utf-8"))
            if n >= budget:
                break
    return n


def messages(path):
    try:
        with open(path, "rb") as f:
            catalog = gettext.GNUTranslations(f)._catalog  # noqa: SLF001 - the parsed .mo
    except (OSError, Exception):  # noqa: BLE001 - a broken catalogue is skipped
        return []
    out = []
    for key in sorted(catalog, key=str):
        value = catalog[key]
        if isinstance(value, str) and value and key != "":
            out.append(value)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    records, used = [], []
    prose = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(
        glob.glob("/usr/share/doc/*/copyright"))
    n_prose = take_lines(prose, PROSE_BYTES, records, used)

    python_files = sorted(glob.glob("/usr/lib/python3.*/*.py"))
    headers = sorted(glob.glob("/usr/include/*.h"))
    n_code = take_lines(python_files, CODE_BYTES * 4 // 7, records, used)
    n_code += take_lines(headers, CODE_BYTES - n_code, records, used)

    n_multi = 0
    per_language = MULTILINGUAL_BYTES // len(LANGUAGES)
    for lang in LANGUAGES:
        n_lang = 0
        for cat in CATALOGUES:
            path = f"/usr/share/locale/{lang}/LC_MESSAGES/{cat}.mo"
            if n_lang >= per_language or not os.path.exists(path):
                continue
            used.append(path)
            for msg in messages(path):
                for line in msg.splitlines(keepends=True):
                    if not line.strip():
                        continue
                    records.append(line)
                    n_lang += len(line.encode("utf-8"))
                if n_lang >= per_language:
                    break
        n_multi += n_lang

    with open(GOLDEN_CORPUS, encoding="utf-8") as f:
        golden = [t for t in json.load(f)["texts"] if t]
    records += golden
    n_golden = sum(len(t.encode("utf-8")) for t in golden)

    total = n_prose + n_code + n_multi + n_golden
    with open(args.out, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(records)} records, {total} bytes (prose {n_prose}, code {n_code}, "
          f"multilingual {n_multi}, golden {n_golden}) from {len(used)} files")
    if total < 1_500_000:
        print("error: less than 1.5 MB of text found; is this a Debian installation with "
              "base-files, libpython3-stdlib, libc6-dev and translations?", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
