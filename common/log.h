// Logging: spdlog behind one setup call so every binary formats lines the same way.
// Levels: one INFO line per request lifecycle event; per-token detail only at DEBUG.
#pragma once

#include <string_view>

#include <spdlog/spdlog.h>

namespace litellama {

// Sets the process-wide logger: stderr, "[time] [level] [service] message".
// `level` is one of trace, debug, info, warn, error, off; unknown names fall back to info.
void init_logging(std::string_view service_name, std::string_view level = "info");

}  // namespace litellama

#define LITELLAMA_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define LITELLAMA_LOG_INFO(...) SPDLOG_INFO(__VA_ARGS__)
#define LITELLAMA_LOG_WARN(...) SPDLOG_WARN(__VA_ARGS__)
#define LITELLAMA_LOG_ERROR(...) SPDLOG_ERROR(__VA_ARGS__)
