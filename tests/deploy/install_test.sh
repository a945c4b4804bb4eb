#!/usr/bin/env bash
# `cmake --install` of a build tree into a scratch prefix: the four programs land in bin/, the
# assets in share/litellama/assets, the deployment files in share/litellama/deploy; an installed
# program takes its assets from its own prefix, and with the installed tokenizers removed it finds
# none (it never falls back to the checkout's assets/).
# Usage: install_test.sh BUILD_DIR
set -euo pipefail
build="$1"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >/dev/null
for program in litellama litellama-scheduler litellama-worker litellama-tokenizer; do
  [ -x "$prefix/bin/$program" ] || fail "$program not installed"
done
for file in deploy/systemd/litellama-worker.service deploy/litellama.env \
  deploy/prometheus/prometheus.yml deploy/grafana/litellama-dashboard.json \
  assets/tokenizers/llama3_1/tokenizer.json; do
  [ -f "$prefix/share/litellama/$file" ] || fail "share/litellama/$file not installed"
done

# The installed CLI takes the preset's tokenizer from the installed assets.
unset LITELLAMA_ASSETS_DIR
"$prefix/bin/litellama" make-model --preset llama3-tiny --out "$prefix/model" >/dev/null ||
  fail "installed make-model failed"
[ -f "$prefix/model/tokenizer.json" ] || fail "installed make-model wrote no tokenizer"
rm -rf "$prefix/share/litellama/assets/tokenizers"
"$prefix/bin/litellama" make-model --preset llama3-tiny --out "$prefix/model2" >/dev/null 2>&1 ||
  fail "installed make-model failed without tokenizers"
[ ! -e "$prefix/model2/tokenizer.json" ] ||
  fail "make-model found a tokenizer after the installed ones were removed (in the checkout?)"
echo "install: ok"
