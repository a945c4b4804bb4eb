// The prefix cache and the batcher around it, without processes: the radix tree against a
// brute-force model over random operations, and the batcher under random load against a fake
// worker whose "KV" is a rolling hash of the ids it was fed, so that any wrong sharing, lost or
// stale slot changes the outputs.
#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>

#include <iostream>

#include <gtest/gtest.h>

#include "common/proto/step_ring.h"
#include "services/scheduler/continuous_batcher.h"
#include "services/scheduler/kv_slot_allocator.h"
#include "services/scheduler/radix_cache.h"

namespace litellama {
namespace {

using Ids = std::vector<int32_t>;

// Brute-force model of the tree: every cached prefix, by its ids, with its slot and when it was
// last used (the tree's clock ticks once per match or insert, so the model's does the same).
struct ModelEntry {
  int32_t slot;
  uint64_t last_use;
};

class TreeModel {
 public:
  std::map<Ids, ModelEntry> entries;
  uint64_t clock = 0;

  int32_t match(const Ids& ids, int32_t max_len, Ids* slots, bool touch) {
    if (touch) ++clock;
    Ids prefix;
    int32_t n = 0;
    for (int32_t p = 0; p < std::min<int32_t>(max_len, static_cast<int32_t>(ids.size())); ++p) {
      prefix.push_back(ids[static_cast<size_t>(p)]);
      auto it = entries.find(prefix);
      if (it == entries.end()) break;
      if (touch) it->second.last_use = clock;
      slots->push_back(it->second.slot);
      ++n;
    }
    return n;
  }
  int32_t insert(const Ids& ids, const Ids& slots) {
    ++clock;
    Ids prefix;
    int32_t added = 0;
    for (size_t p = 0; p < ids.size(); ++p) {
      prefix.push_back(ids[p]);
      auto [it, fresh] = entries.try_emplace(prefix, ModelEntry{slots[p], clock});
      it->second.last_use = clock;
      added += fresh ? 1 : 0;
    }
    return added;
  }
  bool is_leaf(const Ids& prefix) const {
    auto it = entries.upper_bound(prefix);  // extensions sort right after the prefix
    return it == entries.end() || it->first.size() <= prefix.size() ||
           !std::equal(prefix.begin(), prefix.end(), it->first.begin());
  }
};

TEST(RadixCache, MatchesABruteForceModelOverRandomOperations) {
  constexpr int32_t kSlots = 48;
  std::mt19937 rng(29);
  for (int round = 0; round < 20; ++round) {
    KvSlotAllocator allocator(kSlots);
    RadixCache cache(allocator);
    TreeModel model;
    std::vector<Ids> held;  // slot references callers hold (matches not yet released)
    auto random_ids = [&] {
      Ids ids(std::uniform_int_distribution<size_t>(1, 9)(rng));
      for (int32_t& id : ids) id = std::uniform_int_distribution<int32_t>(0, 2)(rng);
      return ids;
    };
    // Evicts through the tree, checks what went against the model and syncs the model.
    auto evict = [&](int32_t want) {
      std::map<Ids, ModelEntry> before = model.entries;
      int32_t evictable_before = 0;
      for (const auto& [ids, e] : before) evictable_before += allocator.refcount(e.slot) == 1;
      const int32_t freed = cache.evict(want);
      // Sync the model: what the tree no longer holds is gone; check it was allowed to go.
      uint64_t newest_evicted = 0;
      int32_t n_gone = 0;
      for (const auto& [ids, e] : before) {
        if (cache.peek(ids, 100) == static_cast<int32_t>(ids.size())) continue;
        ASSERT_EQ(allocator.refcount(e.slot), 0) << "an evicted slot is still held";
        newest_evicted = std::max(newest_evicted, e.last_use);
        model.entries.erase(ids);
        ++n_gone;
      }
      ASSERT_EQ(freed, n_gone);
      ASSERT_GE(freed, std::min(want, evictable_before));
      ASSERT_LE(freed, evictable_before);
      // Least recently used first: every leaf that could still go was used after the newest
      // one that went.
      for (const auto& [ids, e] : model.entries) {
        if (n_gone > 0 && model.is_leaf(ids) && allocator.refcount(e.slot) == 1) {
          ASSERT_GE(e.last_use, newest_evicted);
        }
      }
    };
    for (int op = 0; op < 300; ++op) {
      const int kind = std::uniform_int_distribution<int>(0, 9)(rng);
      if (kind <= 3) {
        // A request: match, take fresh slots for the rest, insert it all, keep or drop it.
        const Ids ids = random_ids();
        Ids slots, model_slots;
        const int32_t max_len = static_cast<int32_t>(ids.size()) - (kind == 0 ? 1 : 0);
        const int32_t n = cache.match(ids, max_len, &slots);
        ASSERT_EQ(n, model.match(ids, max_len, &model_slots, true));
        ASSERT_EQ(slots, model_slots);
        const int32_t rest = static_cast<int32_t>(ids.size()) - n;
        if (allocator.n_free() < rest) evict(rest - allocator.n_free());
        if (!allocator.allocate(rest, &slots).is_ok()) {
          allocator.release(slots);
          continue;
        }
        const int32_t added = cache.insert(ids, slots);
        ASSERT_EQ(added, model.insert(ids, slots));
        if (kind == 1) {
          held.push_back(slots);
        } else {
          allocator.release(slots);
        }
      } else if (kind <= 5) {
        const Ids ids = random_ids();
        Ids model_slots;
        ASSERT_EQ(cache.peek(ids, 100), model.match(ids, 100, &model_slots, false));
      } else if (kind <= 7 && !held.empty()) {
        const size_t i = std::uniform_int_distribution<size_t>(0, held.size() - 1)(rng);
        allocator.release(held[i]);
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        evict(std::uniform_int_distribution<int32_t>(1, 12)(rng));
      }
      // Accounting after every operation: each slot's refcount is the tree's hold plus the
      // callers' holds; the free list holds exactly the rest.
      std::vector<int32_t> expected(kSlots, 0);
      for (const auto& [ids, e] : model.entries) ++expected[static_cast<size_t>(e.slot)];
      for (const Ids& h : held) {
        for (int32_t s : h) ++expected[static_cast<size_t>(s)];
      }
      int32_t free = 0, cached_only = 0;
      for (int32_t s = 0; s < kSlots; ++s) {
        ASSERT_EQ(allocator.refcount(s), expected[static_cast<size_t>(s)]) << "slot " << s;
        free += expected[static_cast<size_t>(s)] == 0;
      }
      for (const auto& [ids, e] : model.entries) cached_only += allocator.refcount(e.slot) == 1;
      ASSERT_EQ(allocator.n_free(), free);
      ASSERT_EQ(cache.n_cached_slots(), static_cast<int32_t>(model.entries.size()));
      ASSERT_EQ(cache.n_evictable(), cached_only);
    }
    for (const Ids& h : held) allocator.release(h);
    cache.clear(true);
    EXPECT_EQ(allocator.n_free(), kSlots);
  }
}

// The fake worker: slot s holds a hash of the ids of positions 0..p of the sequence that wrote it;
// the sampled id is a function of the last position's hash. Outputs are right only if every
// sequence's slot table names the KV of exactly its own ids.
uint64_t mix(uint64_t h, int32_t id) {
  return (h ^ static_cast<uint64_t>(id + 1)) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
}
int32_t sample_from(uint64_t h, int32_t vocab) {
  return static_cast<int32_t>((h >> 17) % static_cast<uint64_t>(vocab));
}
Ids generate_alone(const Ids& prompt, int32_t max_tokens, int32_t vocab) {
  uint64_t h = 0;
  for (int32_t id : prompt) h = mix(h, id);
  Ids out;
  for (int k = 0; k < max_tokens; ++k) {
    out.push_back(sample_from(h, vocab));
    h = mix(h, out.back());
  }
  return out;
}

// Runs steps as the worker's contract says: the slot table travels as deltas into a table the
// worker keeps, in epochs that start with every sequence's whole table.
struct FakeWorker {
  std::vector<uint64_t> kv;
  std::vector<int32_t> table;
  uint32_t epoch = 0;
  Ids previous;  // sampled ids of the step before
  void run(proto::StepView v) {
    const proto::StepHeader& h = *v.header;
    if (h.epoch_start == 1) {
      epoch = h.table_epoch;
    } else {
      ASSERT_EQ(h.table_epoch, epoch) << "a step of an epoch that never started";
    }
    Ids sampled(static_cast<size_t>(h.n_seqs), -1);
    for (int s = 0; s < h.n_seqs; ++s) {
      const auto su = static_cast<size_t>(s);
      const int32_t base = v.slot_start[su];
      const int32_t kv_len = v.kv_len[su];
      const int32_t n_w = v.new_slot_start[su + 1] - v.new_slot_start[su];
      ASSERT_LE(n_w, kv_len);
      if (h.epoch_start == 1) ASSERT_EQ(n_w, kv_len) << "an epoch's first step brings whole tables";
      if (table.size() < static_cast<size_t>(base + kv_len)) table.resize(base + kv_len, -1);
      std::copy_n(v.new_slots.begin() + v.new_slot_start[su], n_w,
                  table.begin() + base + kv_len - n_w);
      for (int32_t t = v.token_start[su]; t < v.token_start[su + 1]; ++t) {
        int32_t id = v.token_ids[static_cast<size_t>(t)];
        if (id < 0) id = previous.at(static_cast<size_t>(-id - 1));
        const int32_t pos = v.positions[static_cast<size_t>(t)];
        const int32_t slot = table.at(static_cast<size_t>(base + pos));
        ASSERT_GE(slot, 0) << "an entry never sent";
        const uint64_t prev =
            pos == 0 ? 0 : kv[static_cast<size_t>(table.at(static_cast<size_t>(base + pos - 1)))];
        kv[static_cast<size_t>(slot)] = mix(prev, id);
      }
      if (v.sample[su]) {
        const int32_t last = v.positions[static_cast<size_t>(v.token_start[su + 1] - 1)];
        sampled[su] = sample_from(kv[static_cast<size_t>(table[base + last])], 50);
      }
    }
    std::copy(sampled.begin(), sampled.end(), v.sampled_ids.begin());
    previous = sampled;
  }
};

struct LoadResult {
  int64_t preemptions = 0;
  int64_t hit_tokens = 0;
  std::vector<int32_t> rejected;
};

// Random load: requests with shared prefixes and random priorities arrive over time (or all at
// once: burst), some are aborted; two steps are kept in flight. After every plan and every
// completion the pool is accounted for: used (by requests or steps still out) + cached + free =
// capacity.
LoadResult run_load(int32_t n_slots, bool prefix_cache, uint32_t seed, int n_requests,
                    std::vector<std::unique_ptr<Request>>* requests, bool aborts, bool burst,
                    int32_t max_output = 12) {
  KvSlotAllocator allocator(n_slots);
  BatcherOptions options;
  options.max_batch_tokens = 24;
  options.max_prefill_chunk = 10;
  options.prefix_cache = prefix_cache;
  ContinuousBatcher batcher(allocator, options);
  batcher.set_model(50, 0, {});
  auto ring = proto::StepRing::create("litellama-unit-ring-load-" + std::to_string(seed),
                                      {64, 16, 4 * n_slots, 0, 3 * (4 * n_slots) + 16 * 16});
  EXPECT_TRUE(ring.is_ok());
  FakeWorker worker;
  worker.kv.assign(static_cast<size_t>(n_slots), 0);
  std::mt19937 rng(seed);
  const Ids system = {7, 7, 3, 9, 1, 4, 4, 2, 8, 5, 6, 0};
  auto check_accounting = [&] {
    std::vector<int32_t> holders(static_cast<size_t>(n_slots), 0);
    std::set<int32_t> used;
    for (const auto& r : *requests) {
      for (int32_t s : r->slots) {
        ++holders[static_cast<size_t>(s)];
        used.insert(s);
      }
    }
    for (int32_t s : batcher.deferred_slots()) {
      ++holders[static_cast<size_t>(s)];
      used.insert(s);
    }
    int32_t cached = 0;
    for (int32_t s : batcher.cache().cached_slots()) {
      ++holders[static_cast<size_t>(s)];
      cached += used.count(s) ? 0 : 1;
    }
    for (int32_t s = 0; s < n_slots; ++s) {
      ASSERT_EQ(allocator.refcount(s), holders[static_cast<size_t>(s)]) << "slot " << s;
    }
    ASSERT_EQ(static_cast<int32_t>(used.size()) + cached + allocator.n_free(), n_slots);
    ASSERT_EQ(cached, batcher.cache().n_evictable());
  };
  std::vector<std::pair<PlannedStep, int>> in_flight;
  uint64_t step_id = 1;
  int buffer = 0, arrived = 0;
  LoadResult result;
  std::vector<Request*> rejected, updated;
  for (int iter = 0; iter < 20000 && (arrived < n_requests || batcher.has_work()); ++iter) {
    // Arrivals: a few per step until all came.
    for (int k = burst ? n_requests : std::uniform_int_distribution<int>(0, 2)(rng);
         k > 0 && arrived < n_requests; --k) {
      auto r = std::make_unique<Request>();
      r->id = static_cast<uint64_t>(++arrived);
      const size_t shared = std::uniform_int_distribution<size_t>(0, system.size())(rng);
      r->prompt_ids.assign(system.begin(), system.begin() + static_cast<std::ptrdiff_t>(shared));
      for (int q = std::uniform_int_distribution<int>(1, 6)(rng); q > 0; --q) {
        r->prompt_ids.push_back(std::uniform_int_distribution<int32_t>(0, 3)(rng));
      }
      r->max_tokens = std::uniform_int_distribution<int32_t>(1, max_output)(rng);
      r->priority = std::uniform_int_distribution<int32_t>(0, 2)(rng);
      batcher.enqueue(r.get());
      requests->push_back(std::move(r));
    }
    if (aborts && std::uniform_int_distribution<int>(0, 30)(rng) == 0 && !requests->empty()) {
      Request* r =
          (*requests)[std::uniform_int_distribution<size_t>(0, requests->size() - 1)(rng)].get();
      if (!r->finish) {
        r->finish = RequestFinish::kAbort;
        batcher.retire(r);
      }
    }
    while (in_flight.size() < 2) {
      auto plan = batcher.plan(step_id, (*ring)->buffer(buffer), (*ring)->limits(), &rejected);
      check_accounting();
      if (!plan) break;
      in_flight.push_back({*plan, buffer});
      ++step_id;
      buffer ^= 1;
    }
    if (in_flight.empty()) continue;
    auto [plan, buf] = in_flight.front();
    in_flight.erase(in_flight.begin());
    worker.run((*ring)->buffer(buf));
    updated.clear();
    batcher.complete(plan, (*ring)->buffer(buf).sampled_ids.first(plan.request_ids.size()),
                     &updated);
    check_accounting();
  }
  while (!in_flight.empty()) {
    auto [plan, buf] = in_flight.front();
    in_flight.erase(in_flight.begin());
    worker.run((*ring)->buffer(buf));
    batcher.complete(plan, (*ring)->buffer(buf).sampled_ids.first(plan.request_ids.size()),
                     &updated);
  }
  check_accounting();
  EXPECT_FALSE(batcher.has_work());
  for (Request* r : rejected) result.rejected.push_back(static_cast<int32_t>(r->id));
  result.preemptions = batcher.stats().preemptions;
  result.hit_tokens = batcher.stats().prefix_hit_tokens;
  return result;
}

TEST(ContinuousBatcher, RandomLoadKeepsThePoolAccountedAndOutputsExact) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    for (bool cache : {true, false}) {
      std::vector<std::unique_ptr<Request>> requests;
      const LoadResult result = run_load(40, cache, seed, 60, &requests, true, seed == 3);
      EXPECT_TRUE(result.rejected.empty());
      for (const auto& r : requests) {
        if (r->finish == RequestFinish::kAbort) continue;
        ASSERT_EQ(r->finish, RequestFinish::kLength) << "request " << r->id;
        EXPECT_EQ(r->output_ids, generate_alone(r->prompt_ids, r->max_tokens, 50))
            << "seed " << seed << " cache " << cache << " request " << r->id;
      }
      if (cache) {
        EXPECT_GT(result.hit_tokens, 0);
      }
    }
  }
}

