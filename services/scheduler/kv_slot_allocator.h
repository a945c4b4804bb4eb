// KvSlotAllocator: the single source of truth for which KV slots of the worker's pool are in use.
//
// Ownership and refcount rules (what must stay true):
// - A slot is either on the free list (refcount 0) or referenced by at least one holder
//   (refcount >= 1). allocate() hands out slots with refcount 1; retain() adds a holder (a shared
//   prefix); release() drops one holder and returns the slot to the free list at 0.
// - Reservations are promises, not slots: reserve() sets aside capacity to be allocated later;
//   n_free_unreserved() is what may still be promised. The ContinuousBatcher reserves nothing (it
//   admits by free + evictable slots and preempts when decode runs out, continuous_batcher.h).
// - The RadixCache holds one reference on every slot it caches (radix_cache.h) and marks it
//   cached (set_cached); n_cached_idle() counts the marked slots whose only holder is the cache,
//   kept up to date by every refcount change so that reading it costs nothing (the metrics read
//   it several times a second, and a walk of a cache of a million slots took milliseconds of
//   the scheduler's loop).
// - reset() forgets everything (the worker and its pool were replaced).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace litellama {

class KvSlotAllocator {
 public:
  explicit KvSlotAllocator(int32_t n_slots = 0);

  void reset(int32_t n_slots);

  int32_t n_total() const { return static_cast<int32_t>(refcount_.size()); }
  int32_t n_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t n_used() const { return n_total() - n_free(); }
  int64_t n_reserved() const { return n_reserved_; }
  int64_t n_free_unreserved() const { return n_free() - n_reserved_; }

  // Appends n fresh slots to *out; fails (allocating nothing) when fewer than n are free.
  Status allocate(int32_t n, std::vector<int32_t>* out);
  void retain(std::span<const int32_t> slots);
  void release(std::span<const int32_t> slots);
  int32_t refcount(int32_t slot) const { return refcount_[static_cast<size_t>(slot)]; }

  // The prefix cache's mark: set while the cache holds the slot (it holds a reference then).
  void set_cached(std::span<const int32_t> slots, bool cached);
  bool cached(int32_t slot) const { return cached_[static_cast<size_t>(slot)] != 0; }
  // Marked slots whose refcount is 1: held by the cache alone, evictable.
  int32_t n_cached_idle() const { return n_cached_idle_; }

  // Reservations: reserve() fails when it would promise more than is free and unpromised.
  Status reserve(int64_t n);
  void unreserve(int64_t n);

 private:
  std::vector<int32_t> free_;  // stack; low slot ids are handed out first
  std::vector<int32_t> refcount_;
  std::vector<uint8_t> cached_;  // set_cached's mark, per slot
  int32_t n_cached_idle_ = 0;
  int64_t n_reserved_ = 0;
};

}  // namespace litellama
