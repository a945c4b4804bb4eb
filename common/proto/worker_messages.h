// Scheduler <-> worker hop. The worker connects a DEALER to the scheduler's worker ROUTER and
// announces itself with WorkerHeartbeat (repeated every interval, also while loading). Step data
// never rides here: the scheduler writes a step into one of the two buffers of the worker's
// shared-memory StepRing (step_ring.h) and rings the doorbell with a StepRequest; the worker
// answers with a StepResult after writing the sampled ids into the same buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/proto/codec.h"

namespace litellama::proto {

// worker -> scheduler, every heartbeat interval and at start.
struct WorkerHeartbeat {
  static constexpr MessageType kType = MessageType::kWorkerHeartbeat;
  uint64_t incarnation = 0;    // random per process start: a restart is a new worker
  bool ready = false;          // false while loading; the fields below are valid once ready
  std::string step_ring_name;  // Boost.Interprocess shared-memory object of the StepRing
  std::string model;
  std::string device;
  std::string dtype;  // compute dtype, torch name ("bfloat16")
  int32_t n_kv_slots = 0;
  int32_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  std::vector<int32_t> eos_token_ids;
  // The worker reads image rows from the vision service's shared-memory pool (a LLaVA model on a
  // backend that reads host rows by index); false: steps must carry no images.
  bool reads_images = false;
  MSGPACK_DEFINE_MAP(incarnation, ready, step_ring_name, model, device, dtype, n_kv_slots,
                     vocab_size, max_position_embeddings, eos_token_ids, reads_images);
};

// scheduler -> worker: run the step written in ring buffer `buffer`. Steps run in step_id order;
// a token id < 0 in the step names the id sampled for sequence (-id - 1) by the step run just
// before it, so the scheduler can queue step N+1 while step N runs.
struct StepRequest {
  static constexpr MessageType kType = MessageType::kStepRequest;
  uint64_t step_id = 0;
  int32_t buffer = 0;
  uint64_t incarnation = 0;  // the worker this step was planned for
  int64_t sent_unix_ns = 0;
  MSGPACK_DEFINE_MAP(step_id, buffer, incarnation, sent_unix_ns);
};

// worker -> scheduler: the step ran (sampled ids are in its buffer) or failed. Steps answer in
// step_id order; the scheduler knows which buffer each one used.
struct StepResult {
  static constexpr MessageType kType = MessageType::kStepResult;
  uint64_t step_id = 0;
  bool ok = false;
  std::string error;
  MSGPACK_DEFINE_MAP(step_id, ok, error);
};

}  // namespace litellama::proto
