#!/usr/bin/env python3
"""Builds the English training corpus of the embedded default model from Debian packages.

Downloads the documentation packages named in PACKAGES with `apt-get download` (nothing is
installed), unpacks each with `dpkg-deb -x`, and turns the English documents they ship into plain
text: HTML with the tags stripped, man pages and POD with their markup removed, Texinfo info
files with their node markers removed, plain text as it is. Translations are skipped. Lines that are mostly not letters (tables, code, ASCII
art) are dropped so that the corpus is mostly prose. Documents are written in sorted path order,
separated by a blank line, so the same packages give the same corpus.

Output in --out: corpus.txt (UTF-8), manifest.json (package, version, documents and bytes per
package) and copyright/<package> (each package's Debian copyright file, which names its licences).

Usage: scripts/make_default_corpus.py --out /tmp/default-corpus [--jobs 2]
"""
import argparse
import concurrent.futures
import gzip
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Debian 12 documentation packages with English prose; docs/default-model.md lists their licences.
PACKAGES = [
    "debian-reference-en",   # Debian Reference (HTML)
    "debian-handbook",       # The Debian Administrator's Handbook (HTML)
    "debian-policy",         # Debian Policy Manual (HTML, text)
    "developers-reference",  # Debian Developer's Reference (HTML)
    "maint-guide",           # Debian New Maintainers' Guide (HTML)
    "perl-doc",              # Perl manual pages (POD)
    "git-doc",               # Git user manual and command documentation (HTML, text)
    "bash-doc",              # Bash reference manual (info, HTML)
    "gnu-standards",         # GNU Coding Standards and Information for Maintainers (info)
    "manpages",              # Linux man pages, sections 1, 4, 5, 7
    "manpages-dev",          # Linux man pages, sections 2, 3
    "postgresql-doc-15",     # PostgreSQL 15 manual (HTML)
    "apache2-doc",           # Apache HTTP Server documentation (HTML, English pages only)
]

# Directories (inside the unpacked tree) of translated documents, skipped.
TRANSLATION_DIR = re.compile(r"/(?:man/(?!man\d)[a-z]{2}(?:_[A-Z]{2})?(?:\.[^/]+)?|"
                             r"html/(?!en-US)[a-z]{2}-[A-Z]{2})/")
# Apache's content-negotiated pages: foo.html.en is English, foo.html.de is not.
APACHE_LANG = re.compile(r"\.html\.([a-z]{2}(?:-[a-z]{2})?)$")


