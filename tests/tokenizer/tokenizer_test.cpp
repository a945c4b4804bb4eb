// Tokenizer: loading errors, invalid UTF-8, long inputs, concurrency and the API details that the
// golden files do not cover.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "services/tokenizer/tokenizer.h"
#include "services/tokenizer/utf8.h"
#include "tests/tokenizer/tokenizer_test_support.h"

namespace litellama {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("litellama_tokenizer_test_" + std::to_string(::getpid()) + "_" + std::to_string(n_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }
  std::string str() const { return path_.string(); }

 private:
  static inline int n_ = 0;
  fs::path path_;
};

constexpr const char* kTinyTokenizer = R"({
  "added_tokens": [{"id": 5, "content": "<eos>", "special": true, "normalized": false,
                    "lstrip": false, "rstrip": false, "single_word": false}],
  "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4},
            "merges": ["a b", "ab c"]}
})";

void expect_load_error(const std::string& dir, StatusCode code, const std::string& needle) {
  auto tok = Tokenizer::load(dir);
  ASSERT_FALSE(tok.is_ok()) << dir;
  EXPECT_EQ(tok.status().code(), code) << tok.status().to_string();
  EXPECT_NE(tok.status().message().find(needle), std::string::npos)
      << "'" << tok.status().message() << "' lacks '" << needle << "'";
}

// Expects loading a directory whose tokenizer.json holds `text` to fail with `code` and `needle`.
void expect_tokenizer_json_error(const std::string& text, StatusCode code,
                                 const std::string& needle) {
  TempDir dir;
  dir.write("tokenizer.json", text);
  expect_load_error(dir.str(), code, needle);
}

// Instantiated under the "tokenizer" prefix like the other suites of this binary, so that
// `ctest -R tokenizer` selects every test; the single parameter only names the instance.
class TokenizerLoadTest : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerLoadTest, MissingDirectory) {
  expect_load_error("/nonexistent/tokenizer/dir", StatusCode::kNotFound,
                    "no tokenizer.json in '/nonexistent/tokenizer/dir'");
}

TEST_P(TokenizerLoadTest, MissingTokenizerJson) {
  TempDir dir;
  dir.write("tokenizer_config.json", "{}");
  expect_load_error(dir.str(), StatusCode::kNotFound, "no tokenizer.json in");
}

TEST_P(TokenizerLoadTest, BadJson) {
  expect_tokenizer_json_error("{\"model\": {\"type\": \"BPE\", ", StatusCode::kInvalidArgument,
                              "tokenizer.json' is not valid JSON");
}

TEST_P(TokenizerLoadTest, JsonThatIsNotAnObject) {
  expect_tokenizer_json_error("[1, 2, 3]", StatusCode::kInvalidArgument,
                              "does not hold a JSON object");
}

TEST_P(TokenizerLoadTest, BadConfigJson) {
  TempDir dir;
  dir.write("tokenizer.json", kTinyTokenizer);
  dir.write("tokenizer_config.json", "{not json");
  expect_load_error(dir.str(), StatusCode::kInvalidArgument,
                    "tokenizer_config.json' is not valid JSON");
}

TEST_P(TokenizerLoadTest, UnsupportedModelType) {
  expect_tokenizer_json_error(R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})",
                              StatusCode::kUnsupported,
                              "unsupported tokenizer model type 'Unigram'");
}

TEST_P(TokenizerLoadTest, MissingModel) {
  expect_tokenizer_json_error(R"({"normalizer": null})", StatusCode::kInvalidArgument,
                              "has no \"model\" object");
}

TEST_P(TokenizerLoadTest, UnsupportedPipelineParts) {
  const std::tuple<const char*, const char*, const char*> cases[] = {
      {"normalizer", "BertNormalizer", "unsupported normalizer type 'BertNormalizer'"},
      {"pre_tokenizer", "Whitespace", "unsupported pre_tokenizer type 'Whitespace'"},
      {"decoder", "WordPiece", "unsupported decoder type 'WordPiece'"},
      {"post_processor", "Weird", "unsupported post_processor type 'Weird'"},
  };
  for (const auto& [field, type, needle] : cases) {
    TempDir dir;
    nlohmann::json json = nlohmann::json::parse(kTinyTokenizer);
    json[field] = {{"type", type}};
    dir.write("tokenizer.json", json.dump());
    expect_load_error(dir.str(), StatusCode::kUnsupported, needle);
  }
}

