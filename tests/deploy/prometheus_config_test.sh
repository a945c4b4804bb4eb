#!/usr/bin/env bash
# deploy/prometheus/*.yml pass `promtool check config`, and each scrapes all three services
# (a scheduler, a worker and a tokenizer job).
# Usage: prometheus_config_test.sh SOURCE_DIR
set -euo pipefail
src="$1"
status=0
for config in "$src"/deploy/prometheus/prometheus.yml "$src"/deploy/prometheus/prometheus-compose.yml; do
  if ! promtool check config "$config"; then
    echo "FAIL: promtool rejects $config" >&2
    status=1
  fi
  for job in litellama-scheduler litellama-worker litellama-tokenizer; do
    if ! grep -q "job_name: $job\$" "$config"; then
      echo "FAIL: $config does not scrape $job" >&2
      status=1
    fi
  done
done
exit "$status"
