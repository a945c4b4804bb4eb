// Subcommands of the `litellama` command. Each registers its flags on the app and returns the
// function main() runs when the subcommand was chosen (its exit code).
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace litellama::cli {

using CommandMain = std::function<int()>;

CommandMain register_generate_command(CLI::App& app);
CommandMain register_make_model_command(CLI::App& app);
CommandMain register_quantize_command(CLI::App& app);
CommandMain register_serve_command(CLI::App& app);
CommandMain register_chat_command(CLI::App& app);
CommandMain register_bench_command(CLI::App& app);
CommandMain register_tokenize_command(CLI::App& app);
CommandMain register_detokenize_command(CLI::App& app);

}  // namespace litellama::cli
