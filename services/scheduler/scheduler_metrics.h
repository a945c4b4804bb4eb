// SchedulerMetrics: the scheduler's Prometheus series (litellama_scheduler_*). Latencies are
// histograms in seconds; counters end in _total.
#pragma once

#include <memory>
#include <set>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "services/scheduler/continuous_batcher.h"
#include "services/scheduler/kv_slot_allocator.h"

namespace litellama {

struct SchedulerMetrics {
  explicit SchedulerMetrics(std::shared_ptr<prometheus::Registry> registry);

  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Histogram* time_to_first_token;
  prometheus::Histogram* inter_token_latency;
  prometheus::Histogram* e2e_request_latency;
  prometheus::Histogram* queue_time;
  prometheus::Histogram* hop_worker_step;
  prometheus::Histogram* hop_tokenizer_encode;
  prometheus::Histogram* hop_tokenizer_detokenize;
  prometheus::Histogram* hop_client_chunk;  // step result received -> chunk sent to the client
  prometheus::Gauge* requests_running;
  prometheus::Gauge* requests_waiting;
  prometheus::Gauge* kv_slots_used;
  prometheus::Gauge* kv_slots_cached;
  prometheus::Gauge* prefix_cache_tokens;
  prometheus::Gauge* kv_slots_capacity;
  prometheus::Gauge* worker_up;
  prometheus::Gauge* tokenizers_up;
  prometheus::Counter* prompt_tokens;
  prometheus::Counter* generation_tokens;
  prometheus::Counter* steps;
  prometheus::Counter* aborts;
  prometheus::Counter* worker_restarts;
  prometheus::Counter* workers_refused;
  prometheus::Counter* tokenizer_retries_exhausted;
  prometheus::Counter* prefix_cache_queried_tokens;
  prometheus::Counter* prefix_cache_hit_tokens;
  prometheus::Counter* prefix_cache_evicted_tokens;
  prometheus::Counter* preemptions;
  prometheus::Counter* requests_overloaded;
  // Images: each image of a request either found in the vision pool (reused: held by another
  // request or cached) or sent to be encoded; the pool's slots by state.
  prometheus::Counter* images_reused;
  prometheus::Counter* images_encoded;
  prometheus::Gauge* image_slots_referenced;
  prometheus::Gauge* image_slots_cached;
  prometheus::Gauge* image_slots_free;
  prometheus::Gauge* vision_up;
  prometheus::Family<prometheus::Gauge>* requests_waiting_by_priority_family;
  prometheus::Family<prometheus::Counter>* requests_finished_family;
  prometheus::Family<prometheus::Counter>* protocol_errors_family;

  prometheus::Counter& requests_finished(const char* reason);
  prometheus::Counter& protocol_errors(const char* socket);
  prometheus::Gauge& requests_waiting_by_priority(int priority);

  // Brings the KV, prefix-cache, preemption and per-priority series up to date (while requests
  // run at most ten times a second).
  void update_batcher(const ContinuousBatcher& batcher, const KvSlotAllocator& allocator,
                      double now);

 private:
  // What the counters were last brought up to (the batcher's counts grow for ever).
  BatcherStats reported_;
  int64_t reported_evictions_ = 0;
  double last_update_ = -1.0;
  std::set<int32_t> waiting_priorities_;  // priorities with a series (set to 0 when empty)
};

}  // namespace litellama
