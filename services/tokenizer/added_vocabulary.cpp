#include "services/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <cstring>

#include "services/tokenizer/utf8.h"

namespace litellama {
namespace {

bool is_word_char(char32_t cp) {
  return cp == '_' || (cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') ||
         (cp >= 'A' && cp <= 'Z') || cp >= 0x80;
}

// The code point that ends just before `pos` (pos > 0).
char32_t cp_before(std::string_view s, size_t pos) {
  size_t b = pos - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  return utf8::next(s.substr(b, pos - b)).cp;
}

}  // namespace

void AddedVocabulary::Trie::insert(std::string_view s, int32_t token) {
  if (!s.empty()) {
    const auto b = static_cast<unsigned char>(s[0]);
    if (nodes[0].next.empty()) {
      only_first_byte = b;
    } else if (only_first_byte != b) {
      only_first_byte = -1;
    }
    first_byte[b] = true;
  }
  int32_t n = 0;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    auto& next = nodes[static_cast<size_t>(n)].next;
    auto it = std::find_if(next.begin(), next.end(), [c](const auto& e) { return e.first == c; });
    if (it != next.end()) {
      n = it->second;
    } else {
      const auto child = static_cast<int32_t>(nodes.size());
      nodes[static_cast<size_t>(n)].next.emplace_back(c, child);
      nodes.emplace_back();
      n = child;
    }
  }
  nodes[static_cast<size_t>(n)].token = token;
}

std::optional<std::pair<size_t, int32_t>> AddedVocabulary::Trie::longest(std::string_view text,
                                                                         size_t pos) const {
  std::optional<std::pair<size_t, int32_t>> best;
  int32_t n = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const auto& next = nodes[static_cast<size_t>(n)].next;
    auto it = std::find_if(next.begin(), next.end(), [c](const auto& e) { return e.first == c; });
    if (it == next.end()) break;
    n = it->second;
    if (nodes[static_cast<size_t>(n)].token >= 0) {
      best = std::make_pair(i + 1 - pos, nodes[static_cast<size_t>(n)].token);
    }
  }
  return best;
}

void AddedVocabulary::add(AddedToken token) {
  auto it = by_id_.find(token.id);
  if (it != by_id_.end()) {
    tokens_[it->second] = std::move(token);
    return;
  }
  by_id_.emplace(token.id, tokens_.size());
  tokens_.push_back(std::move(token));
}

void AddedVocabulary::build() {
  raw_trie_ = Trie{};
  normalized_trie_ = Trie{};
  has_normalized_ = false;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    if (t.content.empty()) continue;
    // Special tokens are always matched on the raw text.
    if (t.normalized && !t.special) {
      normalized_trie_.insert(t.content, static_cast<int32_t>(i));
      has_normalized_ = true;
    } else {
      raw_trie_.insert(t.content, static_cast<int32_t>(i));
    }
  }
}

void AddedVocabulary::split(std::string_view text, bool normalized,
                            std::vector<Segment>& out) const {
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  size_t gap_begin = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<unsigned char>(text[pos])]) {
      // Most vocabularies' added tokens all start with one byte ('<'): jump to the next one.
      if (trie.nodes[0].next.empty()) {
        pos = text.size();
      } else if (trie.only_first_byte >= 0) {
        const void* hit = std::memchr(text.data() + pos, trie.only_first_byte, text.size() - pos);
        pos = hit ? static_cast<size_t>(static_cast<const char*>(hit) - text.data()) : text.size();
      } else {
        ++pos;
      }
      continue;
    }
    auto match = trie.longest(text, pos);
    if (!match) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[static_cast<size_t>(match->second)];
    size_t begin = pos, end = pos + match->first;
    if (tok.single_word) {
      const bool left_ok = begin == 0 || !is_word_char(cp_before(text, begin));
      const bool right_ok = end >= text.size() || !is_word_char(utf8::next(text.substr(end)).cp);
      if (!left_ok || !right_ok) {
        ++pos;
        continue;
      }
    }
    if (tok.lstrip) {
      while (begin > gap_begin) {
        size_t b = begin - 1;
        while (b > gap_begin && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
        if (!utf8::is_white_space(utf8::next(text.substr(b, begin - b)).cp)) break;
        begin = b;
      }
    }
    if (tok.rstrip) {
      while (end < text.size()) {
        const utf8::Sequence seq = utf8::next(text.substr(end));
        if (!seq.valid || !utf8::is_white_space(seq.cp)) break;
        end += static_cast<size_t>(seq.length);
      }
    }
    if (begin > gap_begin)
      out.push_back({text.substr(gap_begin, begin - gap_begin), std::nullopt, gap_begin});
    out.push_back({text.substr(begin, end - begin), tok.id, begin});
    pos = gap_begin = end;
  }
  if (gap_begin < text.size()) {
    out.push_back({text.substr(gap_begin), std::nullopt, gap_begin});
  }
}

const AddedToken* AddedVocabulary::find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::find(std::string_view content) const {
  for (const AddedToken& t : tokens_) {
    if (t.content == content) return t.id;
  }
  return std::nullopt;
}

}  // namespace litellama
