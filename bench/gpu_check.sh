#!/usr/bin/env bash
# One pass on a GPU machine: build, the GPU test suite, compute-sanitizer over the GPU test
# binaries (bench/gpu_sanitize.sh), the batch-1 decode step time of a Llama-3.2-1B-shaped model, time per output
# token in-process versus through the three services, and per-kernel Nsight Compute breakdowns
# of one decode step for the shapes issue 6 names. Results go to $OUT (or ./gpu-check-out).
# Exits 1 when the build, the GPU tests or a compute-sanitizer run fails.
# Usage: bench/gpu_check.sh   (from the repository root, after the build dependencies are there)
set -uo pipefail
out="${OUT:-gpu-check-out}"
mkdir -p "$out"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLITELLAMA_CUDA_ARCHITECTURES=90 \
  -DLITELLAMA_BENCH=ON > "$out/cmake.log" 2>&1 || { tail -n 30 "$out/cmake.log"; exit 1; }
cmake --build build -j"$(nproc)" > "$out/build.log" 2>&1 || { grep -A5 error "$out/build.log" | head -40; exit 1; }
nvidia-smi -L
status=0
ctest --test-dir build -L gpu -j1 --output-on-failure > "$out/gpu_tests.log" 2>&1 || status=1
grep -E "tests passed|tests failed" "$out/gpu_tests.log"
# The profiling build's own tests (-DLITELLAMA_PROFILING=ON: layer kernel repeats, block trace).
cmake -S . -B build-profiling -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLITELLAMA_CUDA_ARCHITECTURES=90 -DLITELLAMA_PROFILING=ON -DLITELLAMA_BENCH=OFF \
  > "$out/cmake_profiling.log" 2>&1 &&
  cmake --build build-profiling -j"$(nproc)" --target cuda_model_runner_test cuda_gemv_test \
    > "$out/build_profiling.log" 2>&1 &&
  build-profiling/tests/cuda_model_runner_test --gtest_filter='*RepeatedLayerKernels*' \
    > "$out/profiling_tests.log" 2>&1 &&
  build-profiling/tests/cuda_gemv_test --gtest_filter='*BlockTrace*' \
    >> "$out/profiling_tests.log" 2>&1 || { echo "profiling build tests failed"; status=1; }
# compute-sanitizer over the GPU test binaries (bench/gpu_sanitize.sh): the parts named in
# GPU_SANITIZE_PARTS (default: memcheck of the kernel tests and of three golden models; `all`
# is every binary under memcheck and racecheck, several calls' worth). Any error fails this script.
golden_filter='*Float32*llama3_tiny*:*Float32*qwen2_tiny*:*HalfPrecision*qwen3_tiny*'
export GPU_SANITIZE_FILTER_golden_gpu_test="${GPU_SANITIZE_FILTER_golden_gpu_test-$golden_filter}"
# shellcheck disable=SC2086
OUT="$out" bash bench/gpu_sanitize.sh --build build \
  ${GPU_SANITIZE_PARTS:-memcheck-kernels memcheck-golden} || status=1
build/tests/cuda_model_runner_test --gtest_also_run_disabled_tests \
  --gtest_filter='*DISABLED_DecodeStep*' > "$out/decode_timing.log" 2>&1
grep -iE "ms|FAILED" "$out/decode_timing.log" | head -10

# In-process versus served, batch 1, same model and lengths.
model=/tmp/litellama-1b
build/bin/litellama make-model --preset llama3.2-1b --out "$model" > /dev/null
ids=$(seq -s, 1000 1127)
build/bin/litellama generate --model "$model" --device cuda --input-ids "$ids" \
  --max-new-tokens 256 --ignore-eos --json > "$out/inprocess.json" 2>"$out/inprocess.log"
python3 -c "import json;d=json.load(open('$out/inprocess.json'));print('in-process: %.3f ms per output token (%d tokens incl. 128-token prefill)'%(d['seconds']*1e3/len(d['output_ids']),len(d['output_ids'])))"
build/bin/litellama serve --model "$model" --device cuda --run-dir /tmp/litellama-gpu \
  --metrics-port 9400 --log-dir "$out" > "$out/serve.log" 2>&1 &
serve_pid=$!
python3 - <<'PY'
import time, urllib.request
for _ in range(240):
    try:
        if urllib.request.urlopen("http://127.0.0.1:9400/ready", timeout=1).status == 200:
            break
    except Exception:
        pass
    time.sleep(0.5)
PY
build/bin/litellama bench --server ipc:///tmp/litellama-gpu/client.sock -n 8 -c 1 \
  --input-len 128 --output-len 256 > "$out/served_bench.txt" 2>&1
tail -n 25 "$out/served_bench.txt"
kill -TERM "$serve_pid"; wait "$serve_pid"

# Where a decode step's time goes, kernel by kernel (each replayed alone, cold L2).
for spec in "llama3.2-1b 1" "llama3.2-1b 8" "qwen2.5-1.5b 1" "llama3.1-8b 1"; do
  set -- $spec
  python3 bench/kernel_breakdown.py --preset "$1" --batch "$2" --dir "/dev/shm/litellama-$1" \
    > "$out/breakdown_$1_b$2.txt" 2>&1
  head -n 3 "$out/breakdown_$1_b$2.txt"
done
exit "$status"
