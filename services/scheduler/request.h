// Request: everything the scheduler knows about one generation request, from arrival to its last
// chunk. The ContinuousBatcher owns the generation fields (slots, fed/pending counts, outputs);
// the SchedulerService owns the client, tokenizer and streaming fields.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/proto/client_messages.h"

namespace litellama {

enum class RequestState {
  kTokenizing,  // waiting for the tokenizer's EncodeReply
  kImages,      // waiting for its images' embeddings (vision service)
  kWaiting,     // in the admission queue
  kRunning,     // admitted: holds KV slots and is part of the running batch
  kFinished,    // generation over (finish_reason set); text may still be flushing
};

// Context tokens before the first generated id in a detokenization window, so that the first
// delta gets leading spaces and multi-byte pieces right.
inline constexpr int32_t kDetokenizeContext = 5;

enum class RequestFinish { kStop, kLength, kAbort, kError };
const char* request_finish_name(RequestFinish finish);

// One image of a request: its reuse key, its slot in the vision service's embedding pool and
// where its rows go in the prompt.
struct RequestImage {
  uint64_t hash = 0;      // hash_image_bytes of the bytes
  std::string bytes;      // kept until the image is sent to be encoded
  int32_t slot = -1;      // pool slot once assigned
  bool acquired = false;  // holds a reference in the scheduler's ImageTable
  bool ready = false;     // the rows are in the pool
  int32_t pos = -1;       // prompt position of its first row (image_rows rows)
  // When the vision service completed the rows this request waited for (its clock, Unix ns),
  // until the first step that reads them carries it to the worker; 0: none to report (the image
  // was held already, or it was reported).
  int64_t ready_unix_ns = 0;
};

struct Request {
  uint64_t id = 0;  // scheduler-assigned, unique for the scheduler's lifetime
  RequestState state = RequestState::kTokenizing;

  // Input and limits.
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS ids
  bool ignore_eos = false;
  int32_t n_top_logits = 0;    // top logits wanted for the first generated position (0: none)
  bool logprobs = false;       // logprobs of every generated token
  int32_t n_top_logprobs = 0;  // with logprobs: the most likely ids of each position, 0..20
  // Larger runs first; first come first served within a priority.
  int32_t priority = 0;
  // Images (LLaVA), in prompt order, each image_rows positions long.
  std::vector<RequestImage> images;
  int32_t image_rows = 0;
  // The vision process that encoded its images is gone: it runs on while its KV (or the prefix
  // cache) covers its images, and fails if a step would need their rows again.
  bool images_lost = false;

  // Generation (ContinuousBatcher).
  std::vector<int32_t> output_ids;  // sampled ids known so far
  int32_t n_pending = 0;            // ids sampled by in-flight steps, not yet known
  int32_t n_fed = 0;                // positions whose KV is written or being written
  std::vector<int32_t> slots;       // KV slot of each fed position
  // Its slot table in the worker's (proto::StepRing): entries [table_base, table_base +
  // table_cap), of which the first table_sent were sent in epoch table_epoch (0: none).
  int64_t table_base = 0;
  int32_t table_cap = 0;
  int32_t table_sent = 0;
  uint32_t table_epoch = 0;
  uint64_t last_step_id = 0;         // last step that includes this request
  uint64_t last_sample_step_id = 0;  // last step that samples for it
  std::optional<RequestFinish> finish;
  uint64_t arrival_seq = 0;     // queue order within a priority (kept across preemption)
  uint64_t admit_seq = 0;       // order of the latest admission (newest is preempted first)
  bool validated = false;       // checked against the model and the pool
  int32_t n_passed_over = 0;    // admissions that preferred a later request with a longer prefix
  int32_t n_cached_tokens = 0;  // prompt tokens served from the prefix cache at first admission
  bool admitted_once = false;
  int32_t n_preemptions = 0;
  // (id, raw logit) of the first generated position, largest first, once it is sampled.
  std::vector<std::pair<int32_t, float>> top_logits;
  // With logprobs, aligned with output_ids: the sampled id's logprob and the (id, logprob) of
  // the n_top_logprobs most likely ids, most likely first (of the raw distribution).
  std::vector<float> output_logprobs;
  std::vector<std::vector<std::pair<int32_t, float>>> output_top_logprobs;
  // Per output id whose text came back (with logprobs): the bytes of the id alone, then of each
  // of its top ids (the tokenizer's token_bytes).
  std::vector<std::vector<std::string>> output_pieces;

  // Client and streaming (SchedulerService).
  std::string client;  // ROUTER identity of the client
  uint64_t client_request_id = 0;
  bool client_gone = false;
  std::vector<std::string> stop_strings;
  bool skip_special_tokens = true;
  int32_t detok_prefix = 0;  // detokenization window start (index into prompt + outputs)
  int32_t detok_read = 0;    // ids before this were turned into text already
  bool detok_in_flight = false;
  bool detok_flushed = false;  // the final (flushing) window came back
  std::string text;            // output text so far (cut at a stop string)
  size_t n_text_sent = 0;
  size_t n_ids_sent = 0;
  uint64_t tokenizer_op = 0;  // pending encode or detokenize batch id (0: none)
  // Tokenizers that died or went silent holding this request's work; past a limit the request
  // fails instead of being re-sent (a prompt that kills every tokenizer must not loop forever).
  int32_t n_tokenizer_losses = 0;
  std::string reject_reason;  // why the batcher refused it (which limit, by how much)

  // Timings (monotonic seconds).
  double t_arrival = 0.0;
  double t_scheduled = 0.0;
  double t_images = 0.0;  // when it started waiting for its images
  double t_first_token = 0.0;
  double t_last_token = 0.0;

  int32_t n_prompt() const { return static_cast<int32_t>(prompt_ids.size()); }
  int32_t n_generated() const { return static_cast<int32_t>(output_ids.size()); }
  int32_t n_known() const { return n_prompt() + n_generated(); }
  // Token at index k of prompt + outputs (k < n_prompt() + n_generated()).
  int32_t token_at(int32_t k) const {
    return k < n_prompt() ? prompt_ids[static_cast<size_t>(k)]
                          : output_ids[static_cast<size_t>(k - n_prompt())];
  }
};

}  // namespace litellama