class _TextOfHtml(html.parser.HTMLParser):
    """Collects the text of an HTML page outside script/style, one line per block element."""

    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "dt",
              "dd", "table", "section", "blockquote", "title"}
    SKIP = {"script", "style", "head"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts = []
        self.skip_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip_depth += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip_depth = max(0, self.skip_depth - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip_depth:
            self.parts.append(data)


def html_to_text(raw):
    p = _TextOfHtml()
    p.feed(raw)
    p.close()
    text = "".join(p.parts)
    # Inline whitespace collapses as a browser would; block breaks stay.
    lines = [re.sub(r"[ \t\r\f\v\xa0]+", " ", ln).strip() for ln in text.split("\n")]
    return "\n".join(lines)


def read_maybe_gz(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


# roff escapes that stand for a character, and font or size changes that stand for none.
ROFF_CHARS = {"\\-": "-", "\\e": "\\", "\\(aq": "'", "\\(dq": '"', "\\(em": "--",
              "\\(en": "-", "\\(lq": '"', "\\(rq": '"', "\\(oq": "'", "\\(cq": "'",
              "\\(bu": "*", "\\(co": "(c)", "\\ ": " ", "\\~": " ", "\\&": "", "\\|": "",
              "\\^": "", "\\:": "", "\\%": "", "\\c": ""}
ROFF_DROP = re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)|\\s[+-]?\d+|\\\*(?:\(..|\[[^\]]*\]|.)|"
                       r"\\\((..)|\\\[[^\]]*\]")
# Macros whose arguments are text (headings, fonts); every other request line is dropped.
ROFF_TEXT_MACROS = {"SH", "SS", "B", "I", "BI", "BR", "IB", "IR", "RB", "RI", "SM", "SB", "TP",
                    "IP", "Nm", "Nd", "Sh", "Ss", "Em", "Ar", "Fl", "Cm", "Pa", "Xr"}


def render_man(path):
    """A man page's text from its roff source: request lines dropped (the text arguments of
    headings and font macros kept), escapes turned into their characters. This is far cheaper
    than running groff on thousands of pages and keeps the same words."""
    out = []
    for line in read_maybe_gz(path).split("\n"):
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            if not parts or parts[0] not in ROFF_TEXT_MACROS or len(parts) < 2:
                if parts and parts[0] in ("PP", "LP", "P", "SH", "SS", "TP", "IP", "sp", "Pp"):
                    out.append("")
                continue
            arg = parts[1]
            line = arg.replace('"', "") if parts[0] not in ("SH", "SS") else arg.strip('"')
            if parts[0] in ("SH", "SS", "Sh", "Ss"):
                out.append("")
                line = line.capitalize() if line.isupper() else line
        for k, v in ROFF_CHARS.items():
            line = line.replace(k, v)
        out.append(ROFF_DROP.sub("", line).replace("\\", ""))
    return "\n".join(out)


POD_CODES = re.compile(r"[A-Z]<<+\s(.*?)\s>>+|[A-Z]<([^<>]*)>")


def render_pod(path):
    """POD's text: command paragraphs (=head1 ...) keep their heading text, formatting codes
    (B<...>, C<...>, L<...>) their content; verbatim (indented) code lines are left to clean()."""
    out, in_pod = [], True
    for line in read_maybe_gz(path).split("\n"):
        if line.startswith("="):
            word, _, rest = line.partition(" ")
            in_pod = word != "=cut"
            if word in ("=begin", "=for"):
                in_pod = False
            if word.startswith("=head") or word == "=item":
                out.extend(["", rest])
            continue
        if in_pod:
            for _ in range(3):  # nested codes: B<C<x>>
                line = POD_CODES.sub(lambda m: (m.group(1) or m.group(2) or "").split("|")[0], line)
            out.append(line)
    return "\n".join(out)


def info_to_text(raw):
    # Info files: node separators (0x1f) and the tag table at the end carry no prose.
    raw = raw.split("\x1fTag Table:")[0]
    return "\n".join(ln for ln in raw.split("\n") if not ln.startswith(("\x1f", "File: ")))


def classify(path):
    """Returns how a file is converted ('html', 'man', 'pod', 'info', 'text') or None to skip."""
    if TRANSLATION_DIR.search(path):
        return None
    m = APACHE_LANG.search(path)
    if m:
        return "html" if m.group(1) == "en" else None
    name = os.path.basename(path)
    base = name[:-3] if name.endswith(".gz") else name
    if "/usr/share/man/man" in path:
        return "man"
    if base.endswith((".html", ".htm")):
        return "html"
    if base.endswith(".pod"):
        return "pod"
    if "/usr/share/info/" in path and (base.endswith(".info") or re.search(r"\.info-\d+$", base)):
        return "info"
    if base.endswith(".txt") and "/usr/share/doc/" in path:
        return "text"
    return None


def is_prose_line(line):
    """Keeps lines mostly made of letters and spaces: prose and headings, not code or tables."""
    s = line.strip()
    if len(s) < 2:
        return s == ""
    letters = sum(ch.isalpha() or ch == " " for ch in s)
    return letters / len(s) >= 0.8 and sum(ch.isalpha() for ch in s) >= 2


def clean(text):
    out, blank = [], True
    for ln in text.split("\n"):
        ln = ln.rstrip()
        if not is_prose_line(ln):
            continue
        if not ln.strip():
            if not blank:
                out.append("")
            blank = True
            continue
        out.append(ln)
        blank = False
    return "\n".join(out).strip()


def convert(path):
    kind = classify(path)
    try:
        if kind == "man":
            text = render_man(path)
        elif kind == "pod":
            text = render_pod(path)
        elif kind == "html":
            text = html_to_text(read_maybe_gz(path))
        elif kind == "info":
            text = info_to_text(read_maybe_gz(path))
        else:
            text = read_maybe_gz(path)
    except (OSError, EOFError, ValueError) as e:
        print(f"make_default_corpus: skipping {path}: {e}", file=sys.stderr)
        return ""
    return clean(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--min-bytes", type=int, default=20_000_000,
                    help="fail unless the corpus reaches this size")
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "copyright"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="default-corpus-")
    os.chmod(work, 0o755)  # apt-get download runs its fetchers as the _apt user
    try:
        debs = os.path.join(work, "debs")
        os.makedirs(debs)
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=debs, check=True)
        manifest, corpus_path = [], os.path.join(args.out, "corpus.txt")
        with open(corpus_path, "w", encoding="utf-8") as corpus:
            for deb in sorted(os.listdir(debs)):
                pkg, version = deb.split("_")[0], deb.split("_")[1]
                root = os.path.join(work, "root", pkg)
                os.makedirs(root)
                subprocess.run(["dpkg-deb", "-x", os.path.join(debs, deb), root], check=True)
                copyright_file = os.path.join(root, "usr/share/doc", pkg, "copyright")
                if os.path.exists(copyright_file):
                    shutil.copy(copyright_file, os.path.join(args.out, "copyright", pkg))
                files = []
                for dirpath, _, names in os.walk(root):
                    for n in names:
                        full = os.path.join(dirpath, n)
                        if os.path.isfile(full) and not os.path.islink(full) and classify(full):
                            files.append(full)
                files.sort()
                n_docs, n_bytes = 0, 0
                with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
                    for text in pool.map(convert, files):
                        if len(text) < 200:
                            continue
                        corpus.write(text + "\n\n")
                        n_docs += 1
                        n_bytes += len(text.encode("utf-8")) + 2
                manifest.append({"package": pkg, "version": version.replace("%3a", ":"),
                                 "documents": n_docs, "bytes": n_bytes})
                print(f"make_default_corpus: {pkg} {version}: {n_docs} documents, "
                      f"{n_bytes / 1e6:.1f} MB", file=sys.stderr)
                shutil.rmtree(root)
        total = sum(m["bytes"] for m in manifest)
        with open(os.path.join(args.out, "manifest.json"), "w") as f:
            json.dump({"packages": manifest, "total_bytes": total}, f, indent=1)
        print(f"make_default_corpus: {total / 1e6:.1f} MB in {corpus_path}", file=sys.stderr)
        if total < args.min_bytes:
            print(f"make_default_corpus: error: corpus below {args.min_bytes} bytes",
                  file=sys.stderr)
            return 1
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
