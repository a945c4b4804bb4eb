// Shared helpers of the litellama subcommands: where assets live, list parsing, error exits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

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
// A CLI11 check for an integer option that must be >= 0, whose message says so in words
// ("--top-k must be 0 (off) or more, not -1") instead of a range up to DBL_MAX.
CLI::Validator non_negative(const std::string& meaning_of_zero);
// A CLI11 check for a TCP port option: 0 (off) or 1..max_port.
CLI::Validator port_number(int max_port);

// The bytes of an --image file: a regular file of at most 1 GiB; errors name the path.
Result<std::string> read_image_file(const std::string& path);

// Prints "litellama <command>: error: <message>" to stderr and returns the exit code 1.
int fail(const char* command, const Status& status);

}  // namespace litellama::cli
