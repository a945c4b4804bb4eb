#include "common/log.h"

#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace litellama {

void init_logging(std::string_view service_name, std::string_view level) {
  auto logger = spdlog::stderr_color_mt(std::string(service_name));
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [%n] %v");
  auto parsed = spdlog::level::from_str(std::string(level));
  if (parsed == spdlog::level::off && level != "off") parsed = spdlog::level::info;
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
}

}  // namespace litellama
