#include "common/net/work_thread_service.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "common/log.h"
#include "common/net/zmq_util.h"

namespace litellama::net {

namespace {

// Never a msgpack envelope (those are maps), so it cannot be mistaken for work.
constexpr const char* kStopWork = "stop";

}  // namespace

WorkThreadService::WorkThreadService(WorkThreadServiceConfig config,
                                     std::shared_ptr<prometheus::Registry> registry,
                                     prometheus::Counter* protocol_errors)
    : config_(std::move(config)),
      registry_(std::move(registry)),
      protocol_errors_(protocol_errors),
      work_endpoint_("inproc://" + config_.name + "-work"),
      incarnation_(random_id()) {}

WorkThreadService::~WorkThreadService() {
  stop_.store(true);
  stop_work();
}

void WorkThreadService::stop_work() {
  if (!work_thread_.joinable()) return;
  try {
    (void)send_one(work_io_, kStopWork);
  } catch (const zmq::error_t&) {
  }
  work_thread_.join();
}

std::string WorkThreadService::ready_reason() const {
  if (!loaded_.load()) return config_.loading_what;
  if (monotonic_seconds() - last_scheduler_seen_.load() > config_.peer.peer_timeout_ms / 1000.0) {
    return "the scheduler is down";
  }
  return "";
}

std::string WorkThreadService::metrics_port() const {
  return metrics_ ? std::to_string(metrics_->port()) : std::string("(off)");
}

Status WorkThreadService::prepare() {
  LITELLAMA_RETURN_IF_ERROR(
      check_liveness_flags(config_.peer.heartbeat_interval_ms, config_.peer.peer_timeout_ms));
  LITELLAMA_RETURN_IF_ERROR(
      prepare_endpoint(config_.peer.scheduler_endpoint, config_.peer.allow_insecure_tcp));
  if (!config_.peer.metrics_listen.empty()) {
    LITELLAMA_ASSIGN_OR_RETURN(metrics_,
                               MetricsServer::start(config_.peer.metrics_listen, registry_,
                                                    [this] { return ready_reason(); }));
  }
  return Status::ok();
}

Status WorkThreadService::connect(Serve serve, std::function<void()> after_reply) {
  try {
    scheduler_ = zmq::socket_t(context_, zmq::socket_type::dealer);
    configure_socket(scheduler_);
    scheduler_.set(zmq::sockopt::routing_id, fmt::format("{}-{:016x}", config_.name, incarnation_));
    scheduler_.connect(config_.peer.scheduler_endpoint);
    work_io_ = zmq::socket_t(context_, zmq::socket_type::pair);
    work_io_.set(zmq::sockopt::linger, 0);
    work_io_.bind(work_endpoint_);
  } catch (const zmq::error_t& e) {
    return make_error(StatusCode::kUnavailable, "cannot connect to '{}': {}",
                      config_.peer.scheduler_endpoint, e.what());
  }
  work_thread_ = std::thread([this, serve = std::move(serve), after = std::move(after_reply)] {
    work_main(serve, after);
  });
  return Status::ok();
}

void WorkThreadService::work_main(const Serve& serve, const std::function<void()>& after_reply) {
  zmq::socket_t io(context_, zmq::socket_type::pair);
  io.set(zmq::sockopt::linger, 0);
  io.set(zmq::sockopt::rcvtimeo, 200);
  io.connect(work_endpoint_);
  std::vector<zmq::message_t> frames;
  while (!stop_.load()) {
    zmq::message_t first;
    if (!io.recv(first, zmq::recv_flags::none)) continue;
    if (!first.more() && frame_view(first) == kStopWork) break;
    frames.clear();
    bool more = first.more();
    frames.push_back(std::move(first));
    while (more) {  // the I/O thread sends a message's frames at once
      zmq::message_t part;
      if (!io.recv(part, zmq::recv_flags::none)) break;
      more = part.more();
      frames.push_back(std::move(part));
    }
    const std::string reply = serve(frames);
    if (!reply.empty()) io.send(zmq::buffer(reply), zmq::send_flags::none);
    if (after_reply) after_reply();
  }
}

void WorkThreadService::run(const std::string& heartbeat) {
  std::vector<zmq::message_t> frames;
  double last_heartbeat = 0.0;
  const std::string& name = config_.name;
  while (!stop_.load()) {
    const double now = monotonic_seconds();
    if (now - last_heartbeat >= config_.peer.heartbeat_interval_ms / 1000.0) {
      last_heartbeat = now;
      (void)send_one(scheduler_, heartbeat);
    }
    wait_readable({&scheduler_, &work_io_}, std::max(1, config_.peer.heartbeat_interval_ms / 2));
    // Replies first: the scheduler is waiting on them.
    forward_waiting(work_io_, scheduler_, &frames);
    while (recv_frames(scheduler_, &frames)) {
      if (frames.empty()) continue;
      auto envelope = proto::Envelope::parse(frame_view(frames[0]));
      if (!envelope) {
        protocol_errors_->Increment();
        LITELLAMA_LOG_WARN("{}: dropped a message: {}", name, envelope.status().to_string());
        continue;
      }
      const proto::MessageType type = envelope->type();
      const bool work = std::find(config_.work_types.begin(), config_.work_types.end(), type) !=
                        config_.work_types.end();
      if (work || type == proto::MessageType::kSchedulerHeartbeat) {
        const size_t allowed = work ? config_.max_work_frames : 1;
        if (frames.size() > allowed) {
          protocol_errors_->Increment();
          LITELLAMA_LOG_WARN("{}: dropped a '{}' message of {} frames (at most {})", name,
                             proto::message_type_name(type), frames.size(), allowed);
          continue;
        }
      }
      last_scheduler_seen_.store(monotonic_seconds());
      if (type == proto::MessageType::kSchedulerHeartbeat) continue;
      if (!work) {
        protocol_errors_->Increment();
        LITELLAMA_LOG_WARN("{}: dropped an unexpected '{}' message", name,
                           proto::message_type_name(type));
        continue;
      }
      // The work thread serves it; messages queue there in order.
      for (size_t i = 0; i < frames.size(); ++i) {
        (void)work_io_.send(
            frames[i], i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    }
  }
  stop_work();
  LITELLAMA_LOG_INFO("{}: stopped", name);
}

}  // namespace litellama::net
