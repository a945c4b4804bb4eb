#include "common/net/scheduler_client.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "common/net/run_dir.h"
#include "common/net/zmq_util.h"

namespace litellama::net {

Result<std::unique_ptr<SchedulerClient>> SchedulerClient::connect(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) != 0 && endpoint.rfind("tcp://", 0) != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "server address '{}' must be ipc://PATH, tcp://HOST:PORT, HOST:PORT or a run "
                      "directory",
                      endpoint);
  }
  // The default directory is per user: one that someone else made is an attempt to stand in for
  // the server. An explicit path may belong to the service user (its group gets client access).
  if (const std::string dir = ipc_dir(endpoint); !dir.empty()) {
    LITELLAMA_RETURN_IF_ERROR(check_client_run_dir(dir, dir == default_run_dir()));
  }
  std::unique_ptr<SchedulerClient> client(new SchedulerClient());
  client->endpoint_ = endpoint;
  try {
    client->socket_ = zmq::socket_t(client->context_, zmq::socket_type::dealer);
    configure_socket(client->socket_);
    // The context is the client's own, so one fixed inproc name cannot collide.
    constexpr const char* kMonitor = "inproc://scheduler-client-monitor";
    if (zmq_socket_monitor(client->socket_.handle(), kMonitor,
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0) {
      throw zmq::error_t();
    }
    client->monitor_ = zmq::socket_t(client->context_, zmq::socket_type::pair);
    client->monitor_.set(zmq::sockopt::linger, 0);
    client->monitor_.connect(kMonitor);
    client->socket_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return make_error(StatusCode::kInvalidArgument, "cannot connect to '{}': {}", endpoint,
                      e.what());
  }
  return client;
}

SchedulerClient::~SchedulerClient() {
  if (socket_) zmq_socket_monitor(socket_.handle(), nullptr, 0);
}

void SchedulerClient::connection_lost() {
  for (uint64_t id : open_) {
    ClientEvent event;
    event.kind = ClientEvent::Kind::kError;
    event.error.request_id = id;
    event.error.code = status_code_name(StatusCode::kUnavailable);
    event.error.message = "the connection to the scheduler was lost";
    events_.push_back(std::move(event));
  }
  open_.clear();
}

void SchedulerClient::on_monitor_event(const std::vector<zmq::message_t>& frames) {
  uint16_t event = 0;
  if (!frames.empty() && frames[0].size() >= sizeof(event)) {
    std::memcpy(&event, frames[0].data(), sizeof(event));
  }
  if (event == ZMQ_EVENT_CONNECTED) connected_ = true;
  if (event == ZMQ_EVENT_DISCONNECTED) {
    connected_ = false;
    connection_lost();
  }
}

Status SchedulerClient::wait_connected(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<zmq::message_t> frames;
  while (!connected_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      return make_error(StatusCode::kUnavailable,
                        "no server is listening on {} (waited {} ms); start one with `litellama "
                        "serve`, or name the running one with --server",
                        endpoint_, timeout_ms);
    }
    zmq::pollitem_t item{monitor_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, std::chrono::milliseconds(left)) == 0) continue;
    if (recv_frames(monitor_, &frames)) on_monitor_event(frames);
  }
  return Status::ok();
}

Result<uint64_t> SchedulerClient::submit(proto::GenerateRequest request,
                                         const std::vector<std::string>& images) {
  request.request_id = next_request_id_++;
  request.n_images = static_cast<int32_t>(images.size());
  const std::string head = proto::encode(request);
  bool sent = false;
  if (images.empty()) {
    sent = send_one(socket_, head) == SendResult::kSent;
  } else {
    // One message of 1 + n frames: ZeroMQ delivers all of them or none.
    sent = socket_.send(zmq::buffer(head), zmq::send_flags::sndmore | zmq::send_flags::dontwait)
               .has_value();
    for (size_t i = 0; sent && i < images.size(); ++i) {
      const auto more = i + 1 < images.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
      sent = socket_.send(zmq::buffer(images[i]), more | zmq::send_flags::dontwait).has_value();
    }
  }
  if (!sent) {
    return make_error(StatusCode::kUnavailable, "scheduler queue is full");
  }
  open_.insert(request.request_id);
  return request.request_id;
}

Status SchedulerClient::abort(uint64_t request_id) {
  proto::AbortRequest abort;
  abort.request_id = request_id;
  if (send_one(socket_, proto::encode(abort)) != SendResult::kSent) {
    return make_error(StatusCode::kUnavailable, "scheduler queue is full");
  }
  return Status::ok();
}

