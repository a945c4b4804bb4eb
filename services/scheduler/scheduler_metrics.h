// SchedulerMetrics: the scheduler's Prometheus series (litellama_scheduler_*). Latencies are
// histograms in seconds; counters end in _total.
#pragma once

#include <memory>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

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
  prometheus::Gauge* kv_slots_reserved;
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
  prometheus::Family<prometheus::Counter>* requests_finished_family;
  prometheus::Family<prometheus::Counter>* protocol_errors_family;

  prometheus::Counter& requests_finished(const char* reason);
  prometheus::Counter& protocol_errors(const char* socket);
};

}  // namespace litellama
