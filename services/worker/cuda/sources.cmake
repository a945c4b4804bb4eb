# The CUDA backend of worker_lib (included by services/worker/CMakeLists.txt when CUDA is on).
target_sources(worker_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cuda_model_runner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cuda_weights.cpp
  ${CMAKE_CURRENT_LIST_DIR}/forward_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/graph_runner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kv_budget.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_staging.cpp
)
target_compile_definitions(worker_lib PUBLIC LITELLAMA_WITH_CUDA)
target_link_libraries(worker_lib PUBLIC litellama_kernels)
