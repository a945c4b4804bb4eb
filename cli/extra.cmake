# Libraries of the served-path subcommands (serve, chat, bench, generate --server).
target_link_libraries(litellama PRIVATE litellama_net)
