// IncrementalDetokenizer: for golden id sequences cut into random chunks, every delta is valid
// UTF-8 and the deltas concatenate to Tokenizer::decode of the whole sequence.
#include <random>

#include <gtest/gtest.h>

#include "services/tokenizer/incremental_detokenizer.h"
#include "services/tokenizer/utf8.h"
#include "tests/tokenizer/tokenizer_test_support.h"

namespace litellama {
namespace {

// Streams `ids` in random chunks (sizes 0..max_chunk) and checks the deltas.
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip,
                  std::mt19937& rng, int max_chunk, const std::string& what) {
  IncrementalDetokenizer detok(tok, skip);
  std::string text;
  size_t pos = 0;
  std::uniform_int_distribution<int> chunk(0, max_chunk);
  while (pos < ids.size()) {
    const size_t n = std::min(ids.size() - pos, static_cast<size_t>(chunk(rng)));
    const std::string delta = detok.push(std::span<const int32_t>(ids).subspan(pos, n));
    ASSERT_TRUE(utf8::is_valid(delta)) << what << ": invalid UTF-8 delta at id " << pos;
    text += delta;
    pos += n;
  }
  const std::string tail = detok.finish();
  ASSERT_TRUE(utf8::is_valid(tail)) << what;
  text += tail;
  ASSERT_EQ(text, tok.decode(ids, skip)) << what << " skip=" << skip;
}

class IncrementalDetokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(IncrementalDetokenizerTest, RandomChunkingsOfGoldenSequencesMatchDecode) {
  const Tokenizer* tok = test::shared_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const nlohmann::json golden = test::read_golden(GetParam() + ".json");
  std::mt19937 rng(1234);
  std::vector<std::vector<int32_t>> sequences;
  for (const auto& c : golden["encode"]) sequences.push_back(test::golden_with_special(c));
  for (const auto& c : golden["decode"]) sequences.push_back(c["ids"].get<std::vector<int32_t>>());
  ASSERT_GT(sequences.size(), 100u);
  for (size_t k = 0; k < sequences.size(); ++k) {
    for (const bool skip : {false, true}) {
      for (const int max_chunk : {1, 3, 8}) {
        check_stream(*tok, sequences[k], skip, rng, max_chunk,
                     GetParam() + " sequence " + std::to_string(k));
      }
    }
  }
}

TEST_P(IncrementalDetokenizerTest, RandomIdSoupMatchesDecode) {
  // Ids drawn from the whole vocabulary, biased to the low ids (byte tokens, single bytes of
  // the byte-level alphabet) that split characters.
  const Tokenizer* tok = test::shared_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> any(0, tok->vocab_size() - 1), low(0, 600);
  for (int k = 0; k < 300; ++k) {
    std::vector<int32_t> ids(static_cast<size_t>(1 + k % 40));
    for (auto& id : ids) id = (rng() % 3 == 0) ? any(rng) : low(rng);
    check_stream(*tok, ids, k % 2 == 0, rng, 4, GetParam() + " soup " + std::to_string(k));
  }
}

TEST_P(IncrementalDetokenizerTest, EmojiAndMultiByteCharactersOneIdAtATime) {
  const Tokenizer* tok = test::shared_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  const std::string text = "a😀b 👨‍👩‍👧‍👦 中文 é 𠀀 \xF0\x9F\x8E\x89!";
  const auto ids = tok->encode(text, false);
  IncrementalDetokenizer detok(*tok);
  std::string out;
  for (const int32_t id : ids) {
    const std::string delta = detok.push(std::span<const int32_t>(&id, 1));
    EXPECT_TRUE(utf8::is_valid(delta));
    out += delta;
  }
  out += detok.finish();
  EXPECT_EQ(out, tok->decode(ids));
  EXPECT_EQ(out, text);
}

TEST_P(IncrementalDetokenizerTest, IncompleteCharacterIsHeldBackThenFlushedAsReplacement) {
  const Tokenizer* tok = test::shared_tokenizer(GetParam());
  ASSERT_NE(tok, nullptr);
  // A rare character takes several tokens; stop the sequence in the middle of it, as a model
  // that hits its length limit might.
  const std::string text = "x\xF0\xAA\x9A\xA5";  // x𪚥
  const auto ids = tok->encode(text, false);
  size_t cut = 0;
  for (size_t k = 1; k < ids.size() && cut == 0; ++k) {
    if (tok->decode(std::span<const int32_t>(ids).first(k)).find(utf8::kReplacement) !=
        std::string::npos) {
      cut = k;
    }
  }
  ASSERT_GT(cut, 0u) << "this test needs a character that takes several tokens";
  const auto head = std::span<const int32_t>(ids).first(cut);
  IncrementalDetokenizer detok(*tok);
  const std::string pushed = detok.push(head);
  EXPECT_EQ(pushed.find(utf8::kReplacement), std::string::npos) << "held back, not replaced";
  const std::string tail = detok.finish();
  EXPECT_TRUE(utf8::is_valid(tail));
  EXPECT_NE(tail.find(utf8::kReplacement), std::string::npos);
  EXPECT_EQ(pushed + tail, tok->decode(head));
  // finish() resets: the detokenizer can stream a new sequence.
  std::string again = detok.push(ids);
  again += detok.finish();
  EXPECT_EQ(again, text);
}

INSTANTIATE_TEST_SUITE_P(tokenizer, IncrementalDetokenizerTest,
                         ::testing::Values("llama2", "llama3", "llama3_1", "qwen3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace litellama
