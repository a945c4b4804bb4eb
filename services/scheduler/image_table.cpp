// ImageTable and hash_image_bytes; the reference and ownership rules are in image_table.h.
#include "services/scheduler/image_table.h"

#include <algorithm>

#include <xxhash.h>

namespace litellama {

uint64_t hash_image_bytes(std::string_view bytes) {
  // An empty view may carry a null pointer; XXH3 reads nothing at length 0 but gets a valid one.
  static constexpr char kEmpty = 0;
  return XXH3_64bits(bytes.empty() ? &kEmpty : bytes.data(), bytes.size());
}

ImageTable::ImageTable(int32_t n_slots) {
  reset(n_slots);
}

void ImageTable::reset(int32_t n_slots) {
  n_slots_ = std::max(n_slots, 0);
  entries_.clear();
  lru_.clear();
  failed_.clear();
  free_.resize(static_cast<size_t>(n_slots_));
  // Slot 0 on top: a fresh table fills slots in order.
  for (int32_t i = 0; i < n_slots_; ++i) free_[static_cast<size_t>(i)] = n_slots_ - 1 - i;
}

void ImageTable::erase_lru(Entry& entry) {
  if (!entry.in_lru) return;
  lru_.erase(entry.lru);
  entry.in_lru = false;
}

std::optional<ImageTable::Acquired> ImageTable::acquire(uint64_t hash) {
  if (auto it = entries_.find(hash); it != entries_.end()) {
    Entry& entry = it->second;
    erase_lru(entry);
    ++entry.refs;
    return Acquired{entry.slot, entry.ready, false};
  }
  int32_t slot = -1;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    // Only ready, unreferenced entries are in lru_, so a referenced slot is never taken here.
    auto victim = entries_.find(lru_.front());
    slot = victim->second.slot;
    lru_.pop_front();
    entries_.erase(victim);
    ++n_evictions_;
  } else {
    return std::nullopt;
  }
  Entry& entry = entries_[hash];
  entry.slot = slot;
  entry.refs = 1;
  return Acquired{slot, false, true};
}

void ImageTable::release(uint64_t hash) {
  // A failed slot's reference first (see the header: its holder never reads the rows).
  auto failed = std::find_if(failed_.begin(), failed_.end(),
                             [hash](const Failed& f) { return f.hash == hash; });
  if (failed != failed_.end()) {
    if (--failed->refs == 0) {
      free_.push_back(failed->slot);
      failed_.erase(failed);
    }
    return;
  }
  auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.refs == 0) return;  // not acquired: nothing to drop
  Entry& entry = it->second;
  if (--entry.refs == 0 && entry.ready) {
    entry.lru = lru_.insert(lru_.end(), hash);  // most recently used last
    entry.in_lru = true;
  }
}

void ImageTable::mark_ready(uint64_t hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end() || it->second.ready) return;
  Entry& entry = it->second;
  entry.ready = true;
  if (entry.refs == 0) {
    entry.lru = lru_.insert(lru_.end(), hash);
    entry.in_lru = true;
  }
}

void ImageTable::mark_failed(uint64_t hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  erase_lru(entry);
  if (entry.refs == 0) {
    free_.push_back(entry.slot);
  } else {
    failed_.push_back(Failed{hash, entry.slot, entry.refs});
  }
  entries_.erase(it);
}

int32_t ImageTable::n_free() const {
  return static_cast<int32_t>(free_.size());
}

int32_t ImageTable::n_referenced() const {
  int32_t n = static_cast<int32_t>(failed_.size());
  for (const auto& [hash, entry] : entries_) n += entry.refs > 0 ? 1 : 0;
  return n;
}

int32_t ImageTable::n_cached() const {
  return static_cast<int32_t>(lru_.size());
}

std::optional<int32_t> ImageTable::slot_of(uint64_t hash) const {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return std::nullopt;
  return it->second.slot;
}

bool ImageTable::is_ready(uint64_t hash) const {
  auto it = entries_.find(hash);
  return it != entries_.end() && it->second.ready;
}

int32_t ImageTable::refcount(uint64_t hash) const {
  auto it = entries_.find(hash);
  return it == entries_.end() ? 0 : it->second.refs;
}

}  // namespace litellama