// 100 requests against a pool a tenth of what they need together: all complete, exactly as alone.
TEST(ContinuousBatcher, TinyPoolPreemptsByRecomputeAndEveryRequestCompletes) {
  std::vector<std::unique_ptr<Request>> requests;
  // Prompts of up to 18 ids + up to 64 outputs: each fits the pool alone.
  constexpr int32_t kPool = 300;
  const LoadResult result = run_load(kPool, true, 7, 100, &requests, false, true, 64);
  int64_t need = 0;
  for (const auto& r : requests) need += r->n_prompt() + r->max_tokens;
  EXPECT_GE(need, 10 * kPool);  // the pool is at most a tenth of the total need
  EXPECT_TRUE(result.rejected.empty());
  EXPECT_GT(result.preemptions, 0);
  std::cout << "preemptions: " << result.preemptions << " (need " << need << " slots, pool "
            << kPool << ")\n";
  for (const auto& r : requests) {
    ASSERT_EQ(r->finish, RequestFinish::kLength) << "request " << r->id;
    EXPECT_EQ(r->output_ids, generate_alone(r->prompt_ids, r->max_tokens, 50)) << r->id;
  }
}

// Runs steps one at a time (nothing overlapped) until the batcher is idle; returns the ids of
// the requests in the order they were admitted.
std::vector<uint64_t> run_sequential(ContinuousBatcher& batcher, proto::StepRing& ring,
                                     FakeWorker& worker,
                                     std::vector<std::unique_ptr<Request>>& requests) {
  std::vector<Request*> rejected, updated;
  for (uint64_t step_id = 1; step_id < 1000 && batcher.has_work(); ++step_id) {
    auto plan = batcher.plan(step_id, ring.buffer(0), ring.limits(), &rejected);
    EXPECT_TRUE(plan.has_value());
    if (!plan) break;
    worker.run(ring.buffer(0));
    batcher.complete(*plan, ring.buffer(0).sampled_ids.first(plan->request_ids.size()), &updated);
  }
  EXPECT_TRUE(rejected.empty());
  std::vector<Request*> order;
  for (const auto& r : requests) order.push_back(r.get());
  std::sort(order.begin(), order.end(),
            [](const Request* a, const Request* b) { return a->admit_seq < b->admit_seq; });
  std::vector<uint64_t> ids;
  for (const Request* r : order) ids.push_back(r->id);
  return ids;
}

