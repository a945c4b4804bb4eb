#include "services/scheduler/scheduler_metrics.h"

#include "common/net/metric_families.h"

namespace litellama {

using net::counter;
using net::counter_family;
using net::gauge;
using net::gauge_family;
using net::histogram;
using net::histogram_family;

namespace {

// 1 ms .. ~60 s, roughly x2 per bucket.
prometheus::Histogram::BucketBoundaries latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02,  0.04,  0.08,  0.16, 0.32,
          0.64,  1.28,   2.56,  5.12, 10.24, 20.48, 40.96, 81.92};
}

prometheus::Histogram::BucketBoundaries hop_buckets() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,    0.1,    0.25,    0.5,    1.0,   2.5,    5.0,   10.0};
}

}  // namespace

SchedulerMetrics::SchedulerMetrics(std::shared_ptr<prometheus::Registry> reg)
    : registry(std::move(reg)) {
  prometheus::Registry& r = *registry;
  time_to_first_token =
      histogram(r, "litellama_scheduler_time_to_first_token_seconds",
                "Arrival of a request to its first generated token", latency_buckets());
  inter_token_latency =
      histogram(r, "litellama_scheduler_inter_token_latency_seconds",
                "Time between consecutive generated tokens of a request", latency_buckets());
  e2e_request_latency = histogram(r, "litellama_scheduler_e2e_request_latency_seconds",
                                  "Arrival of a request to its last chunk", latency_buckets());
  queue_time = histogram(r, "litellama_scheduler_queue_time_seconds",
                         "Arrival of a request to its first scheduled step", latency_buckets());
  auto& hop = histogram_family(r, "litellama_scheduler_hop_duration_seconds",
                               "Round trip of one process hop as seen by the scheduler");
  hop_worker_step = &hop.Add({{"hop", "worker_step"}}, hop_buckets());
  hop_tokenizer_encode = &hop.Add({{"hop", "tokenizer_encode"}}, hop_buckets());
  hop_tokenizer_detokenize = &hop.Add({{"hop", "tokenizer_detokenize"}}, hop_buckets());
  hop_client_chunk = &hop.Add({{"hop", "step_to_client_chunk"}}, hop_buckets());
  requests_running = gauge(r, "litellama_scheduler_requests_running", "Requests in the batch");
  requests_waiting =
      gauge(r, "litellama_scheduler_requests_waiting", "Requests waiting for admission");
  kv_slots_used = gauge(r, "litellama_scheduler_kv_slots_used",
                        "KV slots used by requests (cached prefixes they share included)");
  kv_slots_cached =
      gauge(r, "litellama_scheduler_kv_slots_cached",
            "KV slots held only by the prefix cache (evictable); used + cached + free = capacity");
  prefix_cache_tokens = gauge(r, "litellama_scheduler_prefix_cache_tokens",
                              "Tokens whose KV the prefix cache holds (in use or not)");
  kv_slots_capacity =
      gauge(r, "litellama_scheduler_kv_slots_capacity", "KV slots of the worker's pool");
  worker_up = gauge(r, "litellama_scheduler_worker_up", "1 while a worker is registered");
  tokenizers_up = gauge(r, "litellama_scheduler_tokenizers_up", "Tokenizer processes alive");
  prompt_tokens =
      counter(r, "litellama_scheduler_prompt_tokens_total", "Prompt tokens of admitted requests");
  generation_tokens = counter(r, "litellama_scheduler_generation_tokens_total", "Generated tokens");
  steps = counter(r, "litellama_scheduler_steps_total", "Steps run by the worker");
  aborts = counter(r, "litellama_scheduler_aborts_total",
                   "Requests aborted by the client or because the client went away");
  worker_restarts = counter(r, "litellama_scheduler_worker_lost_total",
                            "Times the registered worker was lost or replaced");
  workers_refused = counter(r, "litellama_scheduler_workers_refused_total",
                            "Other workers kept as standby because a worker was already serving");
  tokenizer_retries_exhausted =
      counter(r, "litellama_scheduler_tokenizer_retries_exhausted_total",
              "Requests failed because every tokenizer given their work died or stalled on it");
  prefix_cache_queried_tokens =
      counter(r, "litellama_scheduler_prefix_cache_queried_tokens_total",
              "Prompt tokens of admitted requests looked up in the prefix cache");
  prefix_cache_hit_tokens =
      counter(r, "litellama_scheduler_prefix_cache_hit_tokens_total",
              "Prompt tokens of admitted requests whose KV came from the prefix cache");
  prefix_cache_evicted_tokens = counter(r, "litellama_scheduler_prefix_cache_evicted_tokens_total",
                                        "Cached tokens evicted to make room");
  preemptions = counter(r, "litellama_scheduler_preemptions_total",
                        "Running requests preempted (by recompute) when KV slots ran out");
  requests_overloaded = counter(r, "litellama_scheduler_requests_overloaded_total",
                                "Requests refused at once because the waiting queue was full");
  auto& images = counter_family(r, "litellama_scheduler_images_total",
                                "Images of requests: reused from the vision pool or encoded");
  images_reused = &images.Add({{"outcome", "reused"}});
  images_encoded = &images.Add({{"outcome", "encoded"}});
  auto& image_slots =
      gauge_family(r, "litellama_scheduler_image_slots", "Slots of the vision pool, by state");
  image_slots_referenced = &image_slots.Add({{"state", "referenced"}});
  image_slots_cached = &image_slots.Add({{"state", "cached"}});
  image_slots_free = &image_slots.Add({{"state", "free"}});
  vision_up = gauge(r, "litellama_scheduler_vision_up", "1 while a vision service is up");
  requests_waiting_by_priority_family =
      &gauge_family(r, "litellama_scheduler_requests_waiting_by_priority",
                    "Requests waiting for admission, by priority");
  requests_waiting_by_priority(0);
  requests_finished_family = &counter_family(r, "litellama_scheduler_requests_finished_total",
                                             "Finished requests by finish reason");
  protocol_errors_family = &counter_family(r, "litellama_scheduler_protocol_errors_total",
                                           "Unknown or malformed messages, by socket");
  for (const char* reason : {"stop", "length", "abort", "error"}) requests_finished(reason);
  for (const char* socket : {"client", "worker", "tokenizer"}) protocol_errors(socket);
}

