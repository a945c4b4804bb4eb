// litellama: the command-line front end (offline generation, model tools, and the client/launcher
// commands of the served path).
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace {

// Levenshtein distance, for suggesting the command a typo meant.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

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
  add(litellama::cli::register_quantize_command);
  add(litellama::cli::register_serve_command);
  add(litellama::cli::register_chat_command);
  add(litellama::cli::register_bench_command);
  add(litellama::cli::register_tokenize_command);
  add(litellama::cli::register_detokenize_command);

  // CLI11 answers a misspelled command with "A subcommand is required"; say what was wrong.
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string given = argv[1];
    std::vector<std::string> names;
    for (auto& [sub, run] : commands) names.push_back(sub->get_name());
    if (std::find(names.begin(), names.end(), given) == names.end()) {
      std::string list, closest;
      size_t best = std::string::npos;
      for (const std::string& name : names) {
        list += (list.empty() ? "" : ", ") + name;
        const size_t d = edit_distance(given, name);
        if (d < best) {
          best = d;
          closest = name;
        }
      }
      std::string hint;
      if (best <= std::max<size_t>(2, given.size() / 3)) hint = "; did you mean '" + closest + "'?";
      std::fprintf(stderr, "litellama: unknown command '%s'%s (commands: %s; try --help)\n",
                   given.c_str(), hint.c_str(), list.c_str());
      return 2;
    }
  }
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
