#include "services/api/api_server.h"

#include <netdb.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <optional>
#include <random>
#include <sstream>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <microhttpd.h>
#include <prometheus/text_serializer.h>

#include "common/log.h"
#include "common/net/scheduler_client.h"
#include "services/api/openai_protocol.h"

namespace litellama::api {

// The chat page's bytes (generated from chat_page.html at build time).
extern const unsigned char kChatPage[];
extern const size_t kChatPageSize;

namespace {

// How often the pump looks at suspended connections for clients that went away, and how often
// it refreshes the scheduler's readiness.
constexpr int kDisconnectPollMs = 100;
constexpr double kInfoRefreshSeconds = 0.5;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Choice {
  ChoiceResult result;
  uint64_t scheduler_id = 0;  // 0: not submitted
  bool started = false;       // a stream chunk of this choice went out
  bool finished = false;
  size_t text_offset = 0;  // completions with logprobs: bytes of the choice's text streamed
};

}  // namespace

// One generation request. The MHD thread and the pump share it under `mu`.
struct Job {
  std::mutex mu;
  MHD_Connection* connection = nullptr;  // null once MHD is done with the connection
  bool suspended = false;
  ParsedRequest request;
  std::string id;
  int64_t created = 0;
  std::vector<Choice> choices;
  size_t n_finished = 0;
  // The answer can start: the first chunk (streams) or everything (whole responses) or an error.
  bool head = false;
  bool failed = false;
  ApiError error;
  std::string out;    // stream bytes not yet handed to MHD
  bool done = false;  // nothing more will be appended to out
  bool gone = false;  // the client went away
};

namespace {

// Per connection, from the first call of the access handler to the completed notification.
struct ConnState {
  std::string body;
  int64_t max_body_bytes = 0;  // by path (ApiServer::Impl::max_body_bytes)
  bool too_large = false;
  std::shared_ptr<Job> job;
};

MHD_Result queue_text(MHD_Connection* c, unsigned int status, const std::string& body,
                      const char* content_type) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()),
                                                    MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  const MHD_Result q = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return q;
}

MHD_Result queue_error(MHD_Connection* c, const ApiError& e) {
  return queue_text(c, static_cast<unsigned int>(e.http_status), error_body(e), "application/json");
}

ApiError simple_error(int status, const std::string& type, const std::string& code,
                      const std::string& message) {
  ApiError e;
  e.http_status = status;
  e.type = type;
  e.code = code;
  e.message = message;
  return e;
}

bool constant_time_equal(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i % (b.empty() ? 1 : b.size())];
  return diff == 0 && !b.empty();
}

}  // namespace

struct ApiServer::Impl {
  ApiOptions options;
  std::optional<LocalMediaDir> local_media;  // --allowed-local-media-path, resolved at start
  std::shared_ptr<prometheus::Registry> registry;
  MHD_Daemon* daemon = nullptr;
  std::thread pump;
  std::atomic<bool> stop{false};
  int wake_fd = -1;
  int64_t created = std::time(nullptr);

  std::mutex mu;  // incoming, cancelled, info
  std::deque<std::shared_ptr<Job>> incoming;
  std::deque<std::shared_ptr<Job>> cancelled;
  proto::ServerInfoReply info;
  bool have_info = false;
  std::string info_error = "the scheduler has not answered yet";

  // Pump thread only.
  std::unordered_map<uint64_t, std::pair<std::shared_ptr<Job>, size_t>> by_scheduler_id;
  std::vector<std::shared_ptr<Job>> live;

  void wake() {
    const uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  }
  std::string served_name() {
    std::lock_guard lock(mu);
    return !options.served_model_name.empty() ? options.served_model_name
                                              : (have_info ? info.model : std::string());
  }
  std::string ready_reason() {
    std::lock_guard lock(mu);
    if (!have_info) return info_error;
    if (!info.ready) {
      return info.worker_up ? "no tokenizer is up" : "the worker is not up (loading or down)";
    }
    return "";
  }

