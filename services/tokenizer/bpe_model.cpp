#include "services/tokenizer/bpe_model.h"

#include <algorithm>
#include <climits>
#include <mutex>
#include <utility>

#include <fmt/format.h>

#include "services/tokenizer/byte_level.h"
#include "services/tokenizer/json_token_id.h"
#include "services/tokenizer/utf8.h"

namespace litellama {
namespace {

constexpr size_t kCacheCapacity = 1 << 16;
constexpr size_t kCacheMaxWordBytes = 256;

}  // namespace

struct BpeModel::Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;

  // Appends the ids of `word` to ids: the remembered ones when the cache holds them, else those
  // merge(word, ids) appends, which are then remembered. Words over kCacheMaxWordBytes are never
  // cached; a full cache is emptied. The lock is not held while merging.
  template <typename Merge>
  void tokenize(std::string_view word, std::vector<int32_t>& ids, Merge&& merge) {
    const bool cacheable = word.size() <= kCacheMaxWordBytes;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mu);
      auto it = words.find(word);
      if (it != words.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    const size_t mark = ids.size();
    merge(word, ids);
    if (cacheable) {
      std::lock_guard<std::mutex> lock(mu);
      if (words.size() >= kCacheCapacity) words.clear();
      words.emplace(std::string(word),
                    std::vector<int32_t>(ids.begin() + static_cast<long>(mark), ids.end()));
    }
  }
};

BpeModel::BpeModel() : cache_(std::make_unique<Cache>()) {}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

Result<BpeModel> BpeModel::from_json(const nlohmann::json& model) {
  BpeModel m;
  try {
    const auto& vocab = model.at("vocab");
    if (!vocab.is_object())
      return Status(StatusCode::kInvalidArgument, "BPE vocab is not an object");
    m.vocab_.reserve(vocab.size());
    int32_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      LITELLAMA_ASSIGN_OR_RETURN(const int32_t id, json_token_id(it.value(), "BPE vocab token"));
      m.vocab_.emplace(it.key(), id);
      max_id = std::max(max_id, id);
    }
    m.id_to_token_.resize(static_cast<size_t>(max_id + 1));
    m.has_id_.assign(static_cast<size_t>(max_id + 1), false);
    for (const auto& [token, id] : m.vocab_) {
      m.id_to_token_[static_cast<size_t>(id)] = token;
      m.has_id_[static_cast<size_t>(id)] = true;
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      const auto unk = m.token_to_id(model["unk_token"].get<std::string>());
      if (unk) m.unk_id_ = unk;
    }
    m.fuse_unk_ = model.value("fuse_unk", false);
    m.byte_fallback_ = model.value("byte_fallback", false);
    m.ignore_merges_ = model.value("ignore_merges", false);
    if (model.contains("continuing_subword_prefix") &&
        model["continuing_subword_prefix"].is_string()) {
      m.continuing_subword_prefix_ = model["continuing_subword_prefix"].get<std::string>();
    }
    if (model.contains("end_of_word_suffix") && model["end_of_word_suffix"].is_string()) {
      m.end_of_word_suffix_ = model["end_of_word_suffix"].get<std::string>();
    }
    if (model.contains("dropout") && model["dropout"].is_number() &&
        model["dropout"].get<double>() > 0) {
      return Status(StatusCode::kUnsupported, "BPE dropout is not supported");
    }
    const auto& merges = model.at("merges");
    m.merges_.reserve(merges.size());
    const size_t prefix_len = m.continuing_subword_prefix_.size();
    int32_t rank = 0;
    for (const auto& merge : merges) {
      std::string a, b;
      if (merge.is_string()) {
        const std::string s = merge.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
          return make_error(StatusCode::kInvalidArgument, "malformed merge '{}'", s);
        }
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (merge.is_array() && merge.size() == 2) {
        a = merge[0].get<std::string>();
        b = merge[1].get<std::string>();
      } else {
        return make_error(StatusCode::kInvalidArgument, "malformed merge {}", merge.dump());
      }
      const auto ia = m.token_to_id(a), ib = m.token_to_id(b);
      const std::string merged =
          a + (prefix_len && b.compare(0, prefix_len, m.continuing_subword_prefix_) == 0
                   ? b.substr(prefix_len)
                   : b);
      const auto inew = m.token_to_id(merged);
      if (!ia || !ib || !inew) {
        return make_error(StatusCode::kInvalidArgument,
                          "merge '{} {}' uses a token outside the vocab", a, b);
      }
      m.merges_.insert(*ia, *ib, Merge{rank++, *inew});
    }
    m.byte_ids_.assign(256, -1);
    if (m.byte_fallback_) {
      for (int b = 0; b < 256; ++b) {
        if (auto id = m.token_to_id(fmt::format("<0x{:02X}>", b))) m.byte_ids_[b] = *id;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return make_error(StatusCode::kInvalidArgument, "malformed BPE model: {}", e.what());
  }
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= size() || !has_id_[static_cast<size_t>(id)]) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  cache_->tokenize(word, ids,
                   [this](std::string_view w, std::vector<int32_t>& out) { merge_word(w, out); });
}

