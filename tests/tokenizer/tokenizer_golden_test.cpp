// Parity with Hugging Face transformers (AutoTokenizer of transformers 5.17 / tokenizers 0.23),
// against tests/golden/tokenizer/*.json written by tests/golden/make_tokenizer_golden.py.
#include <gtest/gtest.h>

#include "tests/tokenizer/tokenizer_test_support.h"

namespace litellama {
namespace {

using test::escaped;
using test::golden_with_special;

std::string ids_str(const std::vector<int32_t>& ids, size_t max = 24) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size() && i < max; ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + (ids.size() > max ? ",...]" : "]");
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tok_ = test::shared_tokenizer(GetParam());
    ASSERT_NE(tok_, nullptr);
    corpus_ = test::read_golden("corpus.json");
    golden_ = test::read_golden(GetParam() + ".json");
    ASSERT_TRUE(corpus_.contains("texts"));
    ASSERT_TRUE(golden_.contains("encode"));
  }
  const std::string& text(const nlohmann::json& c) const {
    return corpus_["texts"][c["i"].get<size_t>()].get_ref<const std::string&>();
  }
  // Encodes every golden text and expects the ids `want(case)`; the first few misses are shown.
  template <typename Want>
  void expect_encodes(bool add_special_tokens, Want&& want_of) const {
    int n_bad = 0;
    for (const auto& c : golden_["encode"]) {
      const std::vector<int32_t> want = want_of(c);
      const auto got = tok_->encode(text(c), add_special_tokens);
      if (got != want && n_bad++ < 5) {
        ADD_FAILURE() << "text " << c["i"] << " '" << escaped(text(c)) << "'\n  want "
                      << ids_str(want) << "\n  got  " << ids_str(got);
      }
    }
    EXPECT_EQ(n_bad, 0) << "of " << golden_["encode"].size() << " texts";
  }
  const Tokenizer* tok_ = nullptr;
  nlohmann::json corpus_, golden_;
};

TEST_P(GoldenTest, EncodeWithoutSpecialTokens) {
  expect_encodes(false,
                 [](const nlohmann::json& c) { return c["ids"].get<std::vector<int32_t>>(); });
}

TEST_P(GoldenTest, EncodeWithSpecialTokens) {
  expect_encodes(true, [](const nlohmann::json& c) { return golden_with_special(c); });
}

TEST_P(GoldenTest, DecodeEncodedText) {
  int n_bad = 0;
  for (const auto& c : golden_["encode"]) {
    const auto ids = golden_with_special(c);
    for (const bool skip : {false, true}) {
      const char* key = skip ? "decoded_skip" : "decoded";
      const std::string want = c.contains(key) ? c[key].get<std::string>() : text(c);
      const std::string got = tok_->decode(ids, skip);
      if (got != want && n_bad++ < 5) {
        ADD_FAILURE() << "text " << c["i"] << " skip=" << skip << "\n  want '" << escaped(want)
                      << "'\n  got  '" << escaped(got) << "'";
      }
    }
  }
  EXPECT_EQ(n_bad, 0);
}

TEST_P(GoldenTest, DecodeArbitraryIds) {
  int n_bad = 0;
  for (const auto& c : golden_["decode"]) {
    ASSERT_FALSE(c.contains("error")) << c.dump();
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    for (const bool skip : {false, true}) {
      const std::string want = c[skip ? "text_skip" : "text"].get<std::string>();
      const std::string got = tok_->decode(ids, skip);
      if (got != want && n_bad++ < 5) {
        ADD_FAILURE() << "ids " << ids_str(ids) << " skip=" << skip << "\n  want '" << escaped(want)
                      << "'\n  got  '" << escaped(got) << "'";
      }
    }
  }
  EXPECT_EQ(n_bad, 0);
}

TEST_P(GoldenTest, ChatTemplates) {
  std::map<std::string, nlohmann::json> conversations;
  for (const auto& conv : corpus_["conversations"]) conversations[conv["name"]] = conv["messages"];
  int n_checked = 0;
  for (const auto& c : golden_["chat"]) {
    std::vector<Tokenizer::ChatMessage> messages;
    for (const auto& m : conversations.at(c["conversation"].get<std::string>())) {
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    const std::string tmpl = c["template"].get<std::string>();
    const bool agp = c["add_generation_prompt"].get<bool>();
    Result<std::string> got = Status(StatusCode::kInternal, "not rendered");
    if (tmpl == "own") {
      got = tok_->apply_chat_template(messages, agp);
    } else {
      const auto path =
          test::source_dir() / "tests" / "golden" / "tokenizer" / "templates" / (tmpl + ".jinja");
      got = tok_->apply_chat_template(test::read_text(path), messages, agp);
    }
    const std::string where =
        tmpl + "/" + c["conversation"].get<std::string>() + (agp ? "/generation_prompt" : "");
    if (c.contains("error")) {
      ASSERT_FALSE(got.is_ok()) << where << " rendered '" << escaped(got.value()) << "'";
      if (tmpl == "own" && !tok_->has_chat_template()) {
        EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << where;
      } else {
        EXPECT_NE(got.status().message().find(c["error"].get<std::string>()), std::string::npos)
            << where << ": " << got.status().message() << " vs " << c["error"];
      }
    } else {
      ASSERT_TRUE(got.is_ok()) << where << ": " << got.status().to_string();
      EXPECT_EQ(got.value(), c["text"].get<std::string>()) << where;
    }
    ++n_checked;
  }
  EXPECT_GT(n_checked, 0);
}

TEST_P(GoldenTest, SpecialTokensAndVocabulary) {
  const auto& meta = golden_["meta"];
  EXPECT_EQ(tok_->vocab_size(), meta["len"].get<int32_t>());
  if (meta["bos_token_id"].is_null()) {
    EXPECT_FALSE(tok_->bos_token_id().has_value());
  } else {
    EXPECT_EQ(tok_->bos_token_id(), meta["bos_token_id"].get<int32_t>());
  }
  ASSERT_FALSE(tok_->eos_token_ids().empty());
  EXPECT_EQ(tok_->eos_token_ids().front(), meta["eos_token_id"].get<int32_t>());
  for (const auto& [token, id] : meta["token_to_id"].items()) {
    const auto mine = tok_->token_to_id(token);
    if (id.is_null()) {
      EXPECT_FALSE(mine.has_value()) << token;
    } else if (mine) {
      EXPECT_EQ(*mine, id.get<int32_t>()) << token;
    } else {
      // transformers maps unknown tokens to the unk id.
      EXPECT_EQ(tok_->token_to_id("<unk>"), id.get<int32_t>()) << token;
    }
  }
  for (const auto& id : meta["all_special_ids"]) EXPECT_TRUE(tok_->is_special(id.get<int32_t>()));
}

INSTANTIATE_TEST_SUITE_P(tokenizer, GoldenTest,
                         ::testing::Values("llama2", "llama3", "llama3_1", "qwen3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace litellama