  // The largest body read for a path: chat completions may carry images, whose URLs may take
  // the body past max_request_bytes up to max_image_request_bytes.
  int64_t max_body_bytes(const char* path) const {
    const bool chat = path != nullptr && std::strcmp(path, "/v1/chat/completions") == 0;
    return chat ? std::max(options.max_request_bytes, options.max_image_request_bytes)
                : options.max_request_bytes;
  }
  MHD_Result answer(MHD_Connection* c, const std::string& path, const std::string& method,
                    ConnState* state);
  MHD_Result start_generation(MHD_Connection* c, bool chat, ConnState* state);
  MHD_Result continue_job(MHD_Connection* c, ConnState* state);

  void run_pump();
  void on_event(net::SchedulerClient& client, const net::ClientEvent& event);
  void fail_job(net::SchedulerClient& client, Job& job, const ApiError& e);
  void poll_disconnects(net::SchedulerClient& client);
  static void resume(Job& job) {
    if (job.suspended && job.connection != nullptr) {
      job.suspended = false;
      MHD_resume_connection(job.connection);
    }
  }
};

namespace {

ssize_t read_stream(void* cls, uint64_t /*pos*/, char* buf, size_t max) {
  Job& job = **static_cast<std::shared_ptr<Job>*>(cls);
  std::lock_guard lock(job.mu);
  if (job.gone) return MHD_CONTENT_READER_END_WITH_ERROR;
  if (!job.out.empty()) {
    const size_t n = std::min(max, job.out.size());
    std::memcpy(buf, job.out.data(), n);
    job.out.erase(0, n);
    return static_cast<ssize_t>(n);
  }
  if (job.done) return MHD_CONTENT_READER_END_OF_STREAM;
  // Nothing yet: the connection waits suspended (no thread) until the pump resumes it.
  job.suspended = true;
  MHD_suspend_connection(job.connection);
  return 0;
}

void free_stream(void* cls) {
  delete static_cast<std::shared_ptr<Job>*>(cls);
}

MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method,
                      const char* /*version*/, const char* upload_data, size_t* upload_data_size,
                      void** con_cls) {
  auto* impl = static_cast<ApiServer::Impl*>(cls);
  auto* state = static_cast<ConnState*>(*con_cls);
  if (state == nullptr) {
    state = new ConnState();
    *con_cls = state;
    state->max_body_bytes = impl->max_body_bytes(url);
    // A declared body over the limit is refused before it is read.
    const char* length =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (length != nullptr && std::strtoll(length, nullptr, 10) > state->max_body_bytes) {
      state->too_large = true;
    }
    return MHD_YES;
  }
  if (*upload_data_size != 0) {
    if (!state->too_large) {
      if (static_cast<int64_t>(state->body.size() + *upload_data_size) > state->max_body_bytes) {
        state->too_large = true;
        state->body.clear();
      } else {
        state->body.append(upload_data, *upload_data_size);
      }
    }
    *upload_data_size = 0;
    return MHD_YES;
  }
  if (state->job) return impl->continue_job(c, state);
  return impl->answer(c, url ? url : "", method ? method : "", state);
}

void on_completed(void* cls, MHD_Connection* /*c*/, void** con_cls,
                  MHD_RequestTerminationCode /*toe*/) {
  auto* impl = static_cast<ApiServer::Impl*>(cls);
  auto* state = static_cast<ConnState*>(*con_cls);
  if (state == nullptr) return;
  if (state->job) {
    bool cancel = false;
    {
      std::lock_guard lock(state->job->mu);
      state->job->connection = nullptr;
      state->job->suspended = false;
      if (state->job->n_finished < state->job->choices.size()) {
        state->job->gone = true;
        cancel = true;
      }
    }
    if (cancel) {
      std::lock_guard lock(impl->mu);
      impl->cancelled.push_back(state->job);
      impl->wake();
    }
  }
  delete state;
  *con_cls = nullptr;
}

}  // namespace

