// The scheduler's image slot table against a brute-force model (random operations, every
// invariant checked after each), the image reuse key, and the vision service's shared-memory
// embedding pool whose slots the table assigns.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>

#include "services/scheduler/image_table.h"
#include "services/vision/embedding_pool.h"

namespace litellama {
namespace {

// ---- ImageTable against a model -----------------------------------------------------------------

// The table's rules written the slow, obvious way: every slot's owner in a vector, LRU order as a
// "last released" timestamp, failed slots as a list searched oldest first.
struct Model {
  struct Entry {
    int32_t slot = -1;
    int32_t refs = 0;
    bool ready = false;
    int64_t idle_since = 0;  // when it became ready and unreferenced (LRU order)
  };
  struct Failed {
    uint64_t hash;
    int32_t slot;
    int32_t refs;
  };
  int32_t n_slots = 0;
  std::map<uint64_t, Entry> entries;
  std::vector<Failed> failed;  // oldest first
  int64_t clock = 0;
  int64_t n_evictions = 0;

  void reset(int32_t n) {
    n_slots = n;
    entries.clear();
    failed.clear();
  }
  std::set<int32_t> used_slots() const {
    std::set<int32_t> used;
    for (const auto& [h, e] : entries) used.insert(e.slot);
    for (const auto& f : failed) used.insert(f.slot);
    return used;
  }
  bool evictable(const Entry& e) const { return e.ready && e.refs == 0; }
  // The hash acquire() evicts when no slot is free: the ready, unreferenced entry idle longest.
  std::optional<uint64_t> lru_victim() const {
    std::optional<uint64_t> victim;
    int64_t oldest = 0;
    for (const auto& [h, e] : entries) {
      if (evictable(e) && (!victim || e.idle_since < oldest)) {
        victim = h;
        oldest = e.idle_since;
      }
    }
    return victim;
  }
  int32_t n_free() const { return n_slots - static_cast<int32_t>(used_slots().size()); }
  int32_t n_referenced() const {
    int32_t n = static_cast<int32_t>(failed.size());
    for (const auto& [h, e] : entries) n += e.refs > 0;
    return n;
  }
  int32_t n_cached() const {
    int32_t n = 0;
    for (const auto& [h, e] : entries) n += evictable(e);
    return n;
  }
  int32_t n_encoding_idle() const {
    int32_t n = 0;
    for (const auto& [h, e] : entries) n += !e.ready && e.refs == 0;
    return n;
  }
};

// Every invariant and every observable of the table against the model.
void expect_same(const ImageTable& t, const Model& m, const std::vector<uint64_t>& hashes,
                 const std::string& where) {
  SCOPED_TRACE(where);
  ASSERT_EQ(t.n_slots(), m.n_slots);
  ASSERT_EQ(t.n_free(), m.n_free());
  ASSERT_EQ(t.n_referenced(), m.n_referenced());
  ASSERT_EQ(t.n_cached(), m.n_cached());
  ASSERT_EQ(t.n_evictions(), m.n_evictions);
  ASSERT_EQ(t.n_free() + t.n_referenced() + t.n_cached() + m.n_encoding_idle(), t.n_slots());
  std::set<int32_t> slots;
  for (const auto& f : m.failed) {
    ASSERT_GT(f.refs, 0);
    ASSERT_TRUE(slots.insert(f.slot).second) << "slot " << f.slot << " held twice";
  }
  for (uint64_t h : hashes) {
    auto it = m.entries.find(h);
    if (it == m.entries.end()) {
      ASSERT_FALSE(t.slot_of(h).has_value()) << "hash " << h;
      ASSERT_FALSE(t.is_ready(h));
      ASSERT_EQ(t.refcount(h), 0);
      continue;
    }
    const auto slot = t.slot_of(h);
    ASSERT_TRUE(slot.has_value()) << "hash " << h;
    ASSERT_EQ(*slot, it->second.slot) << "hash " << h;
    ASSERT_GE(*slot, 0);
    ASSERT_LT(*slot, t.n_slots());
    ASSERT_TRUE(slots.insert(*slot).second) << "slot " << *slot << " held twice";
    ASSERT_EQ(t.is_ready(h), it->second.ready);
    ASSERT_EQ(t.refcount(h), it->second.refs);
  }
}

TEST(ImageTable, MatchesModelOverRandomOperations) {
  std::mt19937_64 rng(20240611);
  const std::vector<uint64_t> hashes = {11, 22, 33, 44, 55, 66, 77};
  // What the run reached, so a change of weights cannot silently stop exercising a rule.
  int64_t n_evicted = 0, n_refused = 0, n_failed_released = 0, n_reused = 0;
  for (int round = 0; round < 40; ++round) {
    const int32_t n_slots = 2 + static_cast<int32_t>(rng() % 4);  // 2..5
    const size_t n_hashes = 3 + rng() % (hashes.size() - 2);      // 3..7: contention varies
    ImageTable t(n_slots);
    Model m;
    m.reset(n_slots);
    auto pick = [&] { return hashes[rng() % n_hashes]; };
    for (int op = 0; op < 3000; ++op) {
      const uint64_t h = pick();
      const int kind = static_cast<int>(rng() % 100);
      std::string where = "round " + std::to_string(round) + " op " + std::to_string(op);
      if (kind < 40) {
        where += " acquire " + std::to_string(h);
        const auto got = t.acquire(h);
        if (auto it = m.entries.find(h); it != m.entries.end()) {
          ASSERT_TRUE(got.has_value()) << where;
          EXPECT_EQ(got->slot, it->second.slot) << where;
          EXPECT_EQ(got->ready, it->second.ready) << where;
          EXPECT_FALSE(got->needs_encode) << where;
          ++it->second.refs;
          n_reused += it->second.ready;
        } else {
          const std::set<int32_t> used = m.used_slots();
          const auto victim = m.lru_victim();
          if (static_cast<int32_t>(used.size()) < m.n_slots) {
            ASSERT_TRUE(got.has_value()) << where;
            EXPECT_EQ(used.count(got->slot), 0u) << where << ": slot " << got->slot << " in use";
            EXPECT_GE(got->slot, 0);
            EXPECT_LT(got->slot, m.n_slots);
          } else if (victim) {
            ASSERT_TRUE(got.has_value()) << where;
            EXPECT_EQ(got->slot, m.entries[*victim].slot) << where << ": not the LRU victim";
            m.entries.erase(*victim);
            ++m.n_evictions;
            ++n_evicted;
          } else {
            // Every slot is referenced or encoding: nothing may be taken.
            ASSERT_FALSE(got.has_value()) << where;
            ++n_refused;
          }
          if (got) {
            EXPECT_FALSE(got->ready) << where;
            EXPECT_TRUE(got->needs_encode) << where;
            m.entries[h] = Model::Entry{got->slot, 1, false, 0};
          }
        }
      } else if (kind < 75) {
        where += " release " + std::to_string(h);
        t.release(h);
        auto f = std::find_if(m.failed.begin(), m.failed.end(),
                              [h](const Model::Failed& x) { return x.hash == h; });
        if (f != m.failed.end()) {
          if (--f->refs == 0) m.failed.erase(f);
          ++n_failed_released;
        } else if (auto it = m.entries.find(h); it != m.entries.end() && it->second.refs > 0) {
          if (--it->second.refs == 0 && it->second.ready) it->second.idle_since = ++m.clock;
        }
      } else if (kind < 90) {
        where += " mark_ready " + std::to_string(h);
        t.mark_ready(h);
        if (auto it = m.entries.find(h); it != m.entries.end() && !it->second.ready) {
          it->second.ready = true;
          if (it->second.refs == 0) it->second.idle_since = ++m.clock;
        }
      } else if (kind < 99) {
        where += " mark_failed " + std::to_string(h);
        t.mark_failed(h);
        if (auto it = m.entries.find(h); it != m.entries.end()) {
          if (it->second.refs > 0) m.failed.push_back({h, it->second.slot, it->second.refs});
          m.entries.erase(it);
        }
      } else {
        const int32_t n = 2 + static_cast<int32_t>(rng() % 4);
        where += " reset " + std::to_string(n);
        t.reset(n);
        m.reset(n);
      }
      expect_same(t, m, hashes, where);
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_GT(n_evicted, 100);
  EXPECT_GT(n_refused, 100);
  EXPECT_GT(n_failed_released, 100);
  EXPECT_GT(n_reused, 100);
  std::printf("evictions %lld, refusals %lld, failed-slot releases %lld, ready reuses %lld\n",
              static_cast<long long>(n_evicted), static_cast<long long>(n_refused),
              static_cast<long long>(n_failed_released), static_cast<long long>(n_reused));
}

TEST(ImageTable, EvictsLeastRecentlyUsedReadySlot) {
  ImageTable t(2);
  const auto a = t.acquire(1), b = t.acquire(2);
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->slot, b->slot);
  EXPECT_FALSE(t.acquire(3).has_value());  // both referenced
  t.mark_ready(1);
  t.mark_ready(2);
  t.release(2);  // 2 idle first: least recently used
  t.release(1);
  EXPECT_EQ(t.n_cached(), 2);
  const auto c = t.acquire(3);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->slot, b->slot);
  EXPECT_TRUE(c->needs_encode);
  EXPECT_EQ(t.n_evictions(), 1);
  EXPECT_FALSE(t.slot_of(2).has_value());
  // Re-acquiring a cached image takes it off the LRU list; releasing puts it back most recent.
  const auto a2 = t.acquire(1);
  ASSERT_TRUE(a2.has_value());
  EXPECT_EQ(a2->slot, a->slot);
  EXPECT_TRUE(a2->ready);
  EXPECT_FALSE(a2->needs_encode);
  EXPECT_EQ(t.n_cached(), 0);
  EXPECT_FALSE(t.acquire(4).has_value());  // 1 referenced, 3 encoding
}

TEST(ImageTable, FailedEncodeFreesSlotAfterLastReference) {
  ImageTable t(2);
  const auto a = t.acquire(7);
  ASSERT_TRUE(t.acquire(7).has_value());  // two requests wait on one encode
  t.mark_failed(7);
  EXPECT_FALSE(t.slot_of(7).has_value());
  EXPECT_EQ(t.n_referenced(), 1);   // the failed slot stays until both requests let go
  const auto again = t.acquire(7);  // a new request: a new encode in another slot
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->needs_encode);
  EXPECT_NE(again->slot, a->slot);
  EXPECT_EQ(t.n_free(), 0);
  t.release(7);  // the failed slot's references go first
  t.release(7);
  EXPECT_EQ(t.n_free(), 1);
  EXPECT_EQ(t.refcount(7), 1);  // the live entry keeps its request's reference
  t.mark_ready(7);
  EXPECT_TRUE(t.is_ready(7));
  t.release(7);
  EXPECT_EQ(t.n_cached(), 1);
  EXPECT_EQ(t.n_free() + t.n_referenced() + t.n_cached(), t.n_slots());
}

TEST(ImageTable, ZeroSlotsAndReset) {
  ImageTable t;
  EXPECT_EQ(t.n_slots(), 0);
  EXPECT_FALSE(t.acquire(1).has_value());
  t.reset(3);
  ASSERT_TRUE(t.acquire(1).has_value());
  t.reset(3);
  EXPECT_FALSE(t.slot_of(1).has_value());
  EXPECT_EQ(t.n_free(), 3);
  t.release(1);  // unknown after reset: no effect
  EXPECT_EQ(t.n_free(), 3);
}

// ---- hash_image_bytes ---------------------------------------------------------------------------

TEST(HashImageBytes, StableAndSensitive) {
  std::string bytes(1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 31 + 7);
  const uint64_t h = hash_image_bytes(bytes);
  EXPECT_EQ(h, hash_image_bytes(std::string(bytes)));
  for (size_t i : {size_t{0}, size_t{1}, size_t{499}, size_t{999}}) {
    std::string changed = bytes;
    changed[i] = static_cast<char>(changed[i] ^ 1);
    EXPECT_NE(hash_image_bytes(changed), h) << "byte " << i;
  }
  EXPECT_NE(hash_image_bytes(bytes.substr(0, 999)), h);
  EXPECT_EQ(hash_image_bytes(std::string_view()), hash_image_bytes(std::string()));
  EXPECT_NE(hash_image_bytes(std::string_view()), hash_image_bytes(std::string_view("\0", 1)));
}

// ---- EmbeddingPool ------------------------------------------------------------------------------

std::string unique_pool_name() {
  static std::atomic<int> counter{0};
  return "litellama_test_pool_" + std::to_string(getpid()) + "_" + std::to_string(counter++);
}

float pattern(int32_t slot, size_t i) {
  return static_cast<float>(slot) * 1000.0f + static_cast<float>(i % 997);
}

TEST(EmbeddingPool, CreateWriteOpenRead) {
  const std::string name = unique_pool_name();
  const EmbeddingPoolGeometry g{5, 7, 19};  // odd sizes: each slot padded to 64 bytes
  auto owner = EmbeddingPool::create(name, g, 42);
  ASSERT_TRUE(owner.is_ok()) << owner.status().to_string();
  EmbeddingPool& pool = **owner;
  EXPECT_EQ(pool.geometry(), g);
  EXPECT_EQ(pool.incarnation(), 42u);
  EXPECT_GE(pool.size_bytes(), static_cast<size_t>(5 * 7 * 19) * sizeof(float));
  for (int32_t s = 0; s < g.n_slots; ++s) {
    std::span<float> rows = pool.rows(s);
    ASSERT_EQ(rows.size(), static_cast<size_t>(7 * 19));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(rows.data()) % 64, 0u) << "slot " << s;
    for (float v : rows) ASSERT_EQ(v, 0.0f);  // a new pool reads as zeros
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = pattern(s, i);
  }
  // Slots do not overlap: every pattern survives the others' writes.
  for (int32_t s = 0; s < g.n_slots; ++s) {
    const std::span<float> rows = pool.rows(s);
    for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], pattern(s, i));
  }

  for (uint64_t incarnation : {uint64_t{0}, uint64_t{42}}) {
    auto reader = EmbeddingPool::open(name, incarnation);
    ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
    const EmbeddingPool& r = **reader;
    EXPECT_EQ(r.geometry(), g);
    EXPECT_EQ(r.incarnation(), 42u);
    EXPECT_EQ(r.size_bytes(), pool.size_bytes());
    for (int32_t s = 0; s < g.n_slots; ++s) {
      const std::span<const float> rows = r.rows(s);
      ASSERT_EQ(rows.size(), static_cast<size_t>(7 * 19));
      for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], pattern(s, i));
    }
  }
  // Writes after open are seen through the other mapping.
  auto reader = EmbeddingPool::open(name);
  ASSERT_TRUE(reader.is_ok());
  pool.rows(3)[5] = -1.5f;
  EXPECT_EQ((*reader)->rows(3)[5], -1.5f);

  EXPECT_TRUE(pool.rows(-1).empty());
  EXPECT_TRUE(pool.rows(g.n_slots).empty());
  EXPECT_TRUE(std::as_const(**reader).rows(-1).empty());
  EXPECT_TRUE(std::as_const(**reader).rows(g.n_slots).empty());
}