Result<bool> SchedulerClient::receive(int timeout_ms, std::optional<proto::ServerInfoReply>* info) {
  zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0},
                             {monitor_.handle(), 0, ZMQ_POLLIN, 0},
                             {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  const int n = zmq::poll(items, wake_fd_ >= 0 ? 3 : 2, std::chrono::milliseconds(timeout_ms));
  if (n == 0) return false;
  if (wake_fd_ >= 0 && (items[2].revents & ZMQ_POLLIN) != 0) woken_ = true;
  std::vector<zmq::message_t> frames;
  // Replies already received come before the news that the connection dropped after them.
  if (!recv_frames(socket_, &frames)) {
    if (!recv_frames(monitor_, &frames)) return false;
    on_monitor_event(frames);
    return true;
  }
  if (frames.size() != 1) {
    ++n_protocol_errors_;
    return true;
  }
  auto envelope = proto::Envelope::parse(frame_view(frames[0]));
  if (!envelope) {
    ++n_protocol_errors_;
    LITELLAMA_LOG_WARN("dropped a frame from the scheduler: {}", envelope.status().to_string());
    return true;
  }
  switch (envelope->type()) {
    case proto::MessageType::kGenerateChunk: {
      auto chunk = envelope->as<proto::GenerateChunk>();
      if (!chunk) break;
      ClientEvent& event = events_.emplace_back();
      event.chunk = std::move(chunk).value();
      if (event.chunk.finished) open_.erase(event.chunk.request_id);
      return true;
    }
    case proto::MessageType::kRequestError: {
      auto error = envelope->as<proto::RequestError>();
      if (!error) break;
      ClientEvent& event = events_.emplace_back();
      event.kind = ClientEvent::Kind::kError;
      event.error = std::move(error).value();
      open_.erase(event.error.request_id);
      return true;
    }
    case proto::MessageType::kServerInfoReply: {
      auto reply = envelope->as<proto::ServerInfoReply>();
      if (!reply) break;
      *info = std::move(reply).value();
      return true;
    }
    default:
      break;
  }
  ++n_protocol_errors_;
  return true;
}

Result<std::optional<ClientEvent>> SchedulerClient::next_event(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (events_.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0 || woken_) {
      woken_ = false;
      return std::optional<ClientEvent>();
    }
    std::optional<proto::ServerInfoReply> ignored;
    LITELLAMA_ASSIGN_OR_RETURN(bool got, receive(static_cast<int>(left), &ignored));
    (void)got;
  }
  ClientEvent event = std::move(events_.front());
  events_.pop_front();
  return std::optional<ClientEvent>(std::move(event));
}

Result<proto::ServerInfoReply> SchedulerClient::server_info(int timeout_ms) {
  proto::ServerInfoRequest request;
  request.request_id = next_request_id_++;
  if (send_one(socket_, proto::encode(request)) != SendResult::kSent) {
    return make_error(StatusCode::kUnavailable, "scheduler queue is full");
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return make_error(StatusCode::kUnavailable, "the scheduler did not answer");
    std::optional<proto::ServerInfoReply> info;
    LITELLAMA_ASSIGN_OR_RETURN(bool got, receive(static_cast<int>(left), &info));
    (void)got;
    if (info && info->request_id == request.request_id) return std::move(*info);
  }
}

Status SchedulerClient::wait_ready(int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string why = "the scheduler did not answer";
  while (std::chrono::steady_clock::now() < deadline) {
    auto info = server_info(500);
    if (info && info->ready) return Status::ok();
    if (info) {
      why = !info->worker_up ? "no worker is up" : "no tokenizer is up";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  return make_error(StatusCode::kUnavailable, "not ready after {} ms: {}", timeout_ms, why);
}

Result<Completion> SchedulerClient::generate(proto::GenerateRequest request,
                                             const ChunkCallback& on_chunk, int idle_timeout_ms,
                                             const std::vector<std::string>& images) {
  const double start = monotonic_seconds();
  LITELLAMA_ASSIGN_OR_RETURN(uint64_t id, submit(std::move(request), images));
  Completion completion;
  while (true) {
    LITELLAMA_ASSIGN_OR_RETURN(std::optional<ClientEvent> event, next_event(idle_timeout_ms));
    if (!event) {
      (void)abort(id);
      return make_error(StatusCode::kUnavailable, "no answer from the scheduler for {} ms",
                        idle_timeout_ms);
    }
    if (event->request_id() != id) continue;
    if (event->kind == ClientEvent::Kind::kError) {
      StatusCode code = StatusCode::kInternal;
      for (StatusCode c :
           {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kUnsupported,
            StatusCode::kDataLoss, StatusCode::kResourceExhausted, StatusCode::kUnavailable,
            StatusCode::kOverloaded}) {
        if (event->error.code == status_code_name(c)) code = c;
      }
      return Status(code, event->error.message);
    }
    const proto::GenerateChunk& chunk = event->chunk;
    const double now = monotonic_seconds() - start;
    if (!chunk.token_ids.empty()) {
      if (completion.token_ids.empty()) completion.first_token_seconds = now;
      completion.token_times_seconds.push_back(now);
    }
    completion.text += chunk.text;
    completion.token_ids.insert(completion.token_ids.end(), chunk.token_ids.begin(),
                                chunk.token_ids.end());
    completion.n_prompt_tokens = chunk.n_prompt_tokens;
    completion.n_cached_tokens = chunk.n_cached_tokens;
    if (!chunk.top_logits.empty()) completion.top_logits = chunk.top_logits;
    if (on_chunk) on_chunk(chunk);
    if (chunk.finished) {
      completion.finish_reason = chunk.finish_reason;
      completion.total_seconds = now;
      return completion;
    }
  }
}

}  // namespace litellama::net