MHD_Result ApiServer::Impl::answer(MHD_Connection* c, const std::string& path,
                                   const std::string& method, ConnState* state) {
  const bool get = method == "GET" || method == "HEAD";
  if (path == "/health") {
    if (!get) return queue_error(c, simple_error(405, "invalid_request_error", "", "only GET"));
    return queue_text(c, 200, "ok\n", "text/plain");
  }
  if (path == "/" || path == "/index.html") {
    // The page itself is open; its API calls send the key, which it asks the user for.
    if (!get) return queue_error(c, simple_error(405, "invalid_request_error", "", "only GET"));
    return queue_text(c, 200, std::string(reinterpret_cast<const char*>(kChatPage), kChatPageSize),
                      "text/html; charset=utf-8");
  }
  if (!options.api_key.empty()) {
    const char* auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const std::string given = auth != nullptr ? auth : "";
    const std::string bearer = "Bearer ";
    if (given.compare(0, bearer.size(), bearer) != 0 ||
        !constant_time_equal(given.substr(bearer.size()), options.api_key)) {
      return queue_error(c, simple_error(401, "invalid_request_error", "invalid_api_key",
                                         "Incorrect or missing API key: send "
                                         "'Authorization: Bearer KEY'"));
    }
  }
  const bool generation = path == "/v1/chat/completions" || path == "/v1/completions";
  const bool known = generation || path == "/v1/models" || path == "/ready" || path == "/metrics";
  if (!known) {
    return queue_error(c, simple_error(404, "invalid_request_error", "not_found",
                                       fmt::format("no such path: {} {}", method, path)));
  }
  if (generation ? method != "POST" : !get) {
    return queue_error(c,
                       simple_error(405, "invalid_request_error", "method_not_allowed",
                                    fmt::format("{} takes {}", path, generation ? "POST" : "GET")));
  }
  if (path == "/ready") {
    const std::string why = ready_reason();
    return why.empty() ? queue_text(c, 200, "ready\n", "text/plain")
                       : queue_text(c, 503, why + "\n", "text/plain");
  }
  if (path == "/metrics") {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, registry->Collect());
    return queue_text(c, 200, out.str(), "text/plain; version=0.0.4");
  }
  if (path == "/v1/models") {
    const std::string name = served_name();
    int64_t max_len = 0;
    {
      std::lock_guard lock(mu);
      max_len = have_info ? info.max_model_len : 0;
    }
    if (name.empty()) {
      return queue_error(c, simple_error(503, "service_unavailable", "", ready_reason()));
    }
    return queue_text(c, 200, models_body(name, created, max_len), "application/json");
  }
  const bool chat = path == "/v1/chat/completions";
  if (state->too_large) {
    if (chat && state->max_body_bytes > options.max_request_bytes) {
      return queue_error(
          c, simple_error(413, "invalid_request_error", "request_too_large",
                          fmt::format("the request body is larger than {} bytes, the most a chat "
                                      "completion with images may send "
                                      "(--max-image-request-bytes; its text alone: {} bytes, "
                                      "--max-request-bytes)",
                                      state->max_body_bytes, options.max_request_bytes)));
    }
    return queue_error(c, simple_error(413, "invalid_request_error", "request_too_large",
                                       fmt::format("the request body is larger than {} bytes "
                                                   "(--max-request-bytes)",
                                                   options.max_request_bytes)));
  }
  return start_generation(c, chat, state);
}

MHD_Result ApiServer::Impl::start_generation(MHD_Connection* c, bool chat, ConnState* state) {
  if (const std::string why = ready_reason(); !why.empty()) {
    return queue_error(
        c, simple_error(503, "service_unavailable", "", "the server is not ready: " + why));
  }
  // Only image URLs may take a body past --max-request-bytes: one without any is refused before
  // it is parsed, one with them once its text is known.
  const auto text_too_large = [&](int64_t n_text_bytes) {
    return queue_error(
        c, simple_error(413, "invalid_request_error", "request_too_large",
                        fmt::format("the request's text (the body less its image URLs) is {} "
                                    "bytes, over the limit of {} bytes (--max-request-bytes)",
                                    n_text_bytes, options.max_request_bytes)));
  };
  const auto n_body_bytes = static_cast<int64_t>(state->body.size());
  if (n_body_bytes > options.max_request_bytes &&
      state->body.find("image_url") == std::string::npos) {
    return text_too_large(n_body_bytes);
  }
  ParseContext context;
  context.served_model_name = served_name();
  context.local_media = local_media;
  context.max_image_bytes = options.max_image_bytes;
  auto job = std::make_shared<Job>();
  ApiError error;
  if (!parse_request(state->body, chat, context, &job->request, &error)) {
    return queue_error(c, error);
  }
  if (n_body_bytes - job->request.n_image_url_bytes > options.max_request_bytes) {
    return text_too_large(n_body_bytes - job->request.n_image_url_bytes);
  }
  state->body.clear();
  job->connection = c;
  job->id = fmt::format("{}-{:016x}", chat ? "chatcmpl" : "cmpl",
                        (uint64_t(std::random_device()()) << 32) ^ std::random_device()());
  job->created = std::time(nullptr);
  job->choices.resize(job->request.generate.size());
  state->job = job;
  // Suspended until the pump has news; the lock keeps the pump from resuming it before then.
  std::lock_guard job_lock(job->mu);
  {
    std::lock_guard lock(mu);
    incoming.push_back(job);
    wake();
  }
  job->suspended = true;
  MHD_suspend_connection(c);
  return MHD_YES;
}