prometheus::Counter& SchedulerMetrics::requests_finished(const char* reason) {
  return requests_finished_family->Add({{"reason", reason}});
}

prometheus::Gauge& SchedulerMetrics::requests_waiting_by_priority(int priority) {
  return requests_waiting_by_priority_family->Add({{"priority", std::to_string(priority)}});
}

void SchedulerMetrics::update_batcher(const ContinuousBatcher& batcher,
                                      const KvSlotAllocator& allocator, double now) {
  // While requests run, at most ten times a second; when idle, every time (cheap then).
  if (batcher.n_running() > 0 && last_update_ >= 0.0 && now - last_update_ < 0.1) return;
  last_update_ = now;
  const RadixCache& cache = batcher.cache();
  const int32_t n_cached = cache.n_evictable();
  kv_slots_used->Set(allocator.n_used() - n_cached);
  kv_slots_cached->Set(n_cached);
  prefix_cache_tokens->Set(cache.n_cached_slots());
  auto grow = [](prometheus::Counter* c, int64_t value, int64_t* last) {
    if (value > *last) c->Increment(static_cast<double>(value - *last));
    *last = value;
  };
  const BatcherStats& stats = batcher.stats();
  grow(prefix_cache_queried_tokens, stats.prefix_queried_tokens, &reported_.prefix_queried_tokens);
  grow(prefix_cache_hit_tokens, stats.prefix_hit_tokens, &reported_.prefix_hit_tokens);
  grow(preemptions, stats.preemptions, &reported_.preemptions);
  grow(prefix_cache_evicted_tokens, cache.n_evictions(), &reported_evictions_);
  const std::map<int32_t, int32_t> by_priority = batcher.n_waiting_by_priority();
  for (int32_t p : waiting_priorities_) {
    if (!by_priority.count(p)) requests_waiting_by_priority(p).Set(0);
  }
  for (const auto& [p, n] : by_priority) {
    requests_waiting_by_priority(p).Set(n);
    waiting_priorities_.insert(p);
  }
}

prometheus::Counter& SchedulerMetrics::protocol_errors(const char* socket) {
  return protocol_errors_family->Add({{"socket", socket}});
}

}  // namespace litellama
