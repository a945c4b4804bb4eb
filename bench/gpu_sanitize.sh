#!/usr/bin/env bash
# compute-sanitizer over every GPU test binary (the ctest tests labelled gpu: tests/gpu/,
# tests/kernels/, golden_gpu_test), in parts that each fit a few minutes on one H200. Exits 1 when
# any run reports an error (memcheck: out-of-bounds or misaligned accesses, API errors, device
# exceptions; racecheck: shared-memory hazards of severity error), when a test fails under the
# sanitizer, or when a binary is missing, times out or prints no sanitizer summary.
#
# Usage: bench/gpu_sanitize.sh [--build DIR] PART...     (from the repository root, after a CUDA
#        build with tests; logs go to $OUT/sanitize or ./gpu-sanitize-out)
#   parts: memcheck-kernels  memcheck-runner  memcheck-golden  memcheck-services
#          racecheck-kernels racecheck-runner racecheck-golden
#          all (every part, in that order)   list (print each part's binaries and exit)
#   kernels: every gpu-labelled binary except those below; runner: cuda_model_runner_test;
#   golden: golden_gpu_test; services: cuda_services_test and cuda_prefix_cache_test (their
#   worker processes are followed: --target-processes all).
# Environment: COMPUTE_SANITIZER (the program; default compute-sanitizer on PATH, else
#   /usr/local/cuda/bin/compute-sanitizer), GPU_SANITIZE_TIMEOUT (seconds per binary, default
#   540), GPU_SANITIZE_FILTER_<binary> (a --gtest_filter for that binary, e.g. to bound a part;
#   GPU_SANITIZE_FILTER_<tool>_<binary>, e.g. GPU_SANITIZE_FILTER_racecheck_cuda_kernels_test,
#   wins for that tool),
#   GPU_SANITIZE_ONLY (one binary: a part runs only it, so that parts of one group can run side
#   by side as separate invocations).
set -uo pipefail
build=build
if [ "${1:-}" = "--build" ]; then
  build="$2"
  shift 2
fi
[ $# -gt 0 ] || { sed -n '2,20p' "$0"; exit 2; }
out="${OUT:-gpu-sanitize-out}/sanitize"
mkdir -p "$out"
timeout_s="${GPU_SANITIZE_TIMEOUT:-540}"
# Bounds that keep each binary within one command (unless set by the caller). Attention: the
# kernels of every dtype and head size, on a subset of the shapes. racecheck of cuda_kernels_test
# leaves out CudaKernels.Linear, which runs only cuBLAS kernels (the sanitizer fails internally on
# one of them; memcheck covers them). racecheck of cuda_sampling_test: its small-rows test, which
# takes every path (greedy with ties, top logits, penalties, top-k/top-p/min-p draws, each CTA
# limit) on vocabularies of 1000 and 5003 (the first full-size test alone ran past 170 s).
: "${GPU_SANITIZE_FILTER_attention_kernels_test=*Small*/bfloat16_*:*OneSequence/bfloat16_*:*AgreesWithPrefill/bfloat16_*:*Realistic/bfloat16_d64:*Realistic/bfloat16_d128:*/float16_d96:*/float32_d48:AttentionSupport.*}"
: "${GPU_SANITIZE_FILTER_racecheck_cuda_kernels_test=-CudaKernels.Linear}"
: "${GPU_SANITIZE_FILTER_racecheck_cuda_sampling_test=CudaSampling.EveryPathOnSmallRowsMatchesCpu}"
cs="${COMPUTE_SANITIZER:-}"
if [ -z "$cs" ]; then
  cs="$(command -v compute-sanitizer || true)"
  [ -n "$cs" ] || cs=/usr/local/cuda/bin/compute-sanitizer
fi

# Every binary of a gpu-labelled ctest test (what ctest -L gpu runs), one per line.
gpu_binaries() {
  ctest --test-dir "$build" -L gpu --show-only=json-v1 2>/dev/null | python3 -c '
import json, os, sys
seen = []
for t in json.load(sys.stdin).get("tests", []):
    cmd = t.get("command") or []
    if cmd and os.path.basename(cmd[0]) not in seen:
        seen.append(os.path.basename(cmd[0]))
print("\n".join(seen))'
}

mapfile -t all_bins < <(gpu_binaries)
if [ ${#all_bins[@]} -eq 0 ]; then
  echo "gpu_sanitize: no gpu-labelled tests in $build (configure with CUDA and tests on)" >&2
  exit 1
fi
group_of() {
  case "$1" in
    cuda_model_runner_test) echo runner ;;
    golden_gpu_test) echo golden ;;
    cuda_services_test | cuda_prefix_cache_test) echo services ;;
    *) echo kernels ;;
  esac
}
bins_of_group() {
  local b
  for b in "${all_bins[@]}"; do
    [ -n "${GPU_SANITIZE_ONLY:-}" ] && [ "$b" != "$GPU_SANITIZE_ONLY" ] && continue
    [ "$(group_of "$b")" = "$1" ] && echo "$b"
  done
}