TEST(EmbeddingPool, ADevicePoolCarriesItsExportAndNoHostRows) {
  const std::string name = unique_pool_name();
  const EmbeddingPoolGeometry g{5, 7, 19};
  EmbeddingPoolDevice d;
  for (size_t i = 0; i < d.ipc_handle.size(); ++i) d.ipc_handle[i] = static_cast<uint8_t>(3 * i);
  for (size_t i = 0; i < d.device_uuid.size(); ++i) d.device_uuid[i] = static_cast<uint8_t>(~i);
  auto owner = EmbeddingPool::create(name, g, 42, &d);
  ASSERT_TRUE(owner.is_ok()) << owner.status().to_string();
  auto host = EmbeddingPool::create(unique_pool_name(), g, 43);
  ASSERT_TRUE(host.is_ok());
  auto reader = EmbeddingPool::open(name, 42);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  for (const EmbeddingPool* pool : {owner->get(), reader->get()}) {
    EXPECT_TRUE(pool->on_device());
    EXPECT_EQ(pool->device().ipc_handle, d.ipc_handle);
    EXPECT_EQ(pool->device().device_uuid, d.device_uuid);
    EXPECT_EQ(pool->geometry(), g);
    EXPECT_TRUE(pool->rows(0).empty());  // the rows are device memory
    // The same numbering as a host pool's, so the scheduler's slots mean the same rows.
    for (int32_t s = 0; s < g.n_slots; ++s) {
      EXPECT_EQ(pool->row_index(s, 3), (*host)->row_index(s, 3));
    }
  }
  EXPECT_FALSE((*host)->on_device());
  // Whole slots of 64-byte-aligned rows: slot s starts row_index(s, 0) rows in.
  EXPECT_EQ(EmbeddingPool::rows_bytes(g),
            static_cast<uint64_t>((*host)->row_index(1, 0)) * g.n_slots * g.hidden * sizeof(float));
  EXPECT_EQ(EmbeddingPool::rows_bytes({0, 7, 19}), 0u);
}