TEST(ContinuousBatcher, HigherPriorityFirstAndFirstComeFirstServedWithin) {
  KvSlotAllocator allocator(256);
  BatcherOptions options;
  options.max_batch_seqs = 1;  // one admission per step: the order is the admission order
  ContinuousBatcher batcher(allocator, options);
  batcher.set_model(50, 0, {});
  auto ring =
      proto::StepRing::create("litellama-unit-ring-priority", {64, 1, 256, 0, 4 * 256 + 16});
  ASSERT_TRUE(ring.is_ok());
  std::vector<std::unique_ptr<Request>> requests;
  const int32_t priorities[] = {0, 1, 0, 2, 1, -1};
  for (int i = 0; i < 6; ++i) {
    auto r = std::make_unique<Request>();
    r->id = static_cast<uint64_t>(i + 1);
    r->prompt_ids = {i, i + 1};  // no shared prefixes
    r->max_tokens = 2;
    r->priority = priorities[i];
    batcher.enqueue(r.get());
    requests.push_back(std::move(r));
  }
  EXPECT_EQ(batcher.n_waiting_by_priority(),
            (std::map<int32_t, int32_t>{{-1, 1}, {0, 2}, {1, 2}, {2, 1}}));
  FakeWorker worker;
  worker.kv.assign(256, 0);
  EXPECT_EQ(run_sequential(batcher, **ring, worker, requests),
            (std::vector<uint64_t>{4, 2, 5, 1, 3, 6}));
  for (const auto& r : requests) EXPECT_EQ(r->output_ids, generate_alone(r->prompt_ids, 2, 50));
}

