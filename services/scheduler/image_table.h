// ImageTable: which image each slot of the vision service's embedding pool holds, from the
// scheduler's side. The scheduler is the single owner of pool slots (as it is of KV slots): it
// assigns a slot to an image, asks the vision service to encode the image into it, and hands slot
// ids to the worker; it never touches the rows.
//
// Reuse: images are keyed by a 64-bit hash of their bytes (hash_image_bytes). A request that
// needs an image already held (encoding or ready) takes a reference on its slot and is not
// encoded again. Reference counts rise while requests use a slot; a ready slot nobody
// references stays cached and is evicted least recently used first when a new image needs a
// slot. An encode that failed drops its entry at once (the requests waiting on it fail; the next
// request with those bytes encodes again); its slot comes back once the last reference goes.
//
// References: acquire() takes one, release() drops one. A hash names at most one live entry but
// may also have failed slots still referenced; release() drops a failed slot's reference before
// the live entry's, because a request whose encode failed never reads its rows while a live
// entry's rows may still be read: releasing early there would let a slot in use be evicted.
//
// What must stay true: a slot is free, or held by exactly one hash (a live entry or a failed
// slot still referenced); a referenced slot is never evicted; n_free() + n_referenced() +
// n_cached() == n_slots() except for an encode nobody references any more (released before
// mark_ready/mark_failed), which holds its slot until then; reset() (a new vision process and so
// a new pool) forgets every entry.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace litellama {

// The reuse key of an image: XXH3-64 of its encoded bytes (libxxhash).
uint64_t hash_image_bytes(std::string_view bytes);

class ImageTable {
 public:
  explicit ImageTable(int32_t n_slots = 0);

  // Forgets every entry and failed slot: a pool of n_slots empty slots. n_evictions() keeps
  // counting across resets (it feeds a monotonic counter).
  void reset(int32_t n_slots);

  struct Acquired {
    int32_t slot = -1;
    bool ready = false;         // the rows are written: usable now
    bool needs_encode = false;  // a slot was just assigned: the caller must have it encoded
  };
  // One more reference on the image `hash`. nullopt when the image is not held and no slot is
  // free or evictable (every slot referenced): the caller waits and asks again.
  std::optional<Acquired> acquire(uint64_t hash);
  // Drops one reference taken by acquire(); the slot stays cached when its image is ready.
  void release(uint64_t hash);
  // The encode into `hash`'s slot finished: its requests may run. No effect on an unknown hash.
  void mark_ready(uint64_t hash);
  // The encode failed: the entry goes now (acquire encodes anew), the slot once unreferenced.
  void mark_failed(uint64_t hash);

  int32_t n_slots() const { return n_slots_; }
  int32_t n_free() const;
  int32_t n_referenced() const;  // slots some request holds (failed slots included)
  int32_t n_cached() const;      // ready slots nobody holds (evictable)
  int64_t n_evictions() const { return n_evictions_; }
  std::optional<int32_t> slot_of(uint64_t hash) const;  // held (encoding or ready)
  bool is_ready(uint64_t hash) const;
  int32_t refcount(uint64_t hash) const;  // the live entry's references (0 when none)

 private:
  struct Entry {
    int32_t slot = -1;
    int32_t refs = 0;
    bool ready = false;
    bool in_lru = false;                // ready and unreferenced: evictable
    std::list<uint64_t>::iterator lru;  // valid while in_lru
  };
  // A slot whose encode failed while requests still referenced it: no entry names it any more
  // (acquire of the same hash encodes into another slot); it is freed when `refs` reaches 0.
  struct Failed {
    uint64_t hash = 0;
    int32_t slot = -1;
    int32_t refs = 0;
  };

  int32_t n_slots_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;  // held images (encoding or ready)
  std::list<uint64_t> lru_;                      // evictable hashes, least recently used first
  std::vector<int32_t> free_;                    // free slots, a stack
  std::vector<Failed> failed_;                   // oldest failure first; short (failures are rare)
  int64_t n_evictions_ = 0;

  void erase_lru(Entry& entry);
};

}  // namespace litellama
