// Shared helpers of the litellama subcommands: where assets live, list parsing, error exits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace litellama::cli {

// assets/ of the source tree (tokenizers, the default model), or $LITELLAMA_ASSETS_DIR.
std::string assets_dir();
// The embedded default model's directory, created from its preset on first use.
Result<std::string> default_model_dir();
// "1,2,3" -> {1, 2, 3}; errors name the bad element.
Result<std::vector<int32_t>> parse_id_list(const std::string& text);
// Prints "litellama <command>: error: <message>" to stderr and returns the exit code 1.
int fail(const char* command, const Status& status);

}  // namespace litellama::cli