TEST(ContinuousBatcher, LongestCachedPrefixFirstButNobodyPassedOverMoreThanTheBound) {
  KvSlotAllocator allocator(512);
  BatcherOptions options;
  options.max_batch_seqs = 1;
  options.max_passed_over = 3;
  ContinuousBatcher batcher(allocator, options);
  batcher.set_model(50, 0, {});
  auto ring =
      proto::StepRing::create("litellama-unit-ring-prefix-order", {64, 1, 512, 0, 4 * 512 + 16});
  ASSERT_TRUE(ring.is_ok());
  const Ids system = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
  std::vector<std::unique_ptr<Request>> warm;
  warm.push_back(std::make_unique<Request>());
  warm[0]->id = 100;
  warm[0]->prompt_ids = system;
  warm[0]->prompt_ids.push_back(1);
  warm[0]->max_tokens = 1;
  batcher.enqueue(warm[0].get());
  FakeWorker worker;  // one worker, one pool: the cached KV stays valid
  worker.kv.assign(512, 0);
  (void)run_sequential(batcher, **ring, worker, warm);
  ASSERT_GE(batcher.cache().n_cached_slots(), static_cast<int32_t>(system.size()));

  // The first to arrive shares nothing; eight later ones share the cached system prompt.
  std::vector<std::unique_ptr<Request>> requests;
  for (int i = 0; i < 9; ++i) {
    auto r = std::make_unique<Request>();
    r->id = static_cast<uint64_t>(i + 1);
    r->prompt_ids = i == 0 ? Ids{20, 21, 22} : system;
    if (i > 0) r->prompt_ids.push_back(10 + i);
    r->max_tokens = 1;
    batcher.enqueue(r.get());
    requests.push_back(std::move(r));
  }
  const std::vector<uint64_t> order = run_sequential(batcher, **ring, worker, requests);
  // Request 1 is passed over three times, then goes before the rest.
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 3, 4, 1, 5, 6, 7, 8, 9}));
  for (size_t i = 1; i < requests.size(); ++i) {
    EXPECT_EQ(requests[i]->n_cached_tokens, static_cast<int32_t>(system.size())) << i;
  }
  EXPECT_EQ(requests[0]->n_cached_tokens, 0);
  EXPECT_EQ(batcher.stats().prefix_hit_tokens,
            static_cast<int64_t>(system.size()) * 8 + 0);  // the warm-up hit nothing
  for (const auto& r : requests) EXPECT_EQ(r->output_ids, generate_alone(r->prompt_ids, 1, 50));
}

