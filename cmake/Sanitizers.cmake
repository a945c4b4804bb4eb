# Sanitizer and fuzzing builds. Each is its own build directory (scripts/test.sh uses build-asan,
# build-tsan and build-fuzz); the flags reach every LiteLLaMA target through
# litellama_target_defaults (cmake/LitellamaTarget.cmake), never prebuilt Debian libraries.
#
#   LITELLAMA_SANITIZE=address,undefined  ASan + UBSan (the unit and integration suites)
#   LITELLAMA_SANITIZE=thread             TSan (scheduler, net and service tests)
#   LITELLAMA_FUZZ=ON                     libFuzzer targets of tests/fuzz/ (clang only), with ASan
#                                         and UBSan; every library is built with coverage
#                                         instrumentation (-fsanitize=fuzzer-no-link)
#
# What must stay true: a sanitizer finding stops the program (UBSan is not recoverable here and
# scripts/test.sh sets halt_on_error), so a finding fails its test instead of scrolling past.
set(LITELLAMA_SANITIZE "" CACHE STRING
    "Sanitizers for every target: empty, address, undefined, address,undefined or thread")
option(LITELLAMA_FUZZ "Build the libFuzzer targets of tests/fuzz (needs clang)" OFF)

set(LITELLAMA_SANITIZE_COMPILE_OPTIONS "")
set(LITELLAMA_SANITIZE_LINK_OPTIONS "")

if(LITELLAMA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "LITELLAMA_FUZZ=ON needs clang (e.g. -DCMAKE_CXX_COMPILER=clang++-14 "
                        "-DCMAKE_C_COMPILER=clang-14), not ${CMAKE_CXX_COMPILER_ID}")
  endif()
  if(LITELLAMA_SANITIZE AND NOT LITELLAMA_SANITIZE STREQUAL "address,undefined")
    message(FATAL_ERROR "LITELLAMA_FUZZ=ON builds with address,undefined; "
                        "LITELLAMA_SANITIZE=${LITELLAMA_SANITIZE} cannot be combined with it")
  endif()
  set(LITELLAMA_SANITIZE "address,undefined")
  list(APPEND LITELLAMA_SANITIZE_COMPILE_OPTIONS -fsanitize=fuzzer-no-link)
endif()

if(LITELLAMA_SANITIZE)
  string(REPLACE "," ";" _litellama_sanitizers "${LITELLAMA_SANITIZE}")
  foreach(s IN LISTS _litellama_sanitizers)
    if(NOT s MATCHES "^(address|undefined|thread)$")
      message(FATAL_ERROR "LITELLAMA_SANITIZE: unknown sanitizer '${s}' "
                          "(address, undefined, thread)")
    endif()
  endforeach()
  if("thread" IN_LIST _litellama_sanitizers AND "address" IN_LIST _litellama_sanitizers)
    message(FATAL_ERROR "LITELLAMA_SANITIZE: thread and address cannot be combined")
  endif()
  if(LITELLAMA_HAVE_GPU)
    message(FATAL_ERROR "LITELLAMA_SANITIZE needs -DLITELLAMA_CUDA=OFF (and no LITELLAMA_HIP): the host sanitizers do "
                        "not cover device code (bench/gpu_sanitize.sh runs compute-sanitizer)")
  endif()
  # -O1 (after the Release -O3, so it wins): the optimisation level the sanitizers' docs advise,
  # and it halves the compile time of a sanitized build, CI's largest cost.
  list(APPEND LITELLAMA_SANITIZE_COMPILE_OPTIONS -fsanitize=${LITELLAMA_SANITIZE}
       -fno-omit-frame-pointer -g1 -O1)
  list(APPEND LITELLAMA_SANITIZE_LINK_OPTIONS -fsanitize=${LITELLAMA_SANITIZE})
  if("undefined" IN_LIST _litellama_sanitizers)
    # A UBSan finding aborts the program instead of printing and going on.
    list(APPEND LITELLAMA_SANITIZE_COMPILE_OPTIONS -fno-sanitize-recover=all)
    list(APPEND LITELLAMA_SANITIZE_LINK_OPTIONS -fno-sanitize-recover=all)
  endif()
endif()