MHD_Result ApiServer::Impl::continue_job(MHD_Connection* c, ConnState* state) {
  const std::shared_ptr<Job>& job = state->job;
  // What to answer is read under the job's lock; the response is queued after it is released.
  // read_stream takes the lock while libmicrohttpd holds the response's mutex, so queuing (which
  // takes that mutex) under the lock would order the two both ways. Suspending stays under the
  // lock: the pump resumes only a connection it sees suspended.
  std::optional<ApiError> error;
  std::string body;
  {
    std::lock_guard lock(job->mu);
    if (job->gone) return MHD_NO;
    if (!job->head) {
      job->suspended = true;
      MHD_suspend_connection(c);
      return MHD_YES;
    }
    if (job->failed && (!job->request.stream || job->out.empty())) {
      error = job->error;
    } else if (!job->request.stream) {
      std::vector<ChoiceResult> results;
      for (const Choice& ch : job->choices) results.push_back(ch.result);
      body = completion_body(job->request, job->id, job->created, results);
    }
  }
  if (error) return queue_error(c, *error);
  if (!job->request.stream) return queue_text(c, 200, body, "application/json");
  MHD_Response* r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, &read_stream,
                                                      new std::shared_ptr<Job>(job), &free_stream);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  const MHD_Result q = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return q;
}

void ApiServer::Impl::fail_job(net::SchedulerClient& client, Job& job, const ApiError& e) {
  if (job.failed) return;
  job.failed = true;
  job.error = e;
  if (job.request.stream && job.head) {
    job.out += stream_error(e);
    job.out += kStreamDone;
    job.done = true;
  }
  job.head = true;
  for (Choice& ch : job.choices) {
    if (!ch.finished && ch.scheduler_id != 0) (void)client.abort(ch.scheduler_id);
  }
  resume(job);
}

