// Shared helpers of the tokenizer tests: where the sources, assets and goldens are.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/tokenizer/tokenizer.h"

namespace litellama::test {

inline const char* const kTokenizerNames[] = {"llama2", "llama3", "llama3_1", "qwen3"};

// The source root from LITELLAMA_SOURCE_DIR (set by tests/CMakeLists.txt); aborts the test
// with a clear message when it is missing.
inline std::filesystem::path source_dir() {
  const char* dir = std::getenv("LITELLAMA_SOURCE_DIR");
  if (dir == nullptr || *dir == '\0') {
    ADD_FAILURE() << "LITELLAMA_SOURCE_DIR is not set: run the tests through ctest, or set it to "
                     "the repository root";
    return {};
  }
  return dir;
}

inline std::filesystem::path asset_dir(const std::string& name) {
  return source_dir() / "assets" / "tokenizers" / name;
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::json read_golden(const std::string& file) {
  const auto path = source_dir() / "tests" / "golden" / "tokenizer" / file;
  if (!std::filesystem::exists(path)) {
    ADD_FAILURE() << "golden file " << path << " is missing (tests/golden/make_tokenizer_golden.py "
                  << "writes it)";
    return nlohmann::json::object();
  }
  return nlohmann::json::parse(read_text(path));
}

// Loaded once per process: loading a 150k-token vocabulary takes a fraction of a second.
inline const Tokenizer* shared_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second.get();
  const auto dir = asset_dir(name);
  if (!std::filesystem::exists(dir / "tokenizer.json")) {
    ADD_FAILURE() << "tokenizer assets missing at " << dir << ": run scripts/fetch-assets.sh first";
    return nullptr;
  }
  auto tok = Tokenizer::load(dir.string());
  if (!tok.is_ok()) {
    ADD_FAILURE() << "cannot load " << dir << ": " << tok.status().to_string();
    return nullptr;
  }
  auto owned = std::make_unique<Tokenizer>(std::move(tok).value());
  const Tokenizer* ptr = owned.get();
  cache.emplace(name, std::move(owned));
  return ptr;
}

// The ids of encode(text, add_special_tokens=true) from a golden case.
inline std::vector<int32_t> golden_with_special(const nlohmann::json& c) {
  const auto& sp = c.at("special");
  if (sp.contains("ids")) return sp.at("ids").get<std::vector<int32_t>>();
  std::vector<int32_t> ids = sp.at("prefix").get<std::vector<int32_t>>();
  for (int32_t id : c.at("ids")) ids.push_back(id);
  for (int32_t id : sp.at("suffix")) ids.push_back(id);
  return ids;
}

inline std::string escaped(const std::string& s, size_t max = 120) {
  std::string out;
  for (const char c : s.substr(0, max)) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return s.size() > max ? out + "..." : out;
}

}  // namespace litellama::test
