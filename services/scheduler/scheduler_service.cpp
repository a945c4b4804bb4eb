#include "services/scheduler/scheduler_service.h"

#include <algorithm>
#include <cmath>

#include "common/log.h"
#include "common/net/run_dir.h"
#include "common/net/zmq_util.h"
#include "common/proto/heartbeat.h"
#include "services/scheduler/request_fields.h"

namespace litellama {

namespace {

using net::frame_view;
using net::monotonic_seconds;
using net::SendResult;

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
constexpr size_t kMaxPromptIds = size_t{1} << 20;

size_t max_stop_length(const Request& r) {
  size_t n = 0;
  for (const auto& s : r.stop_strings) n = std::max(n, s.size());
  return n;
}

}  // namespace

SchedulerService::SchedulerService(SchedulerOptions options)
    : options_(std::move(options)),
      registry_(std::make_shared<prometheus::Registry>()),
      metrics_data_(registry_),
      batcher_(allocator_, options_.batcher) {
  incarnation_ = net::random_id();
  // Results a worker still had queued for a previous scheduler reach this one after a restart;
  // step ids starting at a random point per incarnation keep them from matching a step of ours.
  next_step_id_ = (incarnation_ & ~uint64_t{0xffffff}) | 1;
}

SchedulerService::~SchedulerService() = default;

Status SchedulerService::start() {
  LITELLAMA_RETURN_IF_ERROR(
      net::check_liveness_flags(options_.heartbeat_interval_ms, options_.peer_timeout_ms));
  try {
    clients_ = zmq::socket_t(context_, zmq::socket_type::router);
    workers_ = zmq::socket_t(context_, zmq::socket_type::router);
    tokenizers_ = zmq::socket_t(context_, zmq::socket_type::router);
    const std::pair<zmq::socket_t*, const std::string*> sockets[] = {
        {&clients_, &options_.client_endpoint},
        {&workers_, &options_.worker_endpoint},
        {&tokenizers_, &options_.tokenizer_endpoint}};
    vision_ = zmq::socket_t(context_, zmq::socket_type::router);
    for (const auto& [socket, endpoint] : sockets) {
      LITELLAMA_RETURN_IF_ERROR(net::prepare_endpoint(*endpoint, options_.allow_insecure_tcp));
      // Held until the scheduler exits: a second scheduler on these paths is refused.
      LITELLAMA_ASSIGN_OR_RETURN(auto lock, net::ListenerLock::acquire(*endpoint));
      listener_locks_.push_back(std::move(lock));
      net::configure_router(*socket);
      socket->bind(*endpoint);
      LITELLAMA_RETURN_IF_ERROR(net::restrict_ipc_socket(*endpoint));
    }
    if (!options_.vision_endpoint.empty()) {
      const std::string& endpoint = options_.vision_endpoint;
      LITELLAMA_RETURN_IF_ERROR(net::prepare_endpoint(endpoint, options_.allow_insecure_tcp));
      LITELLAMA_ASSIGN_OR_RETURN(auto lock, net::ListenerLock::acquire(endpoint));
      listener_locks_.push_back(std::move(lock));
      net::configure_router(vision_);
      vision_.bind(endpoint);
      LITELLAMA_RETURN_IF_ERROR(net::restrict_ipc_socket(endpoint));
    }
  } catch (const zmq::error_t& e) {
    return make_error(StatusCode::kUnavailable, "cannot bind the scheduler's sockets: {}",
                      e.what());
  }
  if (!options_.metrics_listen.empty()) {
    LITELLAMA_ASSIGN_OR_RETURN(metrics_,
                               net::MetricsServer::start(options_.metrics_listen, registry_,
                                                         [this] { return ready_reason(); }));
  }
  LITELLAMA_LOG_INFO("scheduler: clients on {}, worker on {}, tokenizers on {}, metrics on {}",
                     options_.client_endpoint, options_.worker_endpoint,
                     options_.tokenizer_endpoint,
                     metrics_ ? std::to_string(metrics_->port()) : std::string("(off)"));
  return Status::ok();
}

std::string SchedulerService::ready_reason() const {
  if (!worker_up_.load()) {
    return worker_loading_.load() ? "worker is loading" : "no worker is up";
  }
  if (n_tokenizers_up_.load() == 0) return "no tokenizer is up";
  return "";
}

void SchedulerService::run() {
  std::vector<zmq::message_t> frames;
  while (!stop_.load()) {
    net::wait_readable({&clients_, &workers_, &tokenizers_, &vision_},
                       std::max(1, options_.heartbeat_interval_ms / 2));
    // Worker results first: they free the pipeline for the next step.
    while (net::recv_frames(workers_, &frames)) on_worker_frames(frames);
    while (net::recv_frames(tokenizers_, &frames)) on_tokenizer_frames(frames);
    while (net::recv_frames(vision_, &frames)) on_vision_frames(frames);
    // Right after the peers' queues are drained: time this loop spent on other work (a large
    // client message, a long step result) must never read as a peer's silence.
    check_peers_alive();
    for (int i = 0; i < 256 && net::recv_frames(clients_, &frames); ++i) on_client_frames(frames);
    dispatch_encodes();
    schedule_steps();
    dispatch_detokenize();
    on_tick();
    update_gauges();
  }
  // Answer everyone still waiting: the scheduler is going away.
  std::vector<Request*> open;
  for (auto& [id, r] : requests_) open.push_back(r.get());
  for (Request* r : open) fail(r, StatusCode::kUnavailable, "the scheduler is shutting down");
  LITELLAMA_LOG_INFO("scheduler: stopped");
}

void SchedulerService::protocol_error(const char* socket, const Status& why) {
  metrics_data_.protocol_errors(socket).Increment();
  LITELLAMA_LOG_WARN("scheduler: dropped a message on the {} socket: {}", socket, why.to_string());
}

// ---- clients -----------------------------------------------------------------------------------

void SchedulerService::on_client_frames(std::vector<zmq::message_t>& frames) {
  if (frames.size() < 2) return;  // a ROUTER always prepends the sender's identity
  const std::string client(frame_view(frames[0]));
  if (frames.size() > 2) {
    // A generate request with images: [identity, request, image bytes...].
    auto head = proto::decode<proto::GenerateRequest>(frame_view(frames[1]));
    if (head && head->n_images > 0 && static_cast<size_t>(head->n_images) == frames.size() - 2) {
      std::vector<std::string> images;
      for (size_t i = 2; i < frames.size(); ++i) images.emplace_back(frame_view(frames[i]));
      on_generate(client, *head, std::move(images));
      return;
    }
  }
  if (frames.size() != 2) {
    protocol_error("client", make_error(StatusCode::kInvalidArgument, "expected 1 frame, got {}",
                                        frames.size() - 1));
    send_error(client, proto::peek_request_id(frame_view(frames[1])), StatusCode::kInvalidArgument,
               fmt::format("a message must be one ZeroMQ frame (a generate_request with "
                           "n_images: one more per image); this one had {} (nothing of it "
                           "was done)",
                           frames.size() - 1));
    return;
  }
  auto envelope = proto::Envelope::parse(frame_view(frames[1]));
  if (!envelope) {
    protocol_error("client", envelope.status());
    // The envelope's error names the version or what is missing, never the sender's bytes.
    send_error(client, proto::peek_request_id(frame_view(frames[1])), envelope.status().code(),
               envelope.status().message());
    return;
  }
  Status malformed;
  switch (envelope->type()) {
    case proto::MessageType::kGenerateRequest: {
      auto msg = envelope->as<proto::GenerateRequest>();
      if (!msg) {
        malformed = msg.status();
        break;
      }
      on_generate(client, *msg);
      return;
    }
    case proto::MessageType::kAbortRequest: {
      auto msg = envelope->as<proto::AbortRequest>();
      if (!msg) {
        malformed = msg.status();
        break;
      }
      on_abort(client, *msg);
      return;
    }
    case proto::MessageType::kServerInfoRequest: {
      auto msg = envelope->as<proto::ServerInfoRequest>();
      if (!msg) {
        malformed = msg.status();
        break;
      }
      on_server_info(client, *msg);
      return;
    }
    default:
      malformed = make_error(StatusCode::kInvalidArgument, "'{}' is not a message clients send",
                             proto::message_type_name(envelope->type()));
      break;
  }
  protocol_error("client", malformed);
  // as<T>() names the message and the field of the wrong type (one of our field names).
  send_error(client, proto::peek_request_id(frame_view(frames[1])), StatusCode::kInvalidArgument,
             malformed.message());
}

void SchedulerService::send_error(const std::string& client, uint64_t client_request_id,
                                  StatusCode code, const std::string& message,
                                  uint64_t duplicate_request_id) {
  proto::RequestError error;
  error.request_id = client_request_id;
  error.duplicate_request_id = duplicate_request_id;
  error.code = status_code_name(code);
  error.message = message;
  (void)net::send_to(clients_, client, proto::encode(error));
}

void SchedulerService::on_generate(const std::string& client, const proto::GenerateRequest& msg,
                                   std::vector<std::string> images) {
  auto reject = [&](const std::string& why) {
    send_error(client, msg.request_id, StatusCode::kInvalidArgument, why);
  };
  if (by_client_.count({client, msg.request_id})) {
    // Not under the live request's id: the client would take it for that request's end.
    send_error(client, 0, StatusCode::kInvalidArgument,
               fmt::format("duplicate request_id {}: a request with this id is still open on "
                           "this connection; this one was refused and the open one goes on",
                           msg.request_id),
               msg.request_id);
    return;
  }
  // kMaxTokensRestOfContext is resolved at admission, when the prompt's length is known.
  if ((msg.max_tokens < 1 && msg.max_tokens != proto::kMaxTokensRestOfContext) ||
      msg.max_tokens > options_.max_tokens_limit) {
    return reject(
        fmt::format("max_tokens {} is outside [1, {}]", msg.max_tokens, options_.max_tokens_limit));
  }
  if (Status st = validate_sampling(msg.sampling); !st) return reject(st.message());
  if (msg.stop.size() > kMaxStopStrings) return reject("too many stop strings");
  for (const auto& s : msg.stop) {
    if (s.empty() || s.size() > kMaxStopStringBytes) return reject("bad stop string length");
  }
  if (msg.prompt_ids.size() > kMaxPromptIds) {
    return reject(fmt::format("prompt_ids has {} ids, over the limit of {}", msg.prompt_ids.size(),
                              kMaxPromptIds));
  }
  if (msg.prompt_ids.empty()) {
    int64_t n_bytes = static_cast<int64_t>(msg.prompt.size());
    for (const auto& m : msg.messages) {
      n_bytes += static_cast<int64_t>(m.role.size() + m.content.size());
      // Typed parts repeat the content: they count too (with a little for each part, so that
      // no number of empty parts is free).
      for (const auto& p : m.parts)
        n_bytes += static_cast<int64_t>(p.type.size() + p.text.size() + 8);
    }
    if (n_bytes > options_.max_prompt_bytes) {
      return reject(
          fmt::format("the prompt is {} bytes, over the limit of {} bytes "
                      "(--max-prompt-bytes)",
                      n_bytes, options_.max_prompt_bytes));
    }
  }
  static_assert(proto::kMaxTopLogits == 64, "update the message below");
  if (msg.top_logits < 0 || msg.top_logits > proto::kMaxTopLogits) {
    return reject("top_logits must be in [0, 64]");
  }
  if (Status st = validate_logprobs(msg); !st) return reject(st.message());
  if (msg.n_images != static_cast<int32_t>(images.size())) {
    return reject(fmt::format("n_images is {} but {} image frames came with the request",
                              msg.n_images, images.size()));
  }
  if (!images.empty()) {
    if (static_cast<int32_t>(images.size()) > options_.max_images_per_request) {
      return reject(fmt::format("{} images, over the limit of {} per request", images.size(),
                                options_.max_images_per_request));
    }
    for (size_t i = 0; i < images.size(); ++i) {
      if (images[i].empty()) return reject(fmt::format("image {} is empty", i));
      if (static_cast<int64_t>(images[i].size()) > options_.max_image_bytes) {
        return reject(
            fmt::format("image {} is {} bytes, over the limit of {} bytes "
                        "(--max-image-bytes)",
                        i, images[i].size(), options_.max_image_bytes));
      }
    }
    if (!vision_peer_) {
      send_error(client, msg.request_id, StatusCode::kUnavailable,
                 "the request has images but no vision service is up (images need "
                 "litellama-vision and a LLaVA model)");
      return;
    }
  }

  if (options_.max_waiting_requests > 0) {
    const int64_t n_waiting =
        static_cast<int64_t>(batcher_.n_waiting()) + static_cast<int64_t>(pending_encodes_.size());
    if (n_waiting >= options_.max_waiting_requests) {
      metrics_data_.requests_overloaded->Increment();
      send_error(client, msg.request_id, StatusCode::kOverloaded,
                 fmt::format("the server is overloaded: {} requests are waiting "
                             "(--max-waiting-requests {})",
                             n_waiting, options_.max_waiting_requests));
      return;
    }
  }
  auto owned = std::make_unique<Request>();
  Request* r = owned.get();
  r->id = next_request_id_++;
  r->client = client;
  r->client_request_id = msg.request_id;
  r->sampling = msg.sampling;
  r->max_tokens = msg.max_tokens;
  r->stop_token_ids = msg.stop_token_ids;
  r->ignore_eos = msg.ignore_eos;
  r->n_top_logits = msg.top_logits;
  r->logprobs = msg.logprobs;
  r->n_top_logprobs = msg.logprobs ? msg.top_logprobs : 0;
  r->priority = msg.priority;
  r->stop_strings = msg.stop;
  r->skip_special_tokens = msg.skip_special_tokens;
  r->t_arrival = monotonic_seconds();
  r->t_last_token = r->t_arrival;
  for (std::string& bytes : images) {
    RequestImage image;
    image.hash = hash_image_bytes(bytes);
    image.bytes = std::move(bytes);
    r->images.push_back(std::move(image));
  }
  requests_[r->id] = std::move(owned);
  by_client_[{client, msg.request_id}] = r->id;

  if (!msg.prompt_ids.empty()) {
    r->prompt_ids = msg.prompt_ids;
    LITELLAMA_LOG_INFO("request {}: accepted ({} prompt ids, {} images, max_tokens {})", r->id,
                       r->n_prompt(), r->images.size(), r->max_tokens);
    start_generation(r);  // may fail r
    return;
  }
  // Keep the text to encode in a pending op until a tokenizer takes it.
  r->state = RequestState::kTokenizing;
  proto::EncodeRequest encode;
  encode.text = msg.prompt;
  encode.messages = msg.messages;
  encode.add_special_tokens = msg.add_special_tokens;
  pending_encodes_[r->id] = std::move(encode);
  encode_queue_.push_back(r->id);
  LITELLAMA_LOG_INFO("request {}: accepted ({}, max_tokens {})", r->id,
                     msg.messages.empty() ? "text prompt" : "chat messages", r->max_tokens);
}

int64_t SchedulerService::max_model_len(const proto::WorkerHeartbeat& hb) const {
  if (options_.max_model_len <= 0) return hb.max_position_embeddings;
  if (hb.max_position_embeddings <= 0) return options_.max_model_len;
  return std::min<int64_t>(hb.max_position_embeddings, options_.max_model_len);
}

void SchedulerService::on_abort(const std::string& client, const proto::AbortRequest& msg) {
  auto it = by_client_.find({client, msg.request_id});
  if (it == by_client_.end()) return;  // already answered
  auto r = requests_.find(it->second);
  if (r == requests_.end()) return;
  abort(r->second.get(), false);
}

void SchedulerService::on_server_info(const std::string& client,
                                      const proto::ServerInfoRequest& msg) {
  proto::ServerInfoReply reply;
  reply.request_id = msg.request_id;
  reply.worker_up = worker_up_.load();
  reply.n_tokenizers = n_tokenizers_up_.load();
  reply.ready = ready_reason().empty();
  if (worker_) {
    reply.model = worker_->info.model;
    reply.device = worker_->info.device;
    reply.dtype = worker_->info.dtype;
    reply.max_model_len = max_model_len(worker_->info);
    reply.eos_token_ids = worker_->info.eos_token_ids;
    reply.vocab_size = worker_->info.vocab_size;
  }
  reply.n_kv_slots = allocator_.n_total();
  reply.n_kv_slots_used = allocator_.n_used();
  reply.n_requests_running = batcher_.n_running();
  reply.n_requests_waiting = batcher_.n_waiting();
  if (vision_peer_) {
    reply.vision_up = true;
    reply.image_token_id = vision_peer_->info.image_token_id;
    reply.image_tokens = vision_peer_->info.rows_per_slot;
  }
  (void)net::send_to(clients_, client, proto::encode(reply));
}

void SchedulerService::erase(Request* r) {
  batcher_.retire(r);
  release_images(r);
  pending_encodes_.erase(r->id);
  by_client_.erase({r->client, r->client_request_id});
  requests_.erase(r->id);
}

void SchedulerService::fail(Request* r, StatusCode code, const std::string& message) {
  LITELLAMA_LOG_INFO("request {}: failed ({})", r->id, message);
  metrics_data_.requests_finished("error").Increment();
  if (!r->client_gone) send_error(r->client, r->client_request_id, code, message);
  erase(r);
}

void SchedulerService::abort(Request* r, bool client_gone) {
  LITELLAMA_LOG_INFO("request {}: aborted ({})", r->id,
                     client_gone ? "client went away" : "client asked");
  metrics_data_.aborts->Increment();
  r->client_gone = r->client_gone || client_gone;
  batcher_.retire(r);  // slots go back now (or when the step using them returns)
  r->finish = RequestFinish::kAbort;
  r->detok_flushed = true;
  flush(r);
}

void SchedulerService::flush(Request* r) {
  const bool done =
      r->finish.has_value() && (r->detok_flushed || *r->finish == RequestFinish::kAbort);
  if (r->finish && *r->finish == RequestFinish::kError) {
    fail(r, StatusCode::kInternal, "the worker could not run the request");
    return;
  }
  if (!r->client_gone) {
    size_t text_end = r->text.size();
    if (!done && !r->stop_strings.empty()) {
      // Hold back what could still become a stop string.
      const size_t hold = max_stop_length(*r) - 1;
      text_end = text_end > hold ? text_end - hold : 0;
      text_end = std::max(text_end, r->n_text_sent);
      while (text_end > r->n_text_sent &&
             (static_cast<unsigned char>(r->text[text_end]) & 0xC0) == 0x80) {
        --text_end;
      }
    }
    // Ids go out with their text: up to what was detokenized, or all at the end.
    size_t ids_end = done ? r->output_ids.size()
                          : static_cast<size_t>(std::max(0, r->detok_read - r->n_prompt()));
    ids_end = std::min(ids_end, r->output_ids.size());
    if (done || text_end > r->n_text_sent || ids_end > r->n_ids_sent) {
      proto::GenerateChunk chunk;
      chunk.request_id = r->client_request_id;
      chunk.text = r->text.substr(r->n_text_sent, text_end - r->n_text_sent);
      if (ids_end > r->n_ids_sent) {
        chunk.token_ids.assign(r->output_ids.begin() + static_cast<ptrdiff_t>(r->n_ids_sent),
                               r->output_ids.begin() + static_cast<ptrdiff_t>(ids_end));
        if (r->n_ids_sent == 0) chunk.top_logits = r->top_logits;
        if (r->logprobs) append_logprobs(*r, r->n_ids_sent, ids_end, &chunk);
      }
      chunk.finished = done;
      if (done) chunk.finish_reason = request_finish_name(*r->finish);
      chunk.n_prompt_tokens = r->n_prompt();
      chunk.n_cached_tokens = r->n_cached_tokens;
      chunk.n_generated_tokens = r->n_generated();
      if (net::send_to(clients_, r->client, proto::encode(chunk)) == SendResult::kPeerGone) {
        r->client_gone = true;
        if (!r->finish) {
          abort(r, true);
          return;
        }
      } else {
        // Latest token's step result to the chunk that carries it (detokenization included).
        if (ids_end > r->n_ids_sent && r->n_generated() > 0) {
          metrics_data_.hop_client_chunk->Observe(monotonic_seconds() - r->t_last_token);
        }
        r->n_text_sent = text_end;
        r->n_ids_sent = ids_end;
      }
    }
  }
  if (done) {
    const double now = monotonic_seconds();
    metrics_data_.e2e_request_latency->Observe(now - r->t_arrival);
    metrics_data_.requests_finished(request_finish_name(*r->finish)).Increment();
    LITELLAMA_LOG_INFO("request {}: finished ({}, {} prompt + {} generated tokens, {:.3f} s)",
                       r->id, request_finish_name(*r->finish), r->n_prompt(), r->n_generated(),
                       now - r->t_arrival);
    erase(r);
  }
}

// ---- worker ------------------------------------------------------------------------------------

void SchedulerService::on_worker_frames(std::vector<zmq::message_t>& frames) {
  if (frames.size() != 2) {
    protocol_error("worker", Status(StatusCode::kInvalidArgument, "expected 1 frame"));
    return;
  }
  const std::string identity(frame_view(frames[0]));
  auto envelope = proto::Envelope::parse(frame_view(frames[1]));
  if (!envelope) return protocol_error("worker", envelope.status());
  switch (envelope->type()) {
    case proto::MessageType::kWorkerHeartbeat: {
      auto hb = envelope->as<proto::WorkerHeartbeat>();
      if (!hb) return protocol_error("worker", hb.status());
      on_worker_heartbeat(identity, *hb);
      return;
    }
    case proto::MessageType::kStepResult: {
      auto result = envelope->as<proto::StepResult>();
      if (!result) return protocol_error("worker", result.status());
      if (!worker_ || identity != worker_->identity) return;  // from a replaced worker
      worker_->last_seen = monotonic_seconds();
      on_step_result(*result);
      return;
    }
    default:
      protocol_error("worker", Status(StatusCode::kInvalidArgument,
                                      fmt::format("unexpected '{}' message",
                                                  proto::message_type_name(envelope->type()))));
  }
}

void SchedulerService::on_worker_heartbeat(const std::string& identity,
                                           const proto::WorkerHeartbeat& hb) {
  const double now = monotonic_seconds();
  // Heartbeats still queued from a worker whose connection is gone must not revive it.
  if (dead_workers_.count(hb.incarnation)) return;
  if (worker_ && worker_->info.incarnation == hb.incarnation) {
    worker_->last_seen = now;
    return;
  }
  if (worker_ && identity != worker_->identity) {
    // Another worker process while ours is up. If our worker's connection is gone it died and
    // this is its replacement; otherwise the newcomer waits as standby and ours keeps serving
    // (one worker per scheduler: each ring and KV pool is one worker's).
    proto::SchedulerHeartbeat probe;
    probe.incarnation = incarnation_;
    if (net::send_to(workers_, worker_->identity, proto::encode(probe)) == SendResult::kPeerGone) {
      worker_lost("replaced by a new worker", true);
    } else {
      if (standby_workers_.count(identity) == 0) {
        metrics_data_.workers_refused->Increment();
        LITELLAMA_LOG_WARN(
            "scheduler: a second worker ({}) announced itself while {} serves; it is kept as "
            "standby (is a worker unit started twice, or a second serve on this run dir?)",
            identity, worker_->identity);
      }
      standby_workers_[identity] = now;
      return;
    }
  } else if (worker_) {
    // Same connection, new incarnation: that worker restarted behind the same identity.
    const std::string old_ring = worker_->info.step_ring_name;
    worker_lost("restarted", false);
    // Its owner is gone; do not leak the segment (unless the new worker reuses the name).
    if (old_ring != hb.step_ring_name) proto::StepRing::remove(old_ring);
  }
  standby_workers_.erase(identity);
  if (!hb.ready) {
    worker_loading_.store(true);
    return;
  }
  if (hb.n_kv_slots <= 0 || hb.vocab_size <= 0) {
    return protocol_error("worker", Status(StatusCode::kInvalidArgument, "bad worker info"));
  }
  auto ring = proto::StepRing::open(hb.step_ring_name);
  if (!ring) {
    LITELLAMA_LOG_WARN("scheduler: worker's step ring: {}", ring.status().to_string());
    return;
  }
  auto peer = std::make_unique<WorkerPeer>();
  peer->identity = identity;
  peer->info = hb;
  peer->ring = std::move(ring).value();
  peer->last_seen = now;
  worker_ = std::move(peer);
  batcher_.clear_cache(false);  // a new pool: nothing cached is in it
  batcher_.reset_tables();      // and an empty slot table
  allocator_.reset(hb.n_kv_slots);
  std::vector<int32_t> eos = hb.eos_token_ids;
  for (int32_t id : tokenizer_eos_ids_) {
    if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
  }
  batcher_.set_model(hb.vocab_size, max_model_len(hb), eos);
  in_flight_.clear();
  worker_up_.store(true);
  worker_loading_.store(false);
  LITELLAMA_LOG_INFO("scheduler: worker up ({} on {} in {}, {} KV slots, step ring {})", hb.model,
                     hb.device, hb.dtype, hb.n_kv_slots, hb.step_ring_name);
}

void SchedulerService::worker_lost(const char* why, bool disconnected) {
  if (!worker_) return;
  if (disconnected) {
    // The process is gone for sure: never accept it again and free its shared memory.
    dead_workers_.insert(worker_->info.incarnation);
    const std::string ring_name = worker_->info.step_ring_name;
    worker_->ring.reset();
    proto::StepRing::remove(ring_name);
  }
  LITELLAMA_LOG_WARN("scheduler: worker lost ({}); failing its running requests", why);
  metrics_data_.worker_restarts->Increment();
  std::vector<Request*> dropped = batcher_.drop_running();
  for (Request* r : dropped) {
    fail(r, StatusCode::kUnavailable, "the worker stopped while running the request");
  }
  in_flight_.clear();
  worker_.reset();
  allocator_.reset(0);
  worker_up_.store(false);
  worker_loading_.store(false);
}

void SchedulerService::schedule_steps() {
  if (!worker_) return;
  std::vector<Request*> rejected;
  while (in_flight_.size() < proto::kStepRingBuffers && batcher_.has_work()) {
    const int32_t buffer = next_buffer_;
    auto plan = batcher_.plan(next_step_id_, worker_->ring->buffer(buffer), worker_->ring->limits(),
                              &rejected);
    for (Request* r : rejected) {
      if (r->images_lost) {
        fail(r, StatusCode::kUnavailable,
             "the request needs its images again (it was preempted) but " + r->reject_reason);
      } else {
        fail(r, StatusCode::kInvalidArgument,
             "the request does not fit the model: " + r->reject_reason);
      }
    }
    rejected.clear();
    if (!plan) break;
    const double now = monotonic_seconds();
    for (uint64_t id : plan->request_ids) {
      auto it = requests_.find(id);
      if (it != requests_.end() && it->second->t_scheduled == 0.0) {
        // Admitted now: only prompts that get to run count as prompt tokens.
        it->second->t_scheduled = now;
        metrics_data_.queue_time->Observe(now - it->second->t_arrival);
        metrics_data_.prompt_tokens->Increment(it->second->n_prompt());
      }
    }
    proto::StepRequest doorbell;
    doorbell.step_id = plan->step_id;
    doorbell.buffer = buffer;
    doorbell.incarnation = worker_->info.incarnation;
    doorbell.sent_unix_ns = net::unix_now_ns();
    in_flight_.push_back({std::move(*plan), buffer, now});
    ++next_step_id_;
    next_buffer_ = (next_buffer_ + 1) % proto::kStepRingBuffers;
    if (net::send_to(workers_, worker_->identity, proto::encode(doorbell)) != SendResult::kSent) {
      worker_lost("unreachable", true);
      return;
    }
  }
}

void SchedulerService::on_step_result(const proto::StepResult& result) {
  if (in_flight_.empty() || in_flight_.front().plan.step_id != result.step_id) {
    LITELLAMA_LOG_DEBUG("scheduler: ignoring result of step {}", result.step_id);
    return;
  }
  InFlightStep step = std::move(in_flight_.front());
  in_flight_.pop_front();
  const double now = monotonic_seconds();
  metrics_data_.hop_worker_step->Observe(now - step.t_sent);
  metrics_data_.steps->Increment();
  std::vector<Request*> updated;
  if (!result.ok) {
    LITELLAMA_LOG_ERROR("scheduler: step {} failed on the worker: {}", result.step_id,
                        result.error);
    std::vector<int32_t> none(step.plan.request_ids.size(), -1);
    batcher_.complete(step.plan, none, &updated);
    // KV the failed step was writing may sit in the cache: drop every cached prefix.
    batcher_.clear_cache(true);
    // The worker refuses steps of the failed step's table epoch from now on.
    batcher_.reset_tables();
  } else {
    proto::StepView view = worker_->ring->buffer(step.buffer);
    const size_t n = step.plan.request_ids.size();
    StepTopLogits top;
    if (step.plan.n_top_logits > 0) {
      top.ids = view.top_ids.first(n * proto::kMaxStepTopLogits);
      top.values = view.top_values.first(n * proto::kMaxStepTopLogits);
    }
    if (step.plan.logprobs) {
      top.logprobs = view.logprobs.first(n);
      top.lse = view.lse.first(n);
    }
    batcher_.complete(step.plan, std::span<const int32_t>(view.sampled_ids.data(), n), &updated,
                      top);
  }
  for (Request* r : updated) {
    if (r->finish && *r->finish == RequestFinish::kError) {
      fail(r, StatusCode::kInternal, "the worker could not run the request");
      continue;
    }
    metrics_data_.generation_tokens->Increment();
    if (r->n_generated() == 1) {
      r->t_first_token = now;
      metrics_data_.time_to_first_token->Observe(now - r->t_arrival);
    } else {
      metrics_data_.inter_token_latency->Observe(now - r->t_last_token);
    }
    r->t_last_token = now;
  }
}

// ---- tokenizers --------------------------------------------------------------------------------

void SchedulerService::on_tokenizer_frames(std::vector<zmq::message_t>& frames) {
  if (frames.size() != 2) {
    protocol_error("tokenizer", Status(StatusCode::kInvalidArgument, "expected 1 frame"));
    return;
  }
  const std::string identity(frame_view(frames[0]));
  auto envelope = proto::Envelope::parse(frame_view(frames[1]));
  if (!envelope) return protocol_error("tokenizer", envelope.status());
  auto peer = tokenizer_peers_.find(identity);
  if (peer != tokenizer_peers_.end()) peer->second.last_seen = monotonic_seconds();
  switch (envelope->type()) {
    case proto::MessageType::kTokenizerHeartbeat: {
      auto hb = envelope->as<proto::TokenizerHeartbeat>();
      if (!hb) return protocol_error("tokenizer", hb.status());
      on_tokenizer_heartbeat(identity, *hb);
      return;
    }
    case proto::MessageType::kEncodeReply: {
      auto reply = envelope->as<proto::EncodeReply>();
      if (!reply) return protocol_error("tokenizer", reply.status());
      on_encode_reply(*reply);
      return;
    }
    case proto::MessageType::kDetokenizeReply: {
      auto reply = envelope->as<proto::DetokenizeReply>();
      if (!reply) return protocol_error("tokenizer", reply.status());
      on_detokenize_reply(*reply);
      return;
    }
    default:
      protocol_error("tokenizer", Status(StatusCode::kInvalidArgument,
                                         fmt::format("unexpected '{}' message",
                                                     proto::message_type_name(envelope->type()))));
  }
}

void SchedulerService::on_tokenizer_heartbeat(const std::string& identity,
                                              const proto::TokenizerHeartbeat& hb) {
  auto it = tokenizer_peers_.find(identity);
  if (it != tokenizer_peers_.end() && it->second.incarnation != hb.incarnation) {
    tokenizer_lost(identity, "restarted");
    it = tokenizer_peers_.end();
  }
  if (it == tokenizer_peers_.end()) {
    TokenizerPeer peer;
    peer.identity = identity;
    peer.incarnation = hb.incarnation;
    tokenizer_peers_[identity] = peer;
    LITELLAMA_LOG_INFO("scheduler: tokenizer up ({} alive)", tokenizer_peers_.size());
  }
  tokenizer_peers_[identity].last_seen = monotonic_seconds();
  tokenizer_eos_ids_ = hb.eos_token_ids;
  n_tokenizers_up_.store(static_cast<int32_t>(tokenizer_peers_.size()));
}

void SchedulerService::tokenizer_lost(const std::string& identity, const char* why) {
  LITELLAMA_LOG_WARN("scheduler: tokenizer lost ({}); its pending work is re-sent", why);
  tokenizer_peers_.erase(identity);
  n_tokenizers_up_.store(static_cast<int32_t>(tokenizer_peers_.size()));
  // Tokenizers are stateless: put their pending work back in line for another one.
  std::vector<Request*> exhausted;
  for (auto it = tokenizer_ops_.begin(); it != tokenizer_ops_.end();) {
    if (it->second.tokenizer != identity) {
      ++it;
      continue;
    }
    for (uint64_t id : it->second.request_ids) {
      auto r = requests_.find(id);
      if (r == requests_.end()) continue;
      r->second->tokenizer_op = 0;
      if (++r->second->n_tokenizer_losses > options_.max_tokenizer_retries) {
        exhausted.push_back(r->second.get());
        if (!it->second.encode) r->second->detok_in_flight = false;
        continue;
      }
      if (it->second.encode) {
        encode_queue_.push_front(id);
      } else {
        r->second->detok_in_flight = false;
      }
    }
    it = tokenizer_ops_.erase(it);
  }
  for (Request* r : exhausted) {
    metrics_data_.tokenizer_retries_exhausted->Increment();
    fail(r, StatusCode::kUnavailable,
         fmt::format("{} tokenizers died or went silent while holding this request's work; it "
                     "is not sent to another",
                     r->n_tokenizer_losses));
  }
}

const SchedulerService::TokenizerPeer* SchedulerService::pick_tokenizer() {
  if (tokenizer_peers_.empty()) return nullptr;
  // The one with the fewest messages outstanding, round robin among equals: a tokenizer busy
  // with a huge prompt is passed over while another is free.
  std::map<std::string, size_t> load;
  for (const auto& [id, op] : tokenizer_ops_) ++load[op.tokenizer];
  const size_t n = tokenizer_peers_.size();
  const size_t first = next_tokenizer_++ % n;
  const TokenizerPeer* best = nullptr;
  size_t best_load = 0;
  auto it = tokenizer_peers_.begin();
  std::advance(it, static_cast<ptrdiff_t>(first));
  for (size_t k = 0; k < n; ++k) {
    const size_t l = load[it->first];
    if (best == nullptr || l < best_load) {
      best = &it->second;
      best_load = l;
    }
    if (++it == tokenizer_peers_.end()) it = tokenizer_peers_.begin();
  }
  return best;
}

void SchedulerService::dispatch_encodes() {
  while (!encode_queue_.empty()) {
    const TokenizerPeer* peer = pick_tokenizer();
    if (peer == nullptr) return;
    const uint64_t id = encode_queue_.front();
    encode_queue_.pop_front();
    auto pending = pending_encodes_.find(id);
    auto r = requests_.find(id);
    if (pending == pending_encodes_.end() || r == requests_.end()) continue;
    const uint64_t op_id = next_op_id_++;
    pending->second.op_id = op_id;
    pending->second.sent_unix_ns = net::unix_now_ns();
    // A request with images has the tokenizer expand each image token to the image's rows (as
    // the vision service announces them now); a tokenizer that does not expand them leaves
    // single image tokens, which place_images expands.
    pending->second.image_token_id = -1;
    pending->second.image_token_count = 0;
    if (!r->second->images.empty() && vision_peer_) {
      pending->second.image_token_id = vision_peer_->info.image_token_id;
      pending->second.image_token_count = vision_peer_->info.rows_per_slot;
    }
    TokenizerOp op;
    op.encode = true;
    op.tokenizer = peer->identity;
    op.t_sent = monotonic_seconds();
    op.request_ids = {id};
    const std::string identity = peer->identity;
    tokenizer_ops_[op_id] = std::move(op);
    r->second->tokenizer_op = op_id;
    if (net::send_to(tokenizers_, identity, proto::encode(pending->second)) != SendResult::kSent) {
      tokenizer_lost(identity, "unreachable");
    }
  }
}

void SchedulerService::on_encode_reply(const proto::EncodeReply& reply) {
  auto op = tokenizer_ops_.find(reply.op_id);
  if (op == tokenizer_ops_.end() || !op->second.encode) return;
  metrics_data_.hop_tokenizer_encode->Observe(monotonic_seconds() - op->second.t_sent);
  if (op->second.request_ids.empty()) {  // its request failed for taking too long
    tokenizer_ops_.erase(op);
    return;
  }
  const uint64_t id = op->second.request_ids.front();
  tokenizer_ops_.erase(op);
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request* r = it->second.get();
  r->tokenizer_op = 0;
  pending_encodes_.erase(id);
  if (!reply.error.empty()) {
    fail(r, StatusCode::kInvalidArgument, "the prompt could not be tokenized: " + reply.error);
    return;
  }
  if (reply.token_ids.empty()) {
    fail(r, StatusCode::kInvalidArgument, "the prompt is empty");
    return;
  }
  r->prompt_ids = reply.token_ids;
  start_generation(r);
}

void SchedulerService::dispatch_detokenize() {
  proto::DetokenizeRequest batch;
  TokenizerOp op;
  for (auto& [id, owned] : requests_) {
    Request* r = owned.get();
    if (r->detok_in_flight || r->client_gone || r->prompt_ids.empty()) continue;
    const int32_t n_known = r->n_prompt() + r->n_generated();
    const bool final = r->finish.has_value() && !r->detok_flushed;
    if (n_known <= r->detok_read && !final) continue;
    if (r->finish && r->detok_flushed) continue;
    proto::DetokenizeItem item;
    item.request_id = r->id;
    for (int32_t k = r->detok_prefix; k < n_known; ++k) item.token_ids.push_back(r->token_at(k));
    item.read_offset = r->detok_read - r->detok_prefix;
    item.skip_special_tokens = r->skip_special_tokens;
    item.final = final;
    if (r->logprobs)
      add_piece_ids(*r, r->detok_read - r->n_prompt(), n_known - r->n_prompt(), &item);
    batch.items.push_back(std::move(item));
    op.request_ids.push_back(r->id);
    op.window_end.push_back(n_known);
    op.final.push_back(final ? 1 : 0);
  }
  if (batch.items.empty()) return;
  const TokenizerPeer* peer = pick_tokenizer();
  if (peer == nullptr) return;  // waits; on_tick fails it if no tokenizer comes back
  const uint64_t op_id = next_op_id_++;
  batch.op_id = op_id;
  batch.sent_unix_ns = net::unix_now_ns();
  op.tokenizer = peer->identity;
  op.t_sent = monotonic_seconds();
  for (uint64_t id : op.request_ids) {
    Request* r = requests_[id].get();
    r->detok_in_flight = true;
    r->tokenizer_op = op_id;
  }
  const std::string identity = peer->identity;
  tokenizer_ops_[op_id] = std::move(op);
  if (net::send_to(tokenizers_, identity, proto::encode(batch)) != SendResult::kSent) {
    tokenizer_lost(identity, "unreachable");
  }
}

void SchedulerService::apply_stop_strings(Request* r, size_t search_from) {
  size_t cut = std::string::npos;
  for (const std::string& s : r->stop_strings) {
    const size_t from = search_from > s.size() ? search_from - s.size() : 0;
    const size_t at = r->text.find(s, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut == std::string::npos) return;
  r->text.resize(std::max(cut, r->n_text_sent));
  if (!r->finish) {
    r->finish = RequestFinish::kStop;
    batcher_.retire(r);
  }
  r->detok_flushed = true;
}

void SchedulerService::on_detokenize_reply(const proto::DetokenizeReply& reply) {
  auto op_it = tokenizer_ops_.find(reply.op_id);
  if (op_it == tokenizer_ops_.end() || op_it->second.encode) return;
  TokenizerOp op = std::move(op_it->second);
  tokenizer_ops_.erase(op_it);
  const double now = monotonic_seconds();
  metrics_data_.hop_tokenizer_detokenize->Observe(now - op.t_sent);
  for (size_t i = 0; i < op.request_ids.size(); ++i) {
    auto it = requests_.find(op.request_ids[i]);
    if (it == requests_.end()) continue;
    Request* r = it->second.get();
    r->detok_in_flight = false;
    r->tokenizer_op = 0;
    if (!reply.error.empty() || i >= reply.items.size() || reply.items[i].request_id != r->id) {
      fail(r, StatusCode::kInternal, "the output could not be detokenized");
      continue;
    }
    const proto::DetokenizeResult& result = reply.items[i];
    const size_t old_size = r->text.size();
    if (result.advanced || op.final[i]) {
      if (r->logprobs) {
        store_pieces(r, r->detok_read - r->n_prompt(), op.window_end[i] - r->n_prompt(),
                     result.pieces);
      }
      r->text += result.text;
      r->detok_prefix = r->detok_read;
      r->detok_read = op.window_end[i];
    }
    if (op.final[i] && r->detok_read == r->n_prompt() + r->n_generated()) {
      r->detok_flushed = true;
    }
    if (!r->stop_strings.empty() && r->text.size() > old_size) apply_stop_strings(r, old_size);
    flush(r);
  }
}

// ---- timers ------------------------------------------------------------------------------------

void SchedulerService::check_peers_alive() {
  const double now = monotonic_seconds();
  const double timeout = options_.peer_timeout_ms / 1000.0;
  proto::SchedulerHeartbeat probe;
  probe.incarnation = incarnation_;
  if (worker_ && now - worker_->last_seen > timeout) {
    // Heartbeats of a process that died may still sit in the socket's queue and would announce it
    // again; when its connection is gone too, it is dead for sure and is never accepted back.
    const bool gone =
        net::send_to(workers_, worker_->identity, proto::encode(probe)) == SendResult::kPeerGone;
    worker_lost("no heartbeat", gone);
  }
  if (vision_peer_ && now - vision_peer_->last_seen > timeout) {
    // Its connection gone too: dead for sure (as for the worker).
    const bool gone = net::send_to(vision_, vision_peer_->identity, proto::encode(probe)) ==
                      SendResult::kPeerGone;
    vision_lost("no heartbeat", gone);
  }
  std::vector<std::string> silent;
  for (const auto& [identity, peer] : tokenizer_peers_) {
    if (now - peer.last_seen > timeout) silent.push_back(identity);
  }
  for (const auto& identity : silent) tokenizer_lost(identity, "no heartbeat");
}

void SchedulerService::on_tick() {
  const double now = monotonic_seconds();
  const double interval = options_.heartbeat_interval_ms / 1000.0;
  const double timeout = options_.peer_timeout_ms / 1000.0;
  if (now - last_heartbeat_sent_ >= interval) {
    last_heartbeat_sent_ = now;
    proto::SchedulerHeartbeat hb;
    hb.incarnation = incarnation_;
    const std::string bytes = proto::encode(hb);
    if (worker_ && net::send_to(workers_, worker_->identity, bytes) == SendResult::kPeerGone) {
      worker_lost("disconnected", true);
    }
    proto::SchedulerHeartbeat standby_hb = hb;
    standby_hb.standby = true;
    const std::string standby_bytes = proto::encode(standby_hb);
    for (auto it = standby_workers_.begin(); it != standby_workers_.end();) {
      const bool gone = now - it->second > timeout ||
                        net::send_to(workers_, it->first, standby_bytes) == SendResult::kPeerGone;
      it = gone ? standby_workers_.erase(it) : std::next(it);
    }
    std::vector<std::string> gone;
    for (const auto& [identity, peer] : tokenizer_peers_) {
      if (net::send_to(tokenizers_, identity, bytes) == SendResult::kPeerGone) {
        gone.push_back(identity);
      }
    }
    for (const auto& identity : gone) tokenizer_lost(identity, "disconnected");
    if (vision_peer_ &&
        net::send_to(vision_, vision_peer_->identity, bytes) == SendResult::kPeerGone) {
      vision_lost("disconnected", true);
    }
  }
  // Requests whose images found no free slot try again as slots come back; those the vision
  // service did not serve within the encode budget fail (it may be stuck on an image).
  for (uint64_t id : std::vector<uint64_t>(image_waiters_.begin(), image_waiters_.end())) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second->state != RequestState::kImages) continue;
    Request* r = it->second.get();
    if (now - r->t_images > options_.encode_timeout_ms / 1000.0) {
      fail(r, StatusCode::kResourceExhausted,
           fmt::format("the request's images were not encoded within {} ms "
                       "(--encode-timeout-ms)",
                       options_.encode_timeout_ms));
      continue;
    }
    advance_images(r);
  }
  // An encode past its budget fails its request alone. The op stays (without its request) until
  // the tokenizer answers or is lost, so pick_tokenizer still sees that tokenizer as busy.
  const double encode_budget = options_.encode_timeout_ms / 1000.0;
  std::vector<Request*> slow;
  for (auto& [op_id, op] : tokenizer_ops_) {
    if (!op.encode || op.request_ids.empty() || now - op.t_sent <= encode_budget) continue;
    auto r = requests_.find(op.request_ids.front());
    op.request_ids.clear();
    if (r != requests_.end()) slow.push_back(r->second.get());
  }
  for (Request* r : slow) {
    r->tokenizer_op = 0;
    fail(r, StatusCode::kResourceExhausted,
         fmt::format("tokenizing the prompt took longer than {} ms (--encode-timeout-ms)",
                     options_.encode_timeout_ms));
  }

