// The one shape of most numeric command-line flags of the services and the litellama CLI
// (CLI11): the default shown in --help and the value checked against a range.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace litellama {

// A flag whose value must lie in [lo, hi], its default shown in --help. Returns the option so
// that the caller can add to it (a group, an `excludes`).
template <typename T, typename Bound>
CLI::Option* add_bounded_option(CLI::App& app, const std::string& name, T& value,
                                const std::string& help, Bound lo, Bound hi) {
  return app.add_option(name, value, help)->capture_default_str()->check(CLI::Range(lo, hi));
}

}  // namespace litellama
