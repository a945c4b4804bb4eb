// `litellama tokenize` and `litellama detokenize` run as a user runs them: ids and texts equal to
// transformers' (the golden files), stdin input, a model directory as well as a tokenizer
// directory, and a clear message with a non-zero exit (never a crash) for every bad input.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/tokenizer/tokenizer_test_support.h"

namespace litellama {
namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int exit_code = -1;
  bool signaled = false;
  std::string out;  // stdout
  std::string err;  // stderr
};

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "litellama-cli-tok-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string sub(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class CliTokenizeTest : public ::testing::Test {
 protected:
  // Runs `litellama ARGS` with `stdin_bytes` on its standard input.
  CommandResult run(const std::string& args, const std::string& stdin_bytes = "") {
    {
      std::ofstream in(tmp_.sub("stdin"), std::ios::binary);
      in << stdin_bytes;
    }
    const char* env = std::getenv("LITELLAMA_BIN_DIR");
    const std::string bin = env && *env ? env : LITELLAMA_TEST_BIN_DIR;
    const std::string cmd = bin + "/litellama " + args + " < " + tmp_.sub("stdin") + " > " +
                            tmp_.sub("stdout") + " 2> " + tmp_.sub("stderr");
    CommandResult r;
    const int status = std::system(cmd.c_str());
    r.signaled = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) >= 128);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(tmp_.sub("stdout"));
    r.err = slurp(tmp_.sub("stderr"));
    return r;
  }
  nlohmann::json run_json(const std::string& args, const std::string& stdin_bytes = "") {
    const CommandResult r = run(args, stdin_bytes);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_TRUE(j.is_object()) << args << " printed: " << r.out;
    return j;
  }
  void expect_error(const std::string& args, const std::string& needle,
                    const std::string& stdin_bytes = "") {
    const CommandResult r = run(args, stdin_bytes);
    EXPECT_FALSE(r.signaled) << args;
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.out;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\nstderr: " << r.err;
  }
  static std::string dir(const std::string& name) { return test::asset_dir(name).string(); }
  // The golden (transformers) ids of corpus text `text` for tokenizer `name`.
  static std::vector<int32_t> golden_ids(const std::string& name, const std::string& text,
                                         bool with_special) {
    const auto corpus = test::read_golden("corpus.json");
    const auto golden = test::read_golden(name + ".json");
    for (const auto& c : golden["encode"]) {
      if (corpus["texts"][c["i"].get<size_t>()] == text) {
        return with_special ? test::golden_with_special(c) : c["ids"].get<std::vector<int32_t>>();
      }
    }
    ADD_FAILURE() << "no golden text '" << text << "'";
    return {};
  }

  TempDir tmp_;
};

TEST_F(CliTokenizeTest, TokenizeTextAsTransformers) {
  const std::string tok = "--tokenizer " + dir("llama3_1");
  const std::string code =
      "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n";
  auto j = run_json("tokenize " + tok + " --text " + quote(code) + " --json");
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), golden_ids("llama3_1", code, false));
  EXPECT_FALSE(j.contains("text"));
  // From stdin, with special tokens added, and with text that spells special tokens.
  const std::string specials = "<|begin_of_text|>Hello<|end_of_text|>";
  j = run_json("tokenize " + tok + " --text - --add-special-tokens --json", specials);
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), golden_ids("llama3_1", specials, true));
  // Llama 2 (SentencePiece-style whitespace) with special tokens: BOS first.
  const std::string ws = "a  b   c    d";
  j = run_json("tokenize --tokenizer " + dir("llama2") + " --text " + quote(ws) +
               " --add-special-tokens --json");
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), golden_ids("llama2", ws, true));
  EXPECT_EQ(j["ids"][0], 1);
}