  // Requests blocked on a missing peer fail after peer_wait_ms.
  const double wait = options_.peer_wait_ms / 1000.0;
  std::vector<Request*> expired;
  for (auto& [id, owned] : requests_) {
    Request* r = owned.get();
    const bool needs_worker = !worker_ && r->state == RequestState::kWaiting;
    const bool needs_tokenizer =
        tokenizer_peers_.empty() && r->tokenizer_op == 0 &&
        (r->state == RequestState::kTokenizing ||
         r->n_prompt() + r->n_generated() > r->detok_read || (r->finish && !r->detok_flushed));
    if ((needs_worker || needs_tokenizer) && now - r->t_last_token > wait) expired.push_back(r);
  }
  for (Request* r : expired) {
    fail(r, StatusCode::kUnavailable, "no worker or tokenizer came up in time");
  }
}

void SchedulerService::update_gauges() {
  metrics_data_.worker_up->Set(worker_ ? 1 : 0);
  metrics_data_.tokenizers_up->Set(static_cast<double>(tokenizer_peers_.size()));
  metrics_data_.requests_running->Set(batcher_.n_running());
  metrics_data_.requests_waiting->Set(batcher_.n_waiting());
  metrics_data_.update_batcher(batcher_, allocator_, monotonic_seconds());
  metrics_data_.kv_slots_capacity->Set(allocator_.n_total());
  metrics_data_.vision_up->Set(vision_peer_ ? 1 : 0);
  metrics_data_.image_slots_referenced->Set(image_table_.n_referenced());
  metrics_data_.image_slots_cached->Set(image_table_.n_cached());
  metrics_data_.image_slots_free->Set(image_table_.n_free());
}

}  // namespace litellama