bool BpeModel::enable_raw_bytes() {
  if (!continuing_subword_prefix_.empty() || !end_of_word_suffix_.empty()) return false;
  const ByteLevel& bl = ByteLevel::get();
  std::string mapped;
  for (int b = 0; b < 256; ++b) {
    mapped.clear();
    const char c = static_cast<char>(b);
    bl.encode(std::string_view(&c, 1), mapped);
    const auto id = token_to_id(mapped);
    if (!id) return false;
    raw_byte_ids_[static_cast<size_t>(b)] = *id;
  }
  auto raw = std::make_unique<FlatTokenMap>(vocab_.size());
  std::string bytes;
  for (int32_t id = 0; id < size(); ++id) {
    if (!has_id_[static_cast<size_t>(id)]) continue;
    bytes.clear();
    // Tokens with characters outside the alphabet can never come out of byte-level input.
    if (bl.decode(id_to_token_[static_cast<size_t>(id)], bytes)) raw->insert(bytes, id);
  }
  raw_vocab_ = std::move(raw);
  raw_cache_ = std::make_unique<Cache>();
  return true;
}

void BpeModel::tokenize_bytes(std::string_view raw, std::vector<int32_t>& ids) const {
  if (raw.empty()) return;
  if (ignore_merges_) {
    const int32_t id = raw_vocab_->find(raw);
    if (id != FlatTokenMap::kMissing) {
      ids.push_back(id);
      return;
    }
  }
  if (raw.size() == 1) {
    ids.push_back(raw_byte_ids_[static_cast<unsigned char>(raw[0])]);
    return;
  }
  raw_cache_->tokenize(
      raw, ids, [this](std::string_view r, std::vector<int32_t>& out) { merge_raw_bytes(r, out); });
}

void BpeModel::merge_raw_bytes(std::string_view raw, std::vector<int32_t>& ids) const {
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  const auto n = static_cast<int32_t>(raw.size());
  for (int32_t k = 0; k < n; ++k) {
    symbols.push_back(
        {raw_byte_ids_[static_cast<unsigned char>(raw[static_cast<size_t>(k)])], k - 1, k + 1, 1});
  }
  symbols.back().next = -1;
  merge_symbols(symbols, ids);
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](int32_t id, int32_t len) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, len});
  };

  // Initial symbols: one per character (with byte fallback or unk for unknown characters).
  int32_t unk_len = 0;  // byte length of a pending unk (0: none)
  std::string scratch;
  size_t i = 0;
  while (i < word.size()) {
    const int n = std::max(1, utf8::next(word.substr(i)).length);
    const bool first = i == 0, last = i + static_cast<size_t>(n) >= word.size();
    std::string_view piece = word.substr(i, static_cast<size_t>(n));
    std::string_view lookup = piece;
    if ((!first && !continuing_subword_prefix_.empty()) || (last && !end_of_word_suffix_.empty())) {
      scratch.clear();
      if (!first) scratch += continuing_subword_prefix_;
      scratch += piece;
      if (last) scratch += end_of_word_suffix_;
      lookup = scratch;
    }
    i += static_cast<size_t>(n);
    if (auto id = token_to_id(lookup)) {
      if (unk_len) add(*unk_id_, std::exchange(unk_len, 0));
      add(*id, n);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (const char c : lookup) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        if (unk_len) add(*unk_id_, std::exchange(unk_len, 0));
        for (const char c : lookup) add(byte_ids_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (unk_len && fuse_unk_) {
        unk_len += n;
      } else {
        if (unk_len) add(*unk_id_, unk_len);
        unk_len = n;
      }
    }
  }
  if (unk_len) add(*unk_id_, unk_len);
  if (symbols.empty()) return;
  symbols.back().next = -1;
  merge_symbols(symbols, ids);
}

namespace {

// A merge that may apply at `pos`: a min-heap entry ordered by (rank, pos).
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
};