TEST_P(TokenizerLoadTest, MergeOutsideVocabulary) {
  TempDir dir;
  dir.write("tokenizer.json",
            R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a z"]}})");
  expect_load_error(dir.str(), StatusCode::kInvalidArgument, "merge 'a z' uses a token outside");
}

TEST_P(TokenizerLoadTest, TinyTokenizerWithoutConfig) {
  TempDir dir;
  dir.write("tokenizer.json", kTinyTokenizer);
  auto tok = Tokenizer::load(dir.str());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->encode("abcab<eos>c"), (std::vector<int32_t>{4, 2, 5, 3}));
  EXPECT_EQ(tok->vocab_size(), 6);
  EXPECT_FALSE(tok->bos_token_id().has_value());
  EXPECT_TRUE(tok->is_special(5));
  EXPECT_FALSE(tok->is_special(4));
  // Without a decoder, Hugging Face joins the tokens with spaces.
  const std::vector<int32_t> ids{4, 2, 5};
  EXPECT_EQ(tok->decode(ids), "abc ab <eos>");
  EXPECT_EQ(tok->decode(ids, true), "abc ab");
  auto chat = tok->apply_chat_template({{"user", "hi"}});
  ASSERT_FALSE(chat.is_ok());
  EXPECT_EQ(chat.status().code(), StatusCode::kNotFound);
}

TEST_P(TokenizerLoadTest, BrokenChatTemplateFailsWhenUsedNotAtLoad) {
  TempDir dir;
  dir.write("tokenizer.json", kTinyTokenizer);
  dir.write("tokenizer_config.json",
            R"({"chat_template": "{% macro m() %}{% endmacro %}", "eos_token": "<eos>"})");
  auto tok = Tokenizer::load(dir.str());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->eos_token_ids(), std::vector<int32_t>{5});
  auto chat = tok->apply_chat_template({{"user", "hi"}});
  ASSERT_FALSE(chat.is_ok());
  EXPECT_EQ(chat.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(chat.status().message().find("macro"), std::string::npos);
}

// A template of the form llava-hf's LLaVA-1.5 checkpoints publish in chat_template.json: it reads
// each message's content as typed parts, images first, then text.
constexpr const char* kPartsTemplate =
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ "
    "message['role'].upper() + ': '}}{% endif %}{% for content in message['content'] | "
    "selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}{% endfor %}{% for content in "
    "message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% "
    "endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";

TEST_P(TokenizerLoadTest, ProcessorChatTemplateJsonReadsTypedContentParts) {
  TempDir dir;
  dir.write("tokenizer.json", kTinyTokenizer);
  dir.write("chat_template.json", std::string(R"({"chat_template": ")") + kPartsTemplate + "\"}");
  auto tok = Tokenizer::load(dir.str());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  // A plain string is one text part: the template would render a string as nothing.
  auto plain = tok->apply_chat_template({{"user", "hi"}, {"assistant", "yes"}, {"user", "and?"}});
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  EXPECT_EQ(*plain, "USER: hi ASSISTANT: yes USER: and? ASSISTANT:");
  Tokenizer::ChatMessage with_image;
  with_image.role = "user";
  with_image.content = "What is it?<image>";
  with_image.parts = {{"text", "What is it?"}, {"image", ""}};
  auto parts = tok->apply_chat_template({with_image});
  ASSERT_TRUE(parts.is_ok()) << parts.status().to_string();
  EXPECT_EQ(*parts, "USER: <image>\nWhat is it? ASSISTANT:");
  // The same message through a template that reads strings: the content string.
  auto string_template = tok->apply_chat_template(
      "{% for m in messages %}[{{ m['content'] }}]{% endfor %}", {with_image}, false);
  ASSERT_TRUE(string_template.is_ok()) << string_template.status().to_string();
  EXPECT_EQ(*string_template, "[What is it?<image>]");
}