void ApiServer::Impl::on_event(net::SchedulerClient& client, const net::ClientEvent& event) {
  auto it = by_scheduler_id.find(event.request_id());
  if (it == by_scheduler_id.end()) return;
  std::shared_ptr<Job> job = it->second.first;
  Choice& ch = job->choices[it->second.second];
  const int32_t index = static_cast<int32_t>(it->second.second);
  std::lock_guard lock(job->mu);
  const bool last = event.kind == net::ClientEvent::Kind::kError || event.chunk.finished;
  if (last) {
    by_scheduler_id.erase(it);
    ch.finished = true;
    ++job->n_finished;
  }
  if (event.kind == net::ClientEvent::Kind::kError) {
    fail_job(client, *job,
             map_scheduler_error(event.error.code, event.error.message, job->request.chat));
    if (job->n_finished == job->choices.size()) job->done = true;
    resume(*job);
    return;
  }
  const proto::GenerateChunk& chunk = event.chunk;
  ch.result.text += chunk.text;
  std::vector<TokenLogprob> logprobs;
  if (job->request.logprobs) {
    logprobs = chunk_logprobs(chunk);
    ch.result.logprobs.insert(ch.result.logprobs.end(), logprobs.begin(), logprobs.end());
  }
  ch.result.n_prompt_tokens = chunk.n_prompt_tokens;
  ch.result.n_generated_tokens = chunk.n_generated_tokens;
  if (chunk.finished) ch.result.n_cached_tokens = chunk.n_cached_tokens;
  if (chunk.finished) ch.result.finish_reason = chunk.finish_reason;
  if (job->failed || job->gone) return;
  const ParsedRequest& req = job->request;
  if (req.stream) {
    if (!ch.started) {
      ch.started = true;
      // The first chunk of a chat choice names the role; an echoed prompt comes first.
      const std::string empty;
      if (req.chat) job->out += stream_chunk(req, job->id, job->created, index, &empty, true, "");
      if (!req.echo_prefix[index].empty()) {
        job->out +=
            stream_chunk(req, job->id, job->created, index, &req.echo_prefix[index], false, "");
      }
      ch.text_offset = req.echo_prefix[index].size();
    }
    // Every event with new tokens is a chunk, also when their text is empty (held back as an
    // incomplete UTF-8 sequence or a stop-string prefix, or special): the client sees each step
    // as it happens (time to first token, logprobs of every token), as OpenAI-compatible servers
    // stream.
    if (!chunk.text.empty() || !logprobs.empty() || !chunk.token_ids.empty()) {
      job->out += stream_chunk(req, job->id, job->created, index, &chunk.text, false, "", &logprobs,
                               ch.text_offset);
      for (const TokenLogprob& t : logprobs) ch.text_offset += t.bytes.size();
    }
    if (chunk.finished) {
      job->out +=
          stream_chunk(req, job->id, job->created, index, nullptr, false, chunk.finish_reason);
    }
    job->head = true;
  }
  if (job->n_finished == job->choices.size()) {
    if (req.stream) {
      if (req.include_usage) {
        std::vector<ChoiceResult> results;
        for (const Choice& c : job->choices) results.push_back(c.result);
        job->out +=
            stream_usage_chunk(req, job->id, job->created, usage_json(results, req.prompt_index));
      }
      job->out += kStreamDone;
    }
    job->done = true;
    job->head = true;
  }
  resume(*job);
}