// A binary min-heap on storage reused by every word on this thread.
class CandidateQueue {
 public:
  explicit CandidateQueue(std::vector<Candidate>& storage) : heap_(storage) { heap_.clear(); }
  bool empty() const { return heap_.empty(); }
  void push(Candidate c) {
    heap_.push_back(c);
    std::push_heap(heap_.begin(), heap_.end(), later);
  }
  Candidate pop() {
    std::pop_heap(heap_.begin(), heap_.end(), later);
    const Candidate top = heap_.back();
    heap_.pop_back();
    return top;
  }

 private:
  static bool later(const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
  std::vector<Candidate>& heap_;
};

}  // namespace

void BpeModel::MergeTable::reserve(size_t n) {
  size_t capacity = 16;
  int bits = 4;
  while (capacity < n * 2) {
    capacity *= 2;
    ++bits;
  }
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  shift_ = 64 - bits;
  size_ = 0;
  for (const Slot& s : old) {
    if (s.key != kEmptyKey) {
      insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xFFFFFFFFu), s.merge);
    }
  }
}

void BpeModel::MergeTable::insert(int32_t left, int32_t right, Merge merge) {
  if ((size_ + 1) * 2 > slots_.size()) reserve(std::max<size_t>(16, size_ * 2 + 2));
  const uint64_t key = pair_key(left, right);
  for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) return;
    if (s.key == kEmptyKey) {
      s = Slot{key, merge};
      ++size_;
      return;
    }
  }
}

void BpeModel::merge_by_scan(const std::vector<Symbol>& symbols, std::vector<int32_t>& ids) const {
  // sym[k] are the current symbols; rank[k] / merged[k] describe the pair (sym[k], sym[k+1]).
  constexpr int32_t kNoMerge = INT32_MAX;
  thread_local std::vector<int32_t> sym, rank, merged;
  const size_t n0 = symbols.size();
  sym.resize(n0);
  rank.resize(n0);
  merged.resize(n0);
  for (size_t k = 0; k < n0; ++k) sym[k] = symbols[k].id;
  auto set_pair = [&](size_t k) {
    const Merge* m = merges_.find(sym[k], sym[k + 1]);
    rank[k] = m ? m->rank : kNoMerge;
    merged[k] = m ? m->new_id : 0;
  };
  for (size_t k = 0; k + 1 < n0; ++k) set_pair(k);
  size_t n = n0;
  while (n > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < n; ++k) {
      if (rank[k] < rank[best]) best = k;
    }
    if (rank[best] == kNoMerge) break;
    sym[best] = merged[best];
    for (size_t k = best + 1; k + 1 < n; ++k) {
      sym[k] = sym[k + 1];
      rank[k] = rank[k + 1];
      merged[k] = merged[k + 1];
    }
    --n;
    if (best > 0) set_pair(best - 1);
    if (best + 1 < n) set_pair(best);
  }
  ids.insert(ids.end(), sym.begin(), sym.begin() + static_cast<long>(n));
}

void BpeModel::merge_symbols(std::vector<Symbol>& symbols, std::vector<int32_t>& ids) const {
  // The heap below pops the lowest (rank, position) among the adjacent pairs; an entry whose
  // pair has changed since it was pushed never passes the new_id check (its concatenation is
  // longer than new_id's token), so each step merges the leftmost pair of lowest rank, which is
  // what merge_by_scan finds directly. Short words take the scan.
  constexpr size_t kScanMaxSymbols = 16;
  if (symbols.size() <= kScanMaxSymbols) {
    merge_by_scan(symbols, ids);
    return;
  }
  thread_local std::vector<Candidate> storage;
  CandidateQueue queue(storage);
  for (size_t k = 0; k + 1 < symbols.size(); ++k) {
    if (const Merge* m = merges_.find(symbols[k].id, symbols[k + 1].id)) {
      queue.push({m->rank, static_cast<int32_t>(k), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.pop();
    Symbol& cur = symbols[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next == -1) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = symbols[static_cast<size_t>(next_pos)];
    const Merge* current = merges_.find(cur.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    symbols[static_cast<size_t>(next_pos)].len = 0;
    if (right.next != -1) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      if (const Merge* p = merges_.find(symbols[static_cast<size_t>(cur.prev)].id, cur.id)) {
        queue.push({p->rank, cur.prev, p->new_id});
      }
    }
    if (cur.next != -1) {
      if (const Merge* q = merges_.find(cur.id, symbols[static_cast<size_t>(cur.next)].id)) {
        queue.push({q->rank, top.pos, q->new_id});
      }
    }
  }
  for (int32_t k = 0; k != -1; k = symbols[static_cast<size_t>(k)].next) {
    ids.push_back(symbols[static_cast<size_t>(k)].id);
  }
}

}  // namespace litellama