TEST_P(TokenizerLoadTest, TokenizerConfigTemplateWinsAndABrokenProcessorTemplateIsAnError) {
  TempDir dir;
  dir.write("tokenizer.json", kTinyTokenizer);
  dir.write("tokenizer_config.json", R"({"chat_template": "{{ messages[0]['content'] }}"})");
  dir.write("chat_template.json", std::string(R"({"chat_template": ")") + kPartsTemplate + "\"}");
  auto tok = Tokenizer::load(dir.str());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  auto chat = tok->apply_chat_template({{"user", "hi"}});
  ASSERT_TRUE(chat.is_ok());
  EXPECT_EQ(*chat, "hi");
  TempDir broken;
  broken.write("tokenizer.json", kTinyTokenizer);
  broken.write("chat_template.json", R"({"template": 3})");
  expect_load_error(broken.str(), StatusCode::kInvalidArgument, "chat_template.json");
}

INSTANTIATE_TEST_SUITE_P(tokenizer, TokenizerLoadTest, ::testing::Values("files"),
                         [](const auto& info) { return std::string(info.param); });

class TokenizerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tok_ = test::shared_tokenizer(GetParam());
    ASSERT_NE(tok_, nullptr);
  }
  const Tokenizer* tok_ = nullptr;
};

TEST_P(TokenizerTest, InvalidUtf8IsReplacedNotRejected) {
  // Documented behaviour: each maximal ill-formed subsequence becomes U+FFFD, then the text is
  // encoded as usual.
  const std::pair<std::string, std::string> cases[] = {
      {"abc\xFF"
       "def",
       "abc\xEF\xBF\xBD"
       "def"},
      {"\xC3", "\xEF\xBF\xBD"},
      {"x\xE4\xB8y", "x\xEF\xBF\xBDy"},
      {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},  // a UTF-16 surrogate
      {"\xC0\x80 overlong", "\xEF\xBF\xBD\xEF\xBF\xBD overlong"},
      {"\xF0\x9F\x98", "\xEF\xBF\xBD"},
      {std::string("nul\0byte", 8), std::string("nul\0byte", 8)},
  };
  for (const auto& [bad, replaced] : cases) {
    EXPECT_EQ(tok_->encode(bad), tok_->encode(replaced)) << test::escaped(bad);
    EXPECT_EQ(tok_->decode(tok_->encode(bad, false)), tok_->decode(tok_->encode(replaced, false)));
  }
}

TEST_P(TokenizerTest, RandomBytesNeverCrashAndDecodeToValidUtf8) {
  std::mt19937 rng(7);
  for (int k = 0; k < 200; ++k) {
    std::string s(static_cast<size_t>(rng() % 64), '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    const auto ids = tok_->encode(s, k % 2 == 0);
    const std::string text = tok_->decode(ids, k % 3 == 0);
    EXPECT_TRUE(utf8::is_valid(text));
  }
}

// What decode(encode(text)) gives back. Byte-level tokenizers round-trip exactly; the
// SentencePiece-style one (llama2) drops one leading space, as transformers does (its decoder
// strips the space that the Metaspace pre-tokenizer adds, and a text that already starts with a
// space gets none added).
std::string round_trip_of(const std::string& name, const std::string& text) {
  if (name == "llama2" && !text.empty() && text[0] == ' ') return text.substr(1);
  return text;
}

TEST_P(TokenizerTest, RoundTripOfValidText) {
  for (const char* text : {"Hello world", "日本語 😀 مرحبا", "  a\tb\r\nc  ", "x<|im_end|>y"}) {
    EXPECT_EQ(tok_->decode(tok_->encode(text, false)), round_trip_of(GetParam(), text)) << text;
  }
}

TEST_P(TokenizerTest, OutOfRangeIdsAreSkippedByDecode) {
  const auto ids = tok_->encode("hi", false);
  std::vector<int32_t> with_bad = ids;
  with_bad.insert(with_bad.begin(), -1);
  with_bad.push_back(tok_->vocab_size() + 10);
  EXPECT_EQ(tok_->decode(with_bad), tok_->decode(ids));
}

TEST_P(TokenizerTest, LongInputsAreLinear) {
  // 1 MB of one repeated character, one long whitespace run, repeated emoji and a long mixed
  // text: each must encode in well under the time a quadratic algorithm would need.
  std::string mixed;
  while (mixed.size() < (1 << 20)) mixed += "The quick brown fox, 42 times! 中文 😀\n\t";
  const std::pair<const char*, std::string> inputs[] = {
      {"a*1M", std::string(1 << 20, 'a')},
      {"space*1M", std::string(1 << 20, ' ')},
      {"newline*256k", std::string(1 << 18, '\n')},
      {"emoji*64k",
       [] {
         std::string s;
         for (int i = 0; i < (1 << 16); ++i) s += "😀";
         return s;
       }()},
      {"mixed 1M", mixed},
  };
  for (const auto& [name, text] : inputs) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok_->encode(text, false);
    const std::string back = tok_->decode(ids);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_FALSE(ids.empty()) << name;
    EXPECT_TRUE(back == round_trip_of(GetParam(), text)) << name << " does not round-trip";
    EXPECT_LT(seconds, 10.0) << name << " took " << seconds << " s";
  }
}

