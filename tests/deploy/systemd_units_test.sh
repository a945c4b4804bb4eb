#!/usr/bin/env bash
# The systemd units of deploy/systemd, checked offline with systemd's own tools in a scratch root
# (no running systemd needed): `systemd-analyze verify` reports nothing, `systemd-analyze security`
# scores each unit within its limit, the units are Type=notify, and the enable steps of
# deploy/README.md (run with systemctl --root) make multi-user.target start everything at boot.
# Usage: systemd_units_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
src="$1"
bin="$2"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# The layout the README's steps create: the programs, the units, the environment file, and the
# distribution's own units (sysinit.target and the rest) that verify resolves dependencies with.
install -d "$root/opt/litellama/bin" "$root/etc/systemd/system" "$root/etc/litellama" \
  "$root/usr/lib/systemd"
for program in litellama-scheduler litellama-worker litellama-tokenizer litellama-vision; do
  install -m 755 "$bin/$program" "$root/opt/litellama/bin/"
done
install -m 644 "$src"/deploy/systemd/* "$root/etc/systemd/system/"
install -m 644 "$src/deploy/litellama.env" "$root/etc/litellama/litellama.env"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"

units=(litellama.target litellama-scheduler.service litellama-worker.service
  litellama-tokenizer@9402.service litellama-vision.service)
# verify exits 0 on unknown keys and other warnings: any output is a failure.
out="$(systemd-analyze verify --root="$root" "${units[@]}" 2>&1)" || fail "verify failed"
[ -z "$out" ] || fail "systemd-analyze verify reported:"$'\n'"$out"

# Exposure limits (systemd-analyze's 0-10 scale; the tokenizer has the least to reach).
declare -A limit=([litellama-tokenizer@9402.service]=4.0 [litellama-scheduler.service]=5.0
  [litellama-worker.service]=6.0 [litellama-vision.service]=4.0)
for unit in "${!limit[@]}"; do
  report="$(systemd-analyze security --offline=yes --root="$root" "$unit" 2>&1)" ||
    fail "security $unit failed: $report"
  score="$(printf '%s\n' "$report" | sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p')"
  if [ -z "$score" ]; then
    fail "no exposure level for $unit:"$'\n'"$report"
  elif awk -v s="$score" -v l="${limit[$unit]}" 'BEGIN { exit !(s > l) }'; then
    fail "$unit scores $score, above ${limit[$unit]}"
  else
    echo "$unit: exposure $score (at most ${limit[$unit]})"
  fi
done

for unit in litellama-scheduler.service litellama-worker.service litellama-tokenizer@.service \
  litellama-vision.service; do
  grep -qx 'Type=notify' "$src/deploy/systemd/$unit" || fail "$unit is not Type=notify"
done

# The README's enable steps, run against the scratch root.
mapfile -t steps < <(grep -E '^sudo systemctl enable' "$src/deploy/README.md")
[ ${#steps[@]} -gt 0 ] || fail "deploy/README.md has no 'sudo systemctl enable' step"
for step in "${steps[@]}"; do
  args="${step#sudo systemctl enable }"
  args="${args%%#*}"
  # --now needs a running systemd; at boot only the links matter.
  # shellcheck disable=SC2086
  systemctl --root="$root" enable ${args//--now/} >/dev/null 2>&1 || fail "'$step' failed"
done
wants="$root/etc/systemd/system"
[ -L "$wants/multi-user.target.wants/litellama.target" ] ||
  fail "litellama.target is not wanted by multi-user.target after the README's steps"
for unit in litellama-scheduler.service litellama-worker.service litellama-tokenizer@9402.service; do
  if [ ! -L "$wants/litellama.target.wants/$unit" ] &&
    ! grep -q "^Wants=.*$unit" "$wants/litellama.target"; then
    fail "$unit does not start with litellama.target"
  fi
done

[ "$failures" -eq 0 ] || exit 1
echo "systemd units: ok"
