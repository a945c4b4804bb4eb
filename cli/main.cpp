// litellama: the command-line front end (offline generation, model tools, and the client/launcher
// commands of the served path).
#include <cstdio>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"LiteLLaMA: fast inference for LLaMA-family models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "litellama 0.1.0");

  std::vector<std::pair<CLI::App*, litellama::cli::CommandMain>> commands;
  auto add = [&](litellama::cli::CommandMain (*reg)(CLI::App&)) {
    const size_t before = app.get_subcommands({}).size();
    auto run = reg(app);
    auto subs = app.get_subcommands({});
    if (subs.size() > before) commands.emplace_back(subs.back(), std::move(run));
  };
  add(litellama::cli::register_generate_command);
  add(litellama::cli::register_make_model_command);
  add(litellama::cli::register_serve_command);
  add(litellama::cli::register_chat_command);
  add(litellama::cli::register_bench_command);
  add(litellama::cli::register_tokenize_command);
  add(litellama::cli::register_detokenize_command);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : commands) {
    if (sub->parsed()) return run();
  }
  std::fprintf(stderr, "litellama: no subcommand given (try --help)\n");
  return 2;
}