TEST_P(TokenizerTest, ConcurrentEncodesAgree) {
  const std::string text = "Concurrent encoding, with a shared word cache: 中文, émoji 😀, 12345.";
  const auto want = tok_->encode(text);
  std::vector<std::thread> threads;
  std::atomic<int> n_bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 200; ++k) {
        if (tok_->encode(text + std::to_string(t * 1000 + k)).size() < want.size()) ++n_bad;
        if (tok_->encode(text) != want) ++n_bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(n_bad.load(), 0);
}

TEST_P(TokenizerTest, EosIdsIncludeEndOfTurnTokens) {
  const auto eos = tok_->eos_token_ids();
  ASSERT_FALSE(eos.empty());
  for (const int32_t id : eos) EXPECT_TRUE(tok_->is_special(id)) << id;
  auto has = [&](const char* token) {
    const auto id = tok_->token_to_id(token);
    return id && std::find(eos.begin(), eos.end(), *id) != eos.end();
  };
  if (GetParam() == "llama3" || GetParam() == "llama3_1") {
    EXPECT_TRUE(has("<|eot_id|>"));
    EXPECT_TRUE(has("<|end_of_text|>"));
  } else if (GetParam() == "qwen3") {
    EXPECT_TRUE(has("<|im_end|>"));
    EXPECT_TRUE(has("<|endoftext|>"));
  } else {
    EXPECT_TRUE(has("</s>"));
  }
}

TEST_P(TokenizerTest, IdToTokenAndBack) {
  for (const int32_t id : tok_->encode("Hello <|im_start|> world ▁", false)) {
    const std::string_view token = tok_->id_to_token(id);
    ASSERT_FALSE(token.empty()) << id;
    EXPECT_EQ(tok_->token_to_id(token), id);
  }
  EXPECT_TRUE(tok_->id_to_token(-5).empty());
}

INSTANTIATE_TEST_SUITE_P(tokenizer, TokenizerTest,
                         ::testing::Values("llama2", "llama3", "llama3_1", "qwen3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace litellama

namespace litellama {
namespace {

// token_bytes: the bytes an id stands for alone (logprobs' token bytes): a byte-level token's
// bytes (a lone byte of a multi-byte character included), a byte-fallback token's one byte, a
// Metaspace token with its leading space kept, a special token's content.
TEST(TokenizerTokenBytes, ByteLevelByteFallbackAndMetaspace) {
  const Tokenizer* llama3 = test::shared_tokenizer("llama3");
  ASSERT_NE(llama3, nullptr);
  const auto hello = llama3->token_to_id("\u0120hello");  // "Ġhello"
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(llama3->token_bytes(*hello), " hello");
  const auto lone = llama3->token_to_id("\u00c3");  // byte 0xC3, the first of "é"
  ASSERT_TRUE(lone.has_value());
  EXPECT_EQ(llama3->token_bytes(*lone), "\xc3");
  const auto eot = llama3->token_to_id("<|eot_id|>");
  ASSERT_TRUE(eot.has_value());
  EXPECT_EQ(llama3->token_bytes(*eot), "<|eot_id|>");
  EXPECT_EQ(llama3->token_bytes(-1), "");

  const Tokenizer* llama2 = test::shared_tokenizer("llama2");
  ASSERT_NE(llama2, nullptr);
  const auto byte = llama2->token_to_id("<0xC3>");
  ASSERT_TRUE(byte.has_value());
  EXPECT_EQ(llama2->token_bytes(*byte), "\xc3");
  const auto word = llama2->token_to_id("\u2581the");  // "▁the"
  ASSERT_TRUE(word.has_value());
  EXPECT_EQ(llama2->token_bytes(*word), " the");
}

}  // namespace
}  // namespace litellama