TEST(ContinuousBatcher, PreemptsTheLowestPriorityNewestAndRefusesWhatNeverFits) {
  // Three requests that together outgrow the pool: the low-priority one is preempted, keeps its
  // KV in the cache and resumes from it; a request larger than the pool is refused at once.
  KvSlotAllocator allocator(40);
  BatcherOptions options;
  ContinuousBatcher batcher(allocator, options);
  batcher.set_model(50, 0, {});
  auto ring =
      proto::StepRing::create("litellama-unit-ring-preempt", {64, 8, 200, 0, 4 * 200 + 16 * 8});
  ASSERT_TRUE(ring.is_ok());
  std::vector<std::unique_ptr<Request>> requests;
  const int32_t priorities[] = {1, 0, 1, 5};
  for (int i = 0; i < 4; ++i) {
    auto r = std::make_unique<Request>();
    r->id = static_cast<uint64_t>(i + 1);
    r->prompt_ids = {i, 1, 2, 3, 4};
    r->max_tokens = i == 3 ? 36 : 14;  // the last needs 41 slots: more than the pool
    r->priority = priorities[i];
    batcher.enqueue(r.get());
    requests.push_back(std::move(r));
  }
  FakeWorker worker;
  worker.kv.assign(40, 0);
  std::vector<Request*> rejected, updated;
  for (uint64_t step_id = 1; step_id < 500 && batcher.has_work(); ++step_id) {
    auto plan = batcher.plan(step_id, (*ring)->buffer(0), (*ring)->limits(), &rejected);
    ASSERT_TRUE(plan.has_value());
    worker.run((*ring)->buffer(0));
    batcher.complete(*plan, (*ring)->buffer(0).sampled_ids.first(plan->request_ids.size()),
                     &updated);
  }
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0]->id, 4u);
  EXPECT_NE(rejected[0]->reject_reason.find("exceeds the KV pool of 40 slots by 1"),
            std::string::npos)
      << rejected[0]->reject_reason;
  EXPECT_GT(batcher.stats().preemptions, 0);
  EXPECT_GT(requests[1]->n_preemptions, 0);  // priority 0: the one to go
  EXPECT_EQ(requests[0]->n_preemptions, 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(requests[i]->finish, RequestFinish::kLength);
    EXPECT_EQ(requests[i]->output_ids, generate_alone(requests[i]->prompt_ids, 14, 50)) << i;
  }
}

}  // namespace
}  // namespace litellama
