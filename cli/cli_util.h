// Shared helpers of the litellama subcommands: where assets live, list parsing, error exits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace litellama::cli {

// The assets (tokenizers, the default model): $LITELLAMA_ASSETS_DIR, else share/litellama/assets
// beside the bin/ directory of this executable. That is where `cmake --install` puts them, and the
// build tree has the same layout (build/share/litellama/assets links to the checkout's assets/),
// so no binary carries the path of the source tree.
std::string assets_dir();
// The embedded default model's directory, created from its preset on first use.
Result<std::string> default_model_dir();
// "1,2,3" -> {1, 2, 3}; errors name the bad element.
Result<std::vector<int32_t>> parse_id_list(const std::string& text);
// Prints "litellama <command>: error: <message>" to stderr and returns the exit code 1.
int fail(const char* command, const Status& status);

}  // namespace litellama::cli
