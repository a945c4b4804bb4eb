#!/usr/bin/env bash
# Start-up of the served path: seconds from `litellama serve` starting to the scheduler's /ready
# answering 200, and the CPU seconds (user + system) each of the four processes used until then
# (the CPU figure is what a loaded machine does not change). Stops the services afterwards.
# Usage: bench/serve_ready_time.sh [BIN_DIR] [PORT] [extra serve flags, e.g. --model DIR]
set -euo pipefail
bin="${1:-build/bin}"
port="${2:-19400}"
shift $(($# > 2 ? 2 : $#))
run_dir="$(mktemp -d)"
log="$run_dir/serve.log"
start=$(date +%s.%N)
"$bin/litellama" serve --run-dir "$run_dir" --metrics-port "$port" "$@" >"$log" 2>&1 &
serve=$!
trap 'kill -INT "$serve" 2>/dev/null; wait "$serve" 2>/dev/null; rm -rf "$run_dir"' EXIT
until curl -fs -o /dev/null "http://127.0.0.1:$port/ready"; do
  kill -0 "$serve" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.02
done
end=$(date +%s.%N)
ticks=$(getconf CLK_TCK)
total=0
for pid in "$serve" $(pgrep -P "$serve"); do
  read -r user sys < <(awk '{print $14, $15}' "/proc/$pid/stat")
  printf '  %-16s %5.2f s CPU\n' "$(cat "/proc/$pid/comm")" "$(echo "($user + $sys) / $ticks" | bc -l)"
  total=$((total + user + sys))
done
printf 'ready after %.2f s, %.2f s CPU in all (load average %s)\n' "$(echo "$end - $start" | bc -l)" \
  "$(echo "$total / $ticks" | bc -l)" "$(cut -d' ' -f1 /proc/loadavg)"