TEST(EmbeddingPool, WrongIncarnationFails) {
  const std::string name = unique_pool_name();
  auto owner = EmbeddingPool::create(name, {2, 3, 4}, 7);
  ASSERT_TRUE(owner.is_ok()) << owner.status().to_string();
  auto reader = EmbeddingPool::open(name, 8);
  ASSERT_FALSE(reader.is_ok());
  const std::string message = reader.status().message();
  EXPECT_NE(message.find('7'), std::string::npos) << message;
  EXPECT_NE(message.find('8'), std::string::npos) << message;
}

TEST(EmbeddingPool, OpenMissingFails) {
  const std::string name = unique_pool_name();
  auto reader = EmbeddingPool::open(name);
  ASSERT_FALSE(reader.is_ok());
  EXPECT_EQ(reader.status().code(), StatusCode::kNotFound);
  EXPECT_NE(reader.status().message().find(name), std::string::npos) << reader.status().message();
}

TEST(EmbeddingPool, BadGeometryFails) {
  const std::string name = unique_pool_name();
  for (const EmbeddingPoolGeometry& g :
       {EmbeddingPoolGeometry{0, 1, 1}, EmbeddingPoolGeometry{1, 0, 1},
        EmbeddingPoolGeometry{1, 1, 0}, EmbeddingPoolGeometry{-1, 1, 1},
        EmbeddingPoolGeometry{1, -5, 1}, EmbeddingPoolGeometry{1, 1, -3},
        EmbeddingPoolGeometry{INT32_MAX, INT32_MAX, INT32_MAX},
        EmbeddingPoolGeometry{4096, 4096, 65536}}) {
    auto pool = EmbeddingPool::create(name, g, 1);
    ASSERT_FALSE(pool.is_ok()) << g.n_slots << " " << g.rows_per_slot << " " << g.hidden;
    EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(EmbeddingPool::open(name).is_ok());  // nothing was left behind
}

TEST(EmbeddingPool, OwnerRemovesOnDestructionReaderDoesNot) {
  const std::string name = unique_pool_name();
  auto owner = EmbeddingPool::create(name, {2, 2, 2}, 1);
  ASSERT_TRUE(owner.is_ok());
  {
    auto reader = EmbeddingPool::open(name);
    ASSERT_TRUE(reader.is_ok());
  }
  EXPECT_TRUE(EmbeddingPool::open(name).is_ok());  // a reader going away keeps the region
  auto reader = EmbeddingPool::open(name);
  ASSERT_TRUE(reader.is_ok());
  (*owner)->rows(1)[0] = 3.0f;
  std::unique_ptr<EmbeddingPool> owned = std::move(owner).value();
  owned.reset();
  auto after = EmbeddingPool::open(name);
  ASSERT_FALSE(after.is_ok());
  EXPECT_EQ(after.status().code(), StatusCode::kNotFound);
  // A mapping taken before the removal stays readable.
  EXPECT_EQ((*reader)->rows(1)[0], 3.0f);
}

TEST(EmbeddingPool, CreateReplacesStaleRegion) {
  // A pool left behind by a vision process that died without its destructor running.
  const std::string dead = unique_pool_name();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto pool = EmbeddingPool::create(dead, {2, 2, 2}, 1);
    if (pool.is_ok()) (*pool)->rows(1)[0] = 5.0f;
    _exit(pool.is_ok() ? 0 : 1);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  {
    auto left = EmbeddingPool::open(dead, 1);
    ASSERT_TRUE(left.is_ok()) << left.status().to_string();
    EXPECT_EQ((*left)->rows(1)[0], 5.0f);
  }
  const EmbeddingPoolGeometry g{3, 5, 8};
  auto replaced = EmbeddingPool::create(dead, g, 2);
  ASSERT_TRUE(replaced.is_ok()) << replaced.status().to_string();
  EXPECT_FALSE(EmbeddingPool::open(dead, 1).is_ok());  // the old incarnation is gone
  auto fresh = EmbeddingPool::open(dead, 2);
  ASSERT_TRUE(fresh.is_ok()) << fresh.status().to_string();
  EXPECT_EQ((*fresh)->geometry(), g);
  for (int32_t s = 0; s < g.n_slots; ++s) {
    for (float v : (*fresh)->rows(s)) ASSERT_EQ(v, 0.0f);
  }
}

TEST(EmbeddingPool, CreateReplacesRegionOfAnotherLayout) {
  namespace bip = boost::interprocess;
  const std::string name = unique_pool_name();
  {
    // What a crashed process of another layout leaves behind.
    bip::shared_memory_object shm(bip::create_only, name.c_str(), bip::read_write);
    shm.truncate(4096);
    bip::mapped_region region(shm, bip::read_write);
    std::memset(region.get_address(), 0xab, region.get_size());
  }
  auto stale = EmbeddingPool::open(name);
  ASSERT_FALSE(stale.is_ok());
  EXPECT_EQ(stale.status().code(), StatusCode::kUnsupported) << stale.status().to_string();

  const EmbeddingPoolGeometry g{3, 5, 8};
  auto owner = EmbeddingPool::create(name, g, 9);
  ASSERT_TRUE(owner.is_ok()) << owner.status().to_string();
  auto reader = EmbeddingPool::open(name, 9);
  ASSERT_TRUE(reader.is_ok()) << reader.status().to_string();
  EXPECT_EQ((*reader)->geometry(), g);
  for (int32_t s = 0; s < g.n_slots; ++s) {
    for (float v : (*reader)->rows(s)) ASSERT_EQ(v, 0.0f);
  }
}

}  // namespace
}  // namespace litellama
