# Per-target settings shared by every LiteLLaMA target (no global flags).
function(litellama_target_defaults target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release>>:-O3>)
  # clang (the sanitizer and fuzzing builds) also warns where an aggregate initializer leaves out
  # members that have default initializers, or elides the braces of a nested std::array: both are
  # this code's style, and g++ -Wextra accepts them.
  target_compile_options(${target} PRIVATE
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:Clang>>:-Wno-missing-field-initializers
    -Wno-missing-braces>)
  # LITELLAMA_SANITIZE / LITELLAMA_FUZZ (cmake/Sanitizers.cmake); empty in a normal build. The
  # link options are public so every program linking a sanitized library gets the runtime.
  if(LITELLAMA_SANITIZE_COMPILE_OPTIONS)
    target_compile_options(${target} PRIVATE ${LITELLAMA_SANITIZE_COMPILE_OPTIONS})
    target_link_options(${target} PUBLIC ${LITELLAMA_SANITIZE_LINK_OPTIONS})
  endif()
endfunction()
