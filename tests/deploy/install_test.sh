#!/usr/bin/env bash
# `cmake --install` of a build tree into a scratch prefix: the four programs land in bin/, the
# assets in share/litellama/assets, the embedded default model in share/litellama/models/default,
# the deployment files in share/litellama/deploy; an installed program takes its assets and default
# model from its own prefix, and with the installed tokenizers removed it finds none (it never
# falls back to the checkout's assets/).
# Usage: install_test.sh BUILD_DIR
set -euo pipefail
build="$1"
prefix="$(mktemp -d)"
trap 'rm -rf "$prefix"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >/dev/null
for program in litellama litellama-scheduler litellama-worker litellama-tokenizer litellama-vision; do
  [ -x "$prefix/bin/$program" ] || fail "$program not installed"
done
for file in deploy/systemd/litellama-worker.service deploy/litellama.env \
  deploy/prometheus/prometheus.yml deploy/grafana/litellama-dashboard.json \
  assets/tokenizers/llama3_1/tokenizer.json models/default/config.json \
  models/default/model-00001-of-00002.safetensors models/default/tokenizer.json; do
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

# Without --model the installed CLI generates with the installed default model.
out="$("$prefix/bin/litellama" generate --prompt "The kernel is" --max-new-tokens 4 --json)" ||
  fail "installed generate without --model failed"
case "$out" in *'"output_ids"'*) ;;
  *) fail "installed generate printed no output: $out" ;; esac
mv "$prefix/share/litellama/models" "$prefix/share/litellama/models.moved"
if err="$("$prefix/bin/litellama" generate --prompt "The kernel is" --max-new-tokens 4 2>&1)"; then
  fail "generate without --model succeeded with the installed default model removed"
fi
case "$err" in *"default model"*) ;; *) fail "no clear error without the default model: $err" ;; esac
echo "install: ok"
