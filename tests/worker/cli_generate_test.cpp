// `litellama generate` and `make-model` as a user runs them: JSON output, and a clear message
// with a non-zero exit (never a crash) for every bad input.
#include <cstdio>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/worker/test_util.h"

namespace litellama {
namespace {

using test::CommandResult;

CommandResult run(const std::string& args) {
  return test::run_litellama(args);
}

class CliGenerateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tmp_ = new test::TempDir();
    made_ = run("make-model --preset llama3-untied-tiny --seed 11 --no-tokenizer --out " + model());
  }
  // A failed suite set-up fails every test (gtest would otherwise report them as skipped).
  void SetUp() override {
    ASSERT_EQ(made_.exit_code, 0) << "make-model failed (programs in '" << test::bin_dir()
                                  << "'): " << made_.output;
  }
  static void TearDownTestSuite() { delete tmp_; }
  static std::string model() { return tmp_->sub("model"); }

  void expect_error(const std::string& args, const std::string& needle) {
    const auto r = run(args);
    EXPECT_FALSE(r.signaled) << args;
    EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\noutput: " << r.output;
  }

  static test::TempDir* tmp_;
  static CommandResult made_;
};
test::TempDir* CliGenerateTest::tmp_ = nullptr;
CommandResult CliGenerateTest::made_;

TEST_F(CliGenerateTest, JsonOutput) {
  const auto r = run("generate --model " + model() +
                     " --input-ids 1,2,3 --max-new-tokens 5 --temperature 0 --top-logits 4 "
                     "--ignore-eos --json --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  ASSERT_TRUE(j.contains("output_ids"));
  EXPECT_EQ(j["output_ids"].size(), 5u);
  EXPECT_EQ(j["finish_reason"], "length");
  ASSERT_EQ(j["top_logits"].size(), 4u);
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_GE(j["top_logits"][i - 1][1].get<double>(), j["top_logits"][i][1].get<double>());
  }
  // Greedy: the first generated id is the largest logit.
  EXPECT_EQ(j["output_ids"][0], j["top_logits"][0][0]);
}

TEST_F(CliGenerateTest, StopTokenEndsGeneration) {
  const auto first = run("generate --model " + model() +
                         " --input-ids 1,2,3 --max-new-tokens 3 --ignore-eos --json");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto j = nlohmann::json::parse(first.output.substr(first.output.find('{')));
  const int second_id = j["output_ids"][1];
  const auto stopped = run("generate --model " + model() +
                           " --input-ids 1,2,3 --max-new-tokens 10 --ignore-eos --json "
                           "--stop-token-ids " +
                           std::to_string(second_id));
  auto k = nlohmann::json::parse(stopped.output.substr(stopped.output.find('{')));
  EXPECT_EQ(k["finish_reason"], "stop");
  EXPECT_EQ(k["output_ids"].size(), 2u);
}

TEST_F(CliGenerateTest, PromptTextThroughTheModelsTokenizer) {
  const std::string tok = test::source_dir() + "/assets/tokenizers/llama3_1";
  ASSERT_TRUE(std::filesystem::exists(tok + "/tokenizer.json"))
      << "tokenizer assets missing: run scripts/fetch-assets.sh";
  const std::string dir = tmp_->sub("with-tokenizer");
  auto made = run("make-model --preset llama3-untied-tiny --seed 11 --out " + dir +
                  " --tokenizer-dir " + tok);
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const auto r = run("generate --model " + dir +
                     " --prompt 'Hello, world' --max-new-tokens 4 --ignore-eos --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(j["output_ids"].size(), 4u);
  // <|begin_of_text|> Hello , world
  EXPECT_EQ(j["n_prompt_tokens"], 4);
  EXPECT_TRUE(j.contains("text"));
  // The same ids given directly produce the same output.
  const auto ids = run("generate --model " + dir +
                       " --input-ids 128000,9906,11,1917 --max-new-tokens 4 --ignore-eos --json");
  auto k = nlohmann::json::parse(ids.output.substr(ids.output.find('{')));
  EXPECT_EQ(j["output_ids"], k["output_ids"]);

  const auto chat = run("generate --model " + dir +
                        " --prompt 'Hi' --chat --max-new-tokens 2 --ignore-eos --json");
  ASSERT_EQ(chat.exit_code, 0) << chat.output;
  auto c = nlohmann::json::parse(chat.output.substr(chat.output.find('{')));
  EXPECT_GT(c["n_prompt_tokens"].get<int>(), 10);  // header tokens of the chat template
}

TEST_F(CliGenerateTest, BadInputGetsAClearError) {
  expect_error("generate --model " + model() + " --prompt hi",
               "--prompt needs tokenizer.json in the model directory");
  expect_error("generate --model " + model() + " --input-ids 1,x,3", "'x' is not a token id");
  expect_error("generate --model " + model() + " --input-ids 1,,3", "empty element");
  expect_error("generate --model " + model() + " --input-ids 99999999", "outside the vocabulary");
  expect_error("generate --model " + model() + " --input-ids 1 --prompt hi",
               "exactly one of --input-ids and --prompt");
  expect_error("generate --model " + model(), "exactly one of --input-ids and --prompt");
  expect_error("generate --model /nonexistent/dir --input-ids 1", "does not exist");
  expect_error("generate --model " + model() + " --input-ids 1 --device tpu",
               "unknown --device 'tpu'");
  expect_error("generate --model " + model() + " --input-ids 1 --dtype bfloat16",
               "computes in float32");
  expect_error("generate --model " + model() + " --input-ids 1 --dtype int4",
               "unknown dtype 'int4'");
  expect_error("generate --model " + model() + " --input-ids 1 --max-new-tokens 0",
               "max-new-tokens");
  expect_error("generate --model " + model() + " --input-ids 1 --temperature -1", "temperature");
  expect_error("generate --model " + model() + " --input-ids 1 --prompt ''", "--prompt is empty");
  expect_error("make-model --preset nope --out " + tmp_->sub("x"), "no model preset 'nope'");
  expect_error("frobnicate", "unknown command 'frobnicate'");
}

}  // namespace
}  // namespace litellama