failures=()
# run_one TOOL BINARY: one binary under one tool; records a failure with its reason.
run_one() {
  local tool="$1" bin="$2" log="$out/${1}_${2}.log" filter_var="GPU_SANITIZE_FILTER_${1}_$2"
  [ -n "${!filter_var:-}" ] || filter_var="GPU_SANITIZE_FILTER_$2"
  local args=(--tool "$tool" --error-exitcode 1 --target-processes all --print-limit 50)
  # racecheck models shared memory ordered by barriers; cuBLAS's Hopper kernels (nvjet_*) order it
  # through mbarriers and the TMA's asynchronous proxy, which it reports as hazards. They are not
  # ours to fix, so racecheck skips them; memcheck still covers them.
  [ "$tool" = racecheck ] && args+=(--racecheck-report analysis --kernel-name-exclude kns=nvjet)
  local gtest=()
  [ -n "${!filter_var:-}" ] && gtest=(--gtest_filter="${!filter_var}")
  if [ ! -x "$build/tests/$bin" ]; then
    failures+=("$tool $bin: not built")
    return
  fi
  local start=$SECONDS rc=0
  timeout --kill-after=15 "$timeout_s" "$cs" "${args[@]}" "$build/tests/$bin" "${gtest[@]}" > "$log" 2>&1 || rc=$?
  local took=$((SECONDS - start))
  # memcheck ends with "ERROR SUMMARY: N errors"; racecheck with
  # "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
  local summary
  summary="$(grep -E "(ERROR|RACECHECK) SUMMARY" "$log" | tail -n 2 | sed 's/^=* *//' | tr '\n' ' ')"
  printf 'gpu_sanitize: %-9s %-26s %4d s  rc=%d  %s\n' "$tool" "$bin" "$took" "$rc" "$summary"
  if [ "$rc" -eq 124 ]; then
    failures+=("$tool $bin: timed out after ${timeout_s} s (set GPU_SANITIZE_FILTER_$bin)")
  elif [ "$rc" -ne 0 ]; then
    failures+=("$tool $bin: exit status $rc (see $log)")
  elif [ -z "$summary" ]; then
    failures+=("$tool $bin: no sanitizer summary (see $log)")
  elif grep -qE "ERROR SUMMARY: [1-9]|\(([1-9][0-9]*) errors" "$log"; then
    failures+=("$tool $bin: errors reported (see $log)")
  fi
  grep -qE "FAILED|\[  SKIPPED \]" "$log" && grep -E "^\[  (FAILED|SKIPPED) " "$log" | head -n 5
}

run_part() {
  local tool="${1%%-*}" group="${1#*-}" b
  local bins
  mapfile -t bins < <(bins_of_group "$group")
  if [ ${#bins[@]} -eq 0 ]; then
    failures+=("$1: no binaries")
    return
  fi
  for b in "${bins[@]}"; do run_one "$tool" "$b"; done
}

parts_all="memcheck-kernels memcheck-runner memcheck-golden memcheck-services racecheck-kernels
racecheck-runner racecheck-golden"
for part in "$@"; do
  case "$part" in
    list)
      for g in kernels runner golden services; do echo "$g: $(bins_of_group "$g" | tr '\n' ' ')"; done
      exit 0 ;;
    all) for p in $parts_all; do run_part "$p"; done ;;
    memcheck-kernels|memcheck-runner|memcheck-golden|memcheck-services|racecheck-kernels|\
racecheck-runner|racecheck-golden)
      run_part "$part" ;;
    *) echo "gpu_sanitize: unknown part '$part' (see --help: $0)" >&2; exit 2 ;;
  esac
done
if [ ${#failures[@]} -gt 0 ]; then
  printf 'gpu_sanitize: FAILED: %s\n' "${failures[@]}"
  exit 1
fi
echo "gpu_sanitize: all clean ($*)"
