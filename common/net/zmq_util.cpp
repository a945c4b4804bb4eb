#include "common/net/zmq_util.h"

#include <chrono>
#include <random>

#include "common/net/run_dir.h"

namespace litellama::net {

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t random_id() {
  static thread_local std::mt19937_64 gen{std::random_device{}() ^
                                          static_cast<uint64_t>(unix_now_ns())};
  uint64_t id = 0;
  while (id == 0) id = gen();
  return id;
}

std::string ipc_endpoint(const std::string& dir, const std::string& name) {
  return "ipc://" + dir + "/" + name + ".sock";
}

bool is_loopback_tcp(const std::string& endpoint) {
  constexpr std::string_view kTcp = "tcp://";
  if (endpoint.rfind(kTcp, 0) != 0) return false;
  std::string host = endpoint.substr(kTcp.size());
  const size_t colon = host.rfind(':');
  if (colon == std::string::npos) return false;
  host = host.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

Status prepare_endpoint(const std::string& endpoint, bool allow_insecure_tcp) {
  constexpr std::string_view kIpc = "ipc://";
  constexpr std::string_view kTcp = "tcp://";
  if (endpoint.rfind(kTcp, 0) == 0) {
    if (allow_insecure_tcp || is_loopback_tcp(endpoint)) return Status::ok();
    return make_error(StatusCode::kInvalidArgument,
                      "refusing '{}': tcp:// endpoints are not authenticated, so anyone who can "
                      "reach the port could send requests or pose as a peer; use ipc:// or a "
                      "loopback address, or pass --insecure-tcp on a network you trust",
                      endpoint);
  }
  if (endpoint.rfind(kIpc, 0) != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "endpoint '{}' must start with ipc:// or tcp://", endpoint);
  }
  const std::string dir = ipc_dir(endpoint);
  if (dir.empty() || dir == "/") return Status::ok();
  return prepare_run_dir(dir);
}

Status check_liveness_flags(int32_t heartbeat_interval_ms, int32_t peer_timeout_ms) {
  if (heartbeat_interval_ms <= 0 || peer_timeout_ms < 2 * heartbeat_interval_ms) {
    return make_error(StatusCode::kInvalidArgument,
                      "--peer-timeout-ms {} is below two heartbeat intervals (--heartbeat-ms {}): "
                      "peers would be declared down between two heartbeats; use at least {}",
                      peer_timeout_ms, heartbeat_interval_ms, 2 * heartbeat_interval_ms);
  }
  return Status::ok();
}

void configure_socket(zmq::socket_t& socket) {
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::sndhwm, 100000);
  socket.set(zmq::sockopt::rcvhwm, 100000);
}

void configure_router(zmq::socket_t& socket) {
  configure_socket(socket);
  socket.set(zmq::sockopt::router_mandatory, 1);
}

SendResult send_to(zmq::socket_t& router, std::string_view identity, std::string_view payload) {
  try {
    auto sent = router.send(zmq::buffer(identity.data(), identity.size()),
                            zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (!sent) return SendResult::kWouldBlock;
    router.send(zmq::buffer(payload.data(), payload.size()), zmq::send_flags::dontwait);
    return SendResult::kSent;
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH) return SendResult::kPeerGone;
    throw;
  }
}

SendResult send_one(zmq::socket_t& socket, std::string_view payload) {
  auto sent = socket.send(zmq::buffer(payload.data(), payload.size()), zmq::send_flags::dontwait);
  return sent ? SendResult::kSent : SendResult::kWouldBlock;
}

bool recv_frames(zmq::socket_t& socket, std::vector<zmq::message_t>* frames) {
  frames->clear();
  while (true) {
    zmq::message_t msg;
    auto got =
        socket.recv(msg, frames->empty() ? zmq::recv_flags::dontwait : zmq::recv_flags::none);
    if (!got) return false;
    const bool more = msg.more();
    frames->push_back(std::move(msg));
    if (!more) return true;
  }
}

void wait_readable(std::initializer_list<zmq::socket_t*> sockets, int timeout_ms) {
  std::vector<zmq::pollitem_t> items;
  items.reserve(sockets.size());
  for (zmq::socket_t* s : sockets) items.push_back({s->handle(), 0, ZMQ_POLLIN, 0});
  try {
    zmq::poll(items, std::chrono::milliseconds(timeout_ms));
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
  }
}

void forward_waiting(zmq::socket_t& from, zmq::socket_t& to, std::vector<zmq::message_t>* frames) {
  while (recv_frames(from, frames)) {
    for (auto& f : *frames) (void)send_one(to, frame_view(f));
  }
}

Result<proto::Envelope> parse_one_frame(const std::vector<zmq::message_t>& frames) {
  if (frames.size() != 1) {
    return make_error(StatusCode::kInvalidArgument, "a message of {} frames, expected 1",
                      frames.size());
  }
  return proto::Envelope::parse(frame_view(frames[0]));
}

}  // namespace litellama::net