TEST_F(CliTokenizeTest, TokenizeMessagesRendersTheTemplate) {
  const auto corpus = test::read_golden("corpus.json");
  const auto golden = test::read_golden("llama3_1.json");
  const Tokenizer* tok = test::shared_tokenizer("llama3_1");
  ASSERT_NE(tok, nullptr);
  int n_checked = 0;
  for (const auto& conv : corpus["conversations"]) {
    for (const auto& c : golden["chat"]) {
      if (c["template"] != "own" || c["conversation"] != conv["name"] || c.contains("error") ||
          n_checked >= 2) {
        continue;
      }
      const bool agp = c["add_generation_prompt"].get<bool>();
      const std::string args = "tokenize --tokenizer " + dir("llama3_1") + " --messages-json " +
                               quote(conv["messages"].dump()) +
                               (agp ? " --add-generation-prompt" : "") + " --json";
      const auto j = run_json(args);
      const std::string want = c["text"].get<std::string>();
      EXPECT_EQ(j["text"], want) << args;
      EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), tok->encode(want, false)) << args;
      ++n_checked;
    }
  }
  EXPECT_EQ(n_checked, 2);
  // From stdin, and the human-readable form.
  const std::string msgs = R"([{"role": "user", "content": "Hi there"}])";
  const auto j = run_json("tokenize --tokenizer " + dir("llama3_1") +
                              " --messages-json - --add-generation-prompt --json",
                          msgs);
  const CommandResult r =
      run("tokenize --tokenizer " + dir("llama3_1") + " --messages-json - --add-generation-prompt",
          msgs);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find(j["text"].get<std::string>()), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::to_string(j["ids"].size()) + " tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"<|start_header_id|>\"  (special)"), std::string::npos) << r.out;
}

TEST_F(CliTokenizeTest, DetokenizeAsTransformers) {
  const auto corpus = test::read_golden("corpus.json");
  // Llama 3.1 on two texts, Llama 2 (which loads fast) on five: code, 200 newlines, runs of
  // spaces between and after words, blank lines.
  for (const std::string name : {"llama3_1", "llama2"}) {
    const auto golden = test::read_golden(name + ".json");
    const int n_wanted = name == "llama2" ? 5 : 2;
    int n_checked = 0;
    for (const auto& c : golden["encode"]) {
      const auto ids = test::golden_with_special(c);
      if (ids.empty() || (c["i"].get<size_t>() % 97 != 15) || n_checked >= n_wanted) continue;
      std::string list;
      for (const int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
      const std::string text = corpus["texts"][c["i"].get<size_t>()];
      const std::string want = c.contains("decoded") ? c["decoded"].get<std::string>() : text;
      const std::string want_skip =
          c.contains("decoded_skip") ? c["decoded_skip"].get<std::string>() : text;
      auto j = run_json("detokenize --tokenizer " + dir(name) + " --ids " + list + " --json");
      EXPECT_EQ(j["text"], want) << name << " " << list;
      j = run_json("detokenize --tokenizer " + dir(name) + " --ids - --skip-special-tokens --json",
                   list);
      EXPECT_EQ(j["text"], want_skip) << name << " " << list;
      ++n_checked;
    }
    EXPECT_EQ(n_checked, n_wanted) << name;
  }
  // Plain output, ids separated by spaces.
  const CommandResult r = run("detokenize --tokenizer " + dir("llama2") + " --ids '1 22557 1526'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s> Hello world\n");
}

TEST_F(CliTokenizeTest, RoundTripThroughAPipe) {
  const std::string text = "Grüße, 世界! 😀\n\tindented  twice";
  const CommandResult enc = run(
      "tokenize --tokenizer " + dir("llama3_1") + " --text - --add-special-tokens --json", text);
  ASSERT_EQ(enc.exit_code, 0) << enc.err;
  const auto j = run_json(
      "detokenize --tokenizer " + dir("llama3_1") + " --ids - --skip-special-tokens --json",
      enc.out);
  EXPECT_EQ(j["text"], text);
}

TEST_F(CliTokenizeTest, ModelDirectory) {
  // A model directory: config.json beside the tokenizer files.
  const fs::path model = tmp_.sub("model");
  fs::create_directories(model);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(test::asset_dir("llama2") / f, model / f);
  }
  std::ofstream(model / "config.json") << R"({"architectures": ["LlamaForCausalLM"]})";
  const auto j =
      run_json("tokenize --tokenizer " + model.string() + " --text 'Hello world' --json");
  const auto want = golden_ids("llama2", "Hello world", false);
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), want);
  std::string list;
  for (const int32_t id : want) list += (list.empty() ? "" : ",") + std::to_string(id);
  const auto d =
      run_json("detokenize --tokenizer " + model.string() + " --ids " + list + " --json");
  EXPECT_EQ(d["text"], "Hello world");
}

