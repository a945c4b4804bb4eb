// The hand-written split matchers (PatternSplitter) against PCRE2 running the same patterns: the
// same matches on the golden corpus, on random Unicode text and on long or adversarial runs.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <utf8proc.h>

#include "services/tokenizer/unicode_regex.h"
#include "services/tokenizer/utf8.h"
#include "tests/tokenizer/tokenizer_test_support.h"

namespace litellama {
namespace {

using test::escaped;

struct NamedPattern {
  const char* name;
  const char* pattern;
};

const NamedPattern kPatterns[] = {
    {"cl100k",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
    {"qwen2",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
    {"gpt2", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
};

using Matches = std::vector<std::pair<size_t, size_t>>;

// Code points that utf8proc's Unicode tables assign and PCRE2's older ones do not (Debian 12:
// Unicode 15.0 against 14.0, e.g. CJK Extension H, Kawi). The hand-written matchers class them
// by utf8proc, as Oniguruma 6.9.8 (Unicode 15.0, in tokenizers 0.23) does; PCRE2 sees them as
// unassigned. The comparisons leave them out.
bool newer_than_pcre2(char32_t c) {
  static const UnicodeRegex unassigned =
      std::move(UnicodeRegex::compile(R"(\p{Cn})", UnicodeRegex::Engine::kPcre2)).value();
  if (utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_CN) return false;
  std::string s;
  utf8::append(s, c);
  bool cn = false;
  unassigned.for_each_match(s, [&](size_t, size_t) { cn = true; });
  return cn;
}

Matches matches(const UnicodeRegex& re, std::string_view text) {
  Matches out;
  re.for_each_match(text, [&](size_t b, size_t e) { out.emplace_back(b, e); });
  return out;
}

class PatternSplitterTest : public ::testing::TestWithParam<NamedPattern> {
 protected:
  void SetUp() override {
    auto fast = UnicodeRegex::compile(GetParam().pattern);
    auto pcre = UnicodeRegex::compile(GetParam().pattern, UnicodeRegex::Engine::kPcre2);
    ASSERT_TRUE(fast.is_ok()) << fast.status().to_string();
    ASSERT_TRUE(pcre.is_ok()) << pcre.status().to_string();
    ASSERT_TRUE(fast->hand_written()) << "the pattern is not recognized: " << GetParam().pattern;
    ASSERT_FALSE(pcre->hand_written());
    fast_ = std::move(*fast);
    pcre_ = std::move(*pcre);
  }
  // Returns false (after one failure message) when the two engines disagree on `text`.
  bool same(std::string_view text, const std::string& what) {
    const Matches a = matches(fast_, text), b = matches(pcre_, text);
    if (a == b) return true;
    size_t k = 0;
    while (k < a.size() && k < b.size() && a[k] == b[k]) ++k;
    auto show = [&](const Matches& m) {
      if (k >= m.size()) return std::string("(none)");
      return "'" + escaped(std::string(text.substr(m[k].first, m[k].second - m[k].first))) +
             "' at " + std::to_string(m[k].first);
    };
    ADD_FAILURE() << what << ": match " << k << " differs in '"
                  << escaped(std::string(text.substr(0, std::min<size_t>(text.size(), 200))))
                  << "'\n  hand-written " << show(a) << "\n  PCRE2        " << show(b);
    return false;
  }
  UnicodeRegex fast_, pcre_;
};

TEST_P(PatternSplitterTest, GoldenCorpus) {
  const auto corpus = test::read_golden("corpus.json");
  ASSERT_TRUE(corpus.contains("texts"));
  int n_bad = 0;
  for (const auto& t : corpus["texts"]) {
    const std::string text = utf8::lossy(t.get<std::string>());
    if (!same(text, "golden text") && ++n_bad >= 5) break;
  }
  EXPECT_EQ(n_bad, 0);
}

// Code points the patterns treat differently: ASCII classes, the contraction letters, every
// White_Space character, newlines, letters and digits of other scripts, marks, symbols, emoji.
std::vector<char32_t> interesting_code_points() {
  std::vector<char32_t> v;
  for (char32_t c = 0x01; c < 0x80; ++c) v.push_back(c);
  for (const char32_t c : {0x85,   0xA0,   0x1680, 0x2000, 0x2005, 0x200A, 0x2028, 0x2029, 0x202F,
                           0x205F, 0x3000, 0x200B, 0x200D, 0xFEFF, 0x17F,  0x212A, 0x130,  0x131,
                           0xDF,   0x1E9E, 0xFB05, 0xFB06, 0x2019, 0xB4,   0x60}) {
    v.push_back(c);
  }
  for (const char32_t c :
       {0xE9,    0x301,   0x308,  0x4E2D, 0x6587, 0x3042,  0x30A2,  0xAC00,  0x627,
        0x661,   0x966,   0x96F,  0xE01,  0xE31,  0x5D0,   0x416,   0x3B1,   0x2160,
        0xBD,    0xB2,    0x2460, 0xFF10, 0xFF41, 0x1F600, 0x1F3FD, 0x1F1FA, 0x20000,
        0x1D7CE, 0x10400, 0xE000, 0xFFFD, 0x2581, 0x120,   0x10A}) {
    v.push_back(c);
  }
  return v;
}

char32_t random_scalar(std::mt19937& rng) {
  std::uniform_int_distribution<uint32_t> any(1, 0x10FFFF);
  for (;;) {
    const char32_t c = any(rng);
    if (c < 0xD800 || c > 0xDFFF) return c;
  }
}

TEST_P(PatternSplitterTest, RandomText) {
  std::mt19937 rng(1234);
  const auto pool = interesting_code_points();
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  std::uniform_int_distribution<int> kind(0, 9), len(1, 60);
  int n_bad = 0;
  for (int iter = 0; iter < 20000 && n_bad < 5; ++iter) {
    std::string text;
    const int n = len(rng);
    for (int i = 0; i < n; ++i) {
      const int k = kind(rng);
      char32_t c;
      if (k < 6) {
        c = pool[pick(rng)];
      } else if (k < 8) {
        c = " \n\r\t'sSlLeEdD"[std::uniform_int_distribution<int>(0, 13)(rng)];
      } else if (k < 9) {
        c = static_cast<char32_t>(std::uniform_int_distribution<int>(0x80, 0x3000)(rng));
      } else {
        c = random_scalar(rng);
      }
      if (c == 0) c = ' ';
      while (newer_than_pcre2(c)) c = random_scalar(rng);
      utf8::append(text, c);
    }
    if (!same(text, "random text " + std::to_string(iter))) ++n_bad;
  }
  EXPECT_EQ(n_bad, 0);
}

// Every code point of the BMP and a sample of the other planes, each between letters, digits,
// spaces and punctuation: the character classes must agree with PCRE2's.
TEST_P(PatternSplitterTest, EveryCodePointInContext) {
  int n_bad = 0, n_checked = 0, n_newer = 0;
  auto check = [&](char32_t c) {
    if (n_bad >= 5) return;
    if (newer_than_pcre2(c)) {
      ++n_newer;
      return;
    }
    ++n_checked;
    for (const char* ctx : {"a%sb", " %s1", "'%s ", "1%s.", "  %s\n", "x%s%s'"}) {
      std::string s;
      for (const char* p = ctx; *p; ++p) {
        if (p[0] == '%' && p[1] == 's') {
          utf8::append(s, c);
          ++p;
        } else {
          s += *p;
        }
      }
      if (!same(s, "code point " + std::to_string(static_cast<uint32_t>(c)))) {
        ++n_bad;
        return;
      }
    }
  };
  for (char32_t c = 1; c < 0x10000; ++c) {
    if (c < 0xD800 || c > 0xDFFF) check(c);
  }
  for (char32_t c = 0x10000; c <= 0x10FFFF; c += 97) check(c);
  EXPECT_EQ(n_bad, 0);
  // Nearly all of them are compared (the newer assignments are a few thousand code points).
  EXPECT_GT(n_checked, 70000);
  std::printf("%d code points compared, %d left out (newer than PCRE2's Unicode tables)\n",
              n_checked, n_newer);
}

TEST_P(PatternSplitterTest, LongAndAdversarialRuns) {
  std::vector<std::string> texts;
  texts.push_back(std::string(100000, ' '));
  texts.push_back(std::string(100000, ' ') + "x");
  texts.push_back(std::string(50000, '\n') + " " + std::string(50000, '\t'));
  std::string s;
  for (int i = 0; i < 20000; ++i) s += " \n";
  texts.push_back(s + "x");
  texts.push_back(std::string(30000, '\'') + "s");
  s.clear();
  for (int i = 0; i < 10000; ++i) s += "'ll'S'ſ'r";
  texts.push_back(s);
  texts.push_back(std::string(100000, '7'));
  texts.push_back(std::string(100000, 'a'));
  texts.push_back(std::string(60000, '!') + "\r\n\r\n");
  s.clear();
  for (int i = 0; i < 10000; ++i) s += "\xC2\xA0 \xE3\x80\x80\r";
  texts.push_back(s);
  s.clear();
  for (int i = 0; i < 20000; ++i) s += "\xF0\x9F\x98\x80 1a";
  texts.push_back(s);
  for (const auto& t : texts) EXPECT_TRUE(same(t, "long run of " + std::to_string(t.size())));
}

INSTANTIATE_TEST_SUITE_P(Patterns, PatternSplitterTest, ::testing::ValuesIn(kPatterns),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace litellama
