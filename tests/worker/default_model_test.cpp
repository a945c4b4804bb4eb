// The embedded default model (models/default, trained by scripts/train_default_model.py): the CPU
// engine reproduces transformers' float32 greedy continuations of the five prompts recorded in its
// reference.json (ids identical, first-step top logits within 1e-3 of the logit scale), and those
// continuations are mostly English: at least 80% of their words are in Debian's wamerican list.
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/tokenizer/tokenizer.h"
#include "services/worker/checkpoint.h"
#include "services/worker/offline_engine.h"
#include "tests/worker/golden_util.h"

namespace litellama {
namespace {

namespace fs = std::filesystem;
using test::json;

constexpr const char* kWordList = "/usr/share/dict/american-english";  // Debian: wamerican

fs::path model_dir() {
  return fs::path(test::source_dir()) / "models" / "default";
}

json load_reference() {
  std::ifstream in(model_dir() / "reference.json");
  EXPECT_TRUE(in.good()) << "missing " << (model_dir() / "reference.json");
  json j;
  if (in) in >> j;
  return j;
}

// Lower-cased words of the list; entries with an apostrophe ("don't") are kept as they are.
std::set<std::string> load_words() {
  std::set<std::string> words;
  std::ifstream in(kWordList);
  std::string w;
  while (std::getline(in, w)) {
    for (char& c : w) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    words.insert(w);
  }
  return words;
}

// Maximal runs of ASCII letters (with inner apostrophes), lower-cased: the text's words.
std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i <= text.size(); ++i) {
    const char c = i < text.size() ? text[i] : ' ';
    const bool inner_apostrophe = c == '\'' && !cur.empty() && i + 1 < text.size() &&
                                  std::isalpha(static_cast<unsigned char>(text[i + 1]));
    if (std::isalpha(static_cast<unsigned char>(c)) || inner_apostrophe) {
      cur += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!cur.empty()) {
      out.push_back(cur);
      cur.clear();
    }
  }
  return out;
}

TEST(DefaultModel, GreedyContinuationsMatchTransformersAndAreEnglish) {
  ASSERT_TRUE(fs::exists(kWordList)) << kWordList << " is missing: install Debian's wamerican";
  const std::set<std::string> dictionary = load_words();
  ASSERT_GT(dictionary.size(), 50000u);
  const json reference = load_reference();
  ASSERT_EQ(reference["cases"].size(), 5u);

  auto ckpt = Checkpoint::open(model_dir().string());
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto tokenizer = Tokenizer::load(model_dir().string());
  ASSERT_TRUE(tokenizer.is_ok()) << tokenizer.status().to_string();
  auto runner = test::reference_cpu_runner(*ckpt);
  ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
  OfflineEngine engine(**runner);

  size_t n_words = 0, n_known = 0;
  for (const json& c : reference["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    // The prompt ids are the tokenizer's (BOS + the text), so the engine sees what a user's
    // `generate --prompt` gives it.
    EXPECT_EQ(tokenizer->encode(prompt, /*add_special_tokens=*/true),
              c["prompt_ids"].get<std::vector<int32_t>>())
        << prompt;

    auto res = engine.generate({test::request_for(c)});
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    const GenerationResult& r = res->front();
    EXPECT_EQ(r.output_ids, c["greedy_ids"].get<std::vector<int32_t>>()) << prompt;
    const double scale = c["logit_scale"].get<double>();
    ASSERT_EQ(r.top_logits.size(), c["top_logits"].size());
    for (size_t i = 0; i < r.top_logits.size(); ++i) {
      EXPECT_EQ(r.top_logits[i].first, c["top_logits"][i][0].get<int32_t>()) << prompt;
      EXPECT_NEAR(r.top_logits[i].second, c["top_logits"][i][1].get<double>(), 1e-3 * scale)
          << prompt;
    }

    const std::string text = tokenizer->decode(r.output_ids, /*skip_special_tokens=*/true);
    size_t known = 0;
    const std::vector<std::string> words = words_of(text);
    for (const std::string& w : words) known += dictionary.count(w);
    std::printf("[ default model ] '%s' -> '%s' (%zu of %zu words in the list)\n", prompt.c_str(),
                text.c_str(), known, words.size());
    n_words += words.size();
    n_known += known;
  }
  ASSERT_GT(n_words, 50u);
  EXPECT_GE(static_cast<double>(n_known), 0.8 * static_cast<double>(n_words))
      << n_known << " of " << n_words << " generated words are in " << kWordList;
}

}  // namespace
}  // namespace litellama