TEST_F(CliTokenizeTest, BadInputGivesClearErrors) {
  const std::string tok = "--tokenizer " + dir("llama3_1");
  // Unknown or unusable directories.
  expect_error("tokenize --tokenizer /no/such/dir --text hi", "is not a directory");
  expect_error("detokenize --tokenizer /no/such/dir --ids 1", "is not a directory");
  expect_error("tokenize --tokenizer " + tmp_.sub("") + " --text hi", "no tokenizer.json");
  // Ids: not numbers, negative, beyond int32, outside the vocabulary, none.
  expect_error("detokenize " + tok + " --ids 1,x,3", "'x' is not a token id");
  expect_error("detokenize " + tok + " --ids 12abc", "'12abc' is not a token id");
  expect_error("detokenize " + tok + " --ids=-5", "'-5' is not a token id");
  expect_error("detokenize " + tok + " --ids 99999999999", "'99999999999' is not a token id");
  expect_error("detokenize --tokenizer " + dir("llama2") + " --ids 5,32000",
               "token id 32000 is not in the vocabulary (ids 0..31999)");
  expect_error("detokenize " + tok + " --ids 1,,2", "empty element");
  expect_error("detokenize " + tok + " --ids -", "holds no ids", "  \n");
  expect_error("detokenize " + tok + " --ids -", "\"a\" is not a token id", R"(["a"])");
  expect_error("detokenize " + tok + " --ids -", "neither a list", R"({"text": "x"})");
  // Messages: invalid JSON, wrong shapes, no chat template.
  expect_error("tokenize " + tok + " --messages-json '[{\"role\": '", "not valid JSON");
  expect_error("tokenize " + tok + " --messages-json '{\"role\": \"user\"}'",
               "must be a JSON array");
  expect_error("tokenize " + tok + " --messages-json '[{\"role\": \"user\"}]'",
               "message 0 is not an object");
  expect_error("tokenize " + tok + " --messages-json '[{\"role\": \"user\", \"content\": 5}]'",
               "message 0 is not an object");
  expect_error("tokenize " + tok + " --messages-json -", "not valid JSON", "[1, 2");
  expect_error("tokenize --tokenizer " + dir("llama2") +
                   " --messages-json '[{\"role\": \"user\", \"content\": \"hi\"}]'",
               "no chat template");
  // Invalid UTF-8 on stdin (a stray continuation byte, a truncated character).
  expect_error("tokenize " + tok + " --text -", "not valid UTF-8 (byte offset 3)",
               std::string("abc\x80"
                           "def"));
  expect_error("tokenize " + tok + " --text -", "not valid UTF-8 (byte offset 2)",
               std::string("ok\xE4\xB8"));
  expect_error("tokenize " + tok + " --messages-json -", "not valid UTF-8",
               std::string("[{\"role\": \"user\", \"content\": \"\xFF\"}]"));
  // Flag combinations.
  expect_error("tokenize " + tok, "exactly one of --text and --messages-json");
  expect_error("tokenize " + tok + " --text a --messages-json '[]'", "exactly one of");
  expect_error("tokenize " + tok + " --text a --add-generation-prompt", "needs --messages-json");
}

TEST_F(CliTokenizeTest, HelpSaysWhenSpecialTokensAreAdded) {
  const CommandResult r = run("tokenize --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--add-special-tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Special tokens (BOS/EOS) are added only with"), std::string::npos) << r.out;
  const CommandResult d = run("detokenize --help");
  EXPECT_NE(d.out.find("--skip-special-tokens"), std::string::npos) << d.out;
}

}  // namespace
}  // namespace litellama
