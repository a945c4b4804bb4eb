#!/usr/bin/env bash
# Sets the machine up (Debian packages, tokenizer assets), builds everything with tests and runs
# the whole suite with ctest. GPU tests report "Skipped" with the reason when no device is present.
# Usage: scripts/test.sh [extra ctest arguments, e.g. -L unit]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh --no-build
jobs="$(nproc)"
# CUDA sources build when nvcc is present; sm_90 only, to bound the build time.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLITELLAMA_CUDA_ARCHITECTURES=90
cmake --build build -j"$jobs"
# Each label the suite is made of must have tests built: a label with none fails loudly instead
# of passing on nothing (gpu tests build wherever nvcc is, and skip at run time without a device).
labels=(unit integration)
if grep -q '^LITELLAMA_CUDA_BUILT:INTERNAL=ON' build/CMakeCache.txt; then labels+=(gpu); fi
for label in "${labels[@]}"; do
  ctest --test-dir build -N -L "^${label}\$" --no-tests=error > /dev/null ||
    { echo "test.sh: no tests labelled '$label' were built" >&2; exit 1; }
done
ctest --test-dir build --output-on-failure --timeout 900 -j"$jobs" --no-tests=error "$@"