void ApiServer::Impl::poll_disconnects(net::SchedulerClient& client) {
  std::vector<std::shared_ptr<Job>> keep;
  for (auto& job : live) {
    std::lock_guard lock(job->mu);
    if (job->connection == nullptr) {
      // MHD is done with it; keep it until the scheduler has ended every choice.
      if (job->n_finished < job->choices.size()) keep.push_back(job);
      continue;
    }
    keep.push_back(job);
    if (!job->suspended || job->gone) continue;
    const MHD_ConnectionInfo* info =
        MHD_get_connection_info(job->connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info == nullptr) continue;
    char byte = 0;
    const ssize_t n = recv(info->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    const bool closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    if (!closed) continue;
    job->gone = true;
    for (Choice& ch : job->choices) {
      if (!ch.finished && ch.scheduler_id != 0) (void)client.abort(ch.scheduler_id);
    }
    resume(*job);
  }
  live.swap(keep);
}

void ApiServer::Impl::run_pump() {
  auto connected = net::SchedulerClient::connect(options.scheduler_endpoint);
  if (!connected) {
    std::lock_guard lock(mu);
    info_error = "cannot connect to the scheduler: " + connected.status().to_string();
    return;
  }
  std::unique_ptr<net::SchedulerClient> client = std::move(connected).value();
  client->set_wake_fd(wake_fd);
  pthread_setname_np(pthread_self(), "api-pump");  // for per-thread CPU accounting (top -H)
  double last_info = 0.0, last_poll = 0.0;
  while (!stop.load()) {
    uint64_t drained = 0;
    (void)!read(wake_fd, &drained, sizeof(drained));
    std::deque<std::shared_ptr<Job>> new_jobs, gone_jobs;
    {
      std::lock_guard lock(mu);
      new_jobs.swap(incoming);
      gone_jobs.swap(cancelled);
    }
    for (auto& job : new_jobs) {
      std::lock_guard lock(job->mu);
      live.push_back(job);
      for (size_t i = 0; i < job->choices.size(); ++i) {
        auto id = client->submit(job->request.generate[i], job->request.images);
        if (!id) {
          job->choices[i].finished = true;
          ++job->n_finished;
          fail_job(*client, *job,
                   simple_error(503, "service_unavailable", "", id.status().message()));
          continue;
        }
        job->choices[i].scheduler_id = *id;
        by_scheduler_id[*id] = {job, i};
      }
      if (job->n_finished == job->choices.size()) job->done = true;
    }
    for (auto& job : gone_jobs) {
      std::lock_guard lock(job->mu);
      for (Choice& ch : job->choices) {
        if (!ch.finished && ch.scheduler_id != 0) (void)client->abort(ch.scheduler_id);
      }
    }
    auto event = client->next_event(kDisconnectPollMs);
    while (event.is_ok() && event->has_value()) {
      on_event(*client, **event);
      event = client->next_event(0);
    }
    const double now = now_seconds();
    if (now - last_poll >= kDisconnectPollMs / 1000.0) {
      last_poll = now;
      poll_disconnects(*client);
    }
    if (now - last_info >= kInfoRefreshSeconds) {
      last_info = now;
      auto reply = client->server_info(200);
      std::lock_guard lock(mu);
      if (reply) {
        info = *reply;
        have_info = true;
      } else {
        have_info = false;
        info_error = "the scheduler did not answer: " + reply.status().message();
      }
    }
  }
  // Shutting down: every open request ends; its connection is resumed so that MHD closes it.
  for (auto& job : live) {
    std::lock_guard lock(job->mu);
    job->gone = true;
    for (Choice& ch : job->choices) {
      if (!ch.finished && ch.scheduler_id != 0) (void)client->abort(ch.scheduler_id);
    }
    resume(*job);
  }
}

Result<std::unique_ptr<ApiServer>> ApiServer::start(
    ApiOptions options, std::shared_ptr<prometheus::Registry> registry) {
  std::string host = options.listen, port = options.listen;
  const size_t colon = options.listen.rfind(':');
  if (colon == std::string::npos)
    return make_error(StatusCode::kInvalidArgument, "API address '{}' is not HOST:PORT",
                      options.listen);
  host = options.listen.substr(0, colon);
  port = options.listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.empty() || host == "*" ? nullptr : host.c_str(), port.c_str(),
                             &hints, &found);
  if (rc != 0 || found == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "cannot resolve API address '{}': {}",
                      options.listen, rc != 0 ? gai_strerror(rc) : "no address");
  }
  std::optional<LocalMediaDir> local_media;
  if (!options.allowed_local_media_path.empty()) {
    auto dir = open_local_media_dir(options.allowed_local_media_path);
    if (!dir) {
      freeaddrinfo(found);
      return dir.status();
    }
    local_media = std::move(dir).value();
  }
  std::unique_ptr<ApiServer> server(new ApiServer());
  server->impl_ = std::make_unique<Impl>();
  Impl& impl = *server->impl_;
  impl.options = std::move(options);
  impl.local_media = std::move(local_media);
  impl.registry = std::move(registry);
  impl.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  unsigned int flags =
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ITC;
  if (found->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  impl.daemon = MHD_start_daemon(flags, 0, nullptr, nullptr, &on_request, &impl,
                                 MHD_OPTION_SOCK_ADDR, found->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
                                 impl.options.connection_limit, MHD_OPTION_CONNECTION_TIMEOUT, 300u,
                                 MHD_OPTION_NOTIFY_COMPLETED, &on_completed, &impl, MHD_OPTION_END);
  const int start_errno = errno;
  freeaddrinfo(found);
  if (impl.daemon == nullptr) {
    return make_error(
        start_errno == EADDRINUSE ? StatusCode::kResourceExhausted : StatusCode::kUnavailable,
        "cannot serve the HTTP API on '{}': {}", impl.options.listen, std::strerror(start_errno));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(impl.daemon, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info ? info->port : 0;
  impl.pump = std::thread([&impl] { impl.run_pump(); });
  return server;
}

ApiServer::~ApiServer() {
  if (!impl_) return;
  if (impl_->daemon) MHD_quiesce_daemon(impl_->daemon);
  impl_->stop.store(true);
  impl_->wake();
  if (impl_->pump.joinable()) impl_->pump.join();
  if (impl_->daemon) MHD_stop_daemon(impl_->daemon);
  if (impl_->wake_fd >= 0) close(impl_->wake_fd);
}

}  // namespace litellama::api
