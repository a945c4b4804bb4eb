// RadixCache: the prefix cache over the worker's token-granular KV pool. A radix tree keyed by
// token ids; each edge holds the KV slots of its tokens. The tree is the scheduler's alone: the
// worker only ever sees slot tables, and a cached prefix is nothing but slot ids a new request
// puts at the head of its own table.
//
// Cache key: the token ids from position 0. The KV of position p is a function of the ids at
// positions 0..p and of the model (weights, dtype, RoPE) only; sampling parameters, stop rules and
// max_tokens never affect it. Everything that does affect it is a property of the worker, so the
// whole tree is dropped whenever the worker (and with it its pool) is replaced. Any future
// per-request state that changes KV (adapters, images) must become part of the key.
//
// Ownership (what must stay true):
// - The tree holds one allocator reference on every slot it caches, and marks it cached in the
//   allocator (KvSlotAllocator::set_cached) for as long as it holds it. A request that matches a
//   prefix takes one more reference per matched slot and releases it when it leaves.
// - Requests hold prefixes of a root path, whole nodes (match() splits at the match's end), so
//   along any path refcounts never increase; a slot whose refcount is 1 is held by the tree only
//   ("cached"), one above 1 is also used by a request.
// - evict() frees only leaves nobody but the tree holds, least recently used first.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "services/scheduler/kv_slot_allocator.h"

namespace litellama {

class RadixCache {
 public:
  explicit RadixCache(KvSlotAllocator& allocator);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // Longest cached prefix of `tokens`, at most max_len tokens: appends its slots to *slots, takes
  // one reference on each for the caller and marks the path used now. Returns its length.
  int32_t match(std::span<const int32_t> tokens, int32_t max_len, std::vector<int32_t>* slots);
  // Length of the longest cached prefix, changing nothing.
  int32_t peek(std::span<const int32_t> tokens, int32_t max_len) const;
  // Caches tokens[k] -> slots[k]. Positions already cached keep the tree's slot (the caller's
  // duplicate goes when the caller releases it); new positions take a tree reference on the
  // caller's slot. Returns how many positions were newly cached.
  int32_t insert(std::span<const int32_t> tokens, std::span<const int32_t> slots);
  // Frees at least n slots by evicting unreferenced leaves, least recently used first, or as
  // many as can be freed. Returns the number freed.
  int32_t evict(int32_t n);
  // Forgets everything; release = false when the pool itself is gone (nothing to give back).
  void clear(bool release);

  int32_t n_cached_slots() const { return n_slots_; }  // every slot the tree holds
  // Slots only the tree holds (cached, not used); the allocator keeps the count (set_cached).
  int32_t n_evictable() const { return allocator_.n_cached_idle(); }
  int64_t n_evictions() const { return n_evicted_slots_; }
  int32_t n_nodes() const;
  // Every (token path position, slot) the tree holds, for invariant checks: slots in tree order.
  std::vector<int32_t> cached_slots() const;

 private:
  struct Node {
    std::vector<int32_t> key;
    std::vector<int32_t> slots;
    Node* parent = nullptr;
    std::unordered_map<int32_t, std::unique_ptr<Node>> children;
    uint64_t last_use = 0;
  };
  // Splits n after `at` tokens; returns the new upper node (n becomes its only child).
  Node* split(Node* n, size_t at);
  bool evictable(const Node* n) const;
  template <typename F>
  void visit(const Node* n, F&& f) const;

  KvSlotAllocator& allocator_;
  std::unique_ptr<Node> root_;
  int32_t n_slots_ = 0;
  int64_t n_evicted_slots_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace litellama
