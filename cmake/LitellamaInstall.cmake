# Installation: `cmake --install build --prefix /opt/litellama` puts the programs in bin/ and what
# they read at run time in share/litellama/ (assets: the tokenizers and the embedded default model;
# deploy: the systemd units, the environment file, the Prometheus and Grafana files). The programs
# find their assets relative to their own bin/ directory (cli/cli_util.h), never in the checkout;
# the build tree gets the same layout through a link, so build/bin/litellama works as well.
include(GNUInstallDirs)

set(LITELLAMA_PROGRAMS litellama litellama-scheduler litellama-worker litellama-tokenizer
  litellama-vision)
foreach(program IN LISTS LITELLAMA_PROGRAMS)
  if(TARGET ${program})
    install(TARGETS ${program} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
  endif()
endforeach()

set(LITELLAMA_DATA_DIR ${CMAKE_INSTALL_DATADIR}/litellama)
# The assets are fetched (scripts/fetch-assets.sh) and generated (make-model) into the checkout,
# not tracked: what exists at install time is installed.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/assets/tokenizers
  DESTINATION ${LITELLAMA_DATA_DIR}/assets OPTIONAL)
# The embedded default model is tracked in the checkout (models/default, see docs/default-model.md).
install(DIRECTORY ${PROJECT_SOURCE_DIR}/models/default
  DESTINATION ${LITELLAMA_DATA_DIR}/models)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/deploy/systemd ${PROJECT_SOURCE_DIR}/deploy/prometheus
  ${PROJECT_SOURCE_DIR}/deploy/grafana
  DESTINATION ${LITELLAMA_DATA_DIR}/deploy)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/litellama.env ${PROJECT_SOURCE_DIR}/deploy/README.md
  DESTINATION ${LITELLAMA_DATA_DIR}/deploy)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/deploy/docker-entrypoint.sh
  DESTINATION ${LITELLAMA_DATA_DIR}/deploy)

# build/share/litellama/{assets,models} -> the checkout's assets/ and models/ (the installed
# layout, in the build tree).
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/share/litellama)
file(CREATE_LINK ${PROJECT_SOURCE_DIR}/assets ${CMAKE_BINARY_DIR}/share/litellama/assets SYMBOLIC)
file(CREATE_LINK ${PROJECT_SOURCE_DIR}/models ${CMAKE_BINARY_DIR}/share/litellama/models SYMBOLIC)
