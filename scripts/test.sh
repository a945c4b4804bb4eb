#!/usr/bin/env bash
# Sets the machine up (Debian packages, tokenizer assets), builds everything with tests and runs
# the whole suite with ctest, then the same code under sanitizers and fuzzers, each in its own
# build directory with CUDA off:
#   main   build/       every test (GPU tests report "Skipped" with the reason without a device)
#   asan   build-asan/  unit and integration suites under ASan + UBSan
#   tsan   build-tsan/  scheduler, service and integration (net) tests under TSan
#   fuzz   build-fuzz/  each libFuzzer target of tests/fuzz/ for LITELLAMA_FUZZ_SECONDS (20) s
#   hip    build-hip/   the HIP build for AMD GPUs (gfx90a), compiled and linked: the worker and
#                       the kernel and runner tests. No AMD GPU here, so only the host-side plan
#                       test runs; every kernel object with device code must be linked into
#                       the worker with gfx90a code (but vision_ops, the vision service's)
# A sanitizer finding stops the process that made it (halt_on_error). ASan, LSan and TSan reports
# go to build-*/sanitizer-reports/ and any report there fails the stage, including one from a
# service process a test started; UBSan (not recoverable in these builds) prints to the process's
# stderr and exits 1, which fails the test itself or, in a service, the test that needs it up.
# Usage: scripts/test.sh [extra ctest arguments for the main stage, e.g. -L unit]
#   LITELLAMA_TEST_STAGES="main asan" scripts/test.sh   runs only the stages named
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
stages="${LITELLAMA_TEST_STAGES:-main asan tsan fuzz hip}"
setup_args=(--no-build)
[[ " $stages " != *" hip "* ]] || setup_args+=(--hip)
bash scripts/setup.sh "${setup_args[@]}"
jobs="$(nproc)"
fuzz_seconds="${LITELLAMA_FUZZ_SECONDS:-20}"
timings=()

# The stage functions return non-zero on the first failing step (errexit does not apply inside a
# function called from a || list). Runs "$@" and records how long it took under the stage name $1.
timed() {
  local name="$1" start=$SECONDS rc=0
  shift
  "$@" || rc=$?
  timings+=("$name: $((SECONDS - start)) s$([ "$rc" -eq 0 ] || echo ", FAILED")")
  return "$rc"
}

# Sanitizer runtime options for a stage whose reports go to $1 (emptied first).
sanitizer_env() {
  local reports="$1"
  rm -rf "$reports"
  mkdir -p "$reports"
  local supp="$root/tests/sanitizers"
  export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:strict_init_order=1:check_initialization_order=1:log_path=$reports/asan"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"
  # die_after_fork=0: services are started with fork + exec from threaded test processes.
  # ignore_noninstrumented_modules=1: clang's OpenMP runtime is not instrumented; without it, it
  # prints a warning to that effect on standard output, into the programs' JSON.
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:ignore_noninstrumented_modules=1:suppressions=$supp/tsan.supp:log_path=$reports/tsan"
}

# Fails when a sanitizer wrote any report under $1 (printing them).
check_reports() {
  local reports="$1" found=0 f
  for f in "$reports"/*; do
    [ -e "$f" ] || continue
    found=1
    echo "==== sanitizer report $f"
    cat "$f"
  done
  if [ "$found" -ne 0 ]; then
    echo "test.sh: sanitizer reports in $reports" >&2
    return 1
  fi
}

# Configures a CPU-only build in $1 with the cmake arguments after $2 and builds the targets
# named in $2 (all when empty).
build_cpu() {
  local dir="$1" targets="$2"
  shift 2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLITELLAMA_CUDA=OFF \
    -DLITELLAMA_BENCH=OFF "$@" > /dev/null || return 1
  # shellcheck disable=SC2086
  cmake --build "$dir" -j"$jobs" ${targets:+--target $targets} || return 1
}

stage_main() {
  # CUDA sources build when nvcc is present; sm_90 only, to bound the build time.
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLITELLAMA_CUDA_ARCHITECTURES=90 \
    || return 1
  cmake --build build -j"$jobs" || return 1
  # Each label the suite is made of must have tests built: a label with none fails loudly
  # instead of passing on nothing (gpu tests build wherever nvcc is, and skip at run time
  # without a device).
  local labels=(unit integration fault) label
  if grep -q '^LITELLAMA_CUDA_BUILT:INTERNAL=ON' build/CMakeCache.txt; then labels+=(gpu); fi
  for label in "${labels[@]}"; do
    ctest --test-dir build -N -L "^${label}\$" --no-tests=error > /dev/null ||
      { echo "test.sh: no tests labelled '$label' were built" >&2; return 1; }
  done
  ctest --test-dir build --output-on-failure --timeout 900 -j"$jobs" --no-tests=error "$@"
}

stage_asan() {
  # clang, as for TSan: it compiles this tree's sanitized code about 2.5 times faster than g++
  # (the main stage keeps g++, so both compilers build everything).
  CC=clang-14 CXX=clang++-14 build_cpu build-asan "" -DLITELLAMA_SANITIZE=address,undefined \
    || return 1
  sanitizer_env "$root/build-asan/sanitizer-reports"
  local rc=0
  # The 100-request preemption test runs its reference one request at a time, past its timeout
  # under ASan; the batcher's preemption runs under ASan in scheduler_unit_test. The soak runs 30 s
  # here (ASan finds its memory errors in any stretch of mixed load; the main stage's full minute
  # is the endurance run).
  local LITELLAMA_SOAK_SECONDS="${LITELLAMA_SOAK_SECONDS:-30}"
  export LITELLAMA_SOAK_SECONDS
  ctest --test-dir build-asan --output-on-failure --timeout 900 -j"$jobs" --no-tests=error \
    -L 'unit|integration' -E '^deploy_|^PrefixCacheIntegration\.TinyPool' \
    || rc=$?
  check_reports "$root/build-asan/sanitizer-reports" || rc=1
  return "$rc"
}

stage_tsan() {
  # Only what the selected tests run (their service programs are dependencies of the tests).
  CC=clang-14 CXX=clang++-14 build_cpu build-tsan \
    "scheduler_unit_test services_integration_test soak_test services_fault_test" \
    -DLITELLAMA_SANITIZE=thread || return 1
  sanitizer_env "$root/build-tsan/sanitizer-reports"
  # OpenMP regions on one thread: the OpenMP runtime (clang's libomp) is not instrumented, so its
  # joins are invisible to TSan and every parallel loop would read as a race. The threads under
  # test are the services' own.
  local OMP_NUM_THREADS=1
  export OMP_NUM_THREADS
  local rc=0
  # The deployment checks (shell scripts over the installed tree) are not the code under test.
  # The soak and two fault tests assert deadlines that TSan's slowdown on two cores breaks
  # (heartbeats lapse, a 40 s request does not finish); they run in the main stage. So does the
  # 100-request preemption test, whose per-run deadlines TSan's slowdown would break (the
  # batcher's preemption logic runs under TSan in scheduler_unit_test).
  ctest --test-dir build-tsan --output-on-failure --timeout 900 -j"$jobs" --no-tests=error \
    -L 'integration|fault' \
    -E '^deploy_|^Soak\.|^Fault\.SlowEncodeFails|^Fault\.DuplicateRequestIdIsRefused|^PrefixCacheIntegration\.TinyPool' || rc=$?
  # The scheduler's unit tests, all of them (their label is unit, like every other unit test).
  LITELLAMA_SOURCE_DIR="$root" build-tsan/tests/scheduler_unit_test || rc=$?
  check_reports "$root/build-tsan/sanitizer-reports" || rc=1
  return "$rc"
}

stage_fuzz() {
  local cc=clang-14 cxx=clang++-14
  CC="$cc" CXX="$cxx" cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLITELLAMA_CUDA=OFF -DLITELLAMA_FUZZ=ON -DLITELLAMA_TESTS=OFF -DLITELLAMA_BENCH=OFF \
    -DLITELLAMA_FUZZ_SECONDS="$fuzz_seconds" > /dev/null || return 1
  cmake --build build-fuzz -j"$jobs" --target litellama_fuzzers || return 1
  # libFuzzer reports a finding itself (exit status and an input under build-fuzz/fuzz-artifacts).
  unset ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS
  ctest --test-dir build-fuzz --output-on-failure -j"$jobs" --no-tests=error -L fuzz
}

stage_hip() {
  cmake -S . -B build-hip -G Ninja -DCMAKE_BUILD_TYPE=Release -DLITELLAMA_HIP=ON \
    -DLITELLAMA_BENCH=OFF > /dev/null || return 1
  cmake --build build-hip -j"$jobs" --target litellama-worker cuda_kernels_test cuda_gemv_test \
    cuda_sampling_test cuda_model_runner_test attention_kernels_test golden_gpu_test \
    forward_plan_test || return 1
  # Every kernel object with device code (those whose kernels are all compiled out of portable
  # builds have none) carries it for gfx90a, and all of them are linked into the worker.
  local with_code=0 objects o
  # grep reads readelf's whole output (no -q): leaving early would end readelf with SIGPIPE, and
  # under pipefail that failed pipeline would drop the object from the count on a busy machine.
  for o in build-hip/kernels/hip/*.o; do
    # The vision tower's kernels belong to litellama-vision (CUDA builds only), not the worker.
    case "$(basename "$o")" in vision_ops.o | image_preprocess.o) continue ;; esac
    if readelf -S "$o" | grep '\.hip_fatbin' > /dev/null; then with_code=$((with_code + 1)); fi
  done
  objects="$(roc-obj-ls build-hip/bin/litellama-worker | grep -c 'amdgcn-amd-amdhsa--gfx90a')"
  if [ "$with_code" -eq 0 ] || [ "$objects" -ne "$with_code" ]; then
    echo "test.sh: the HIP worker carries $objects gfx90a code objects;" \
      "$with_code kernel objects have device code" >&2
    return 1
  fi
  # Host code only (the step plan of the portable kernels); the GPU tests need an AMD GPU.
  LITELLAMA_SOURCE_DIR="$root" build-hip/tests/forward_plan_test
}

rc=0
for stage in $stages; do
  case "$stage" in
    main) timed main stage_main "$@" || rc=1 ;;
    asan) timed asan stage_asan || rc=1 ;;
    tsan) timed tsan stage_tsan || rc=1 ;;
    fuzz) timed fuzz stage_fuzz || rc=1 ;;
    hip) timed hip stage_hip || rc=1 ;;
    *) echo "test.sh: unknown stage '$stage' (main asan tsan fuzz hip)" >&2; exit 2 ;;
  esac
done
printf 'test.sh: %s\n' "${timings[@]}"
exit "$rc"
