// ZeroMQ helpers shared by the services and the client: endpoint preparation, framed send/receive
// that report a vanished peer instead of throwing, ids and clocks for heartbeats and latencies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "common/status.h"

namespace litellama::net {

// Wall clock in nanoseconds since the epoch (comparable across processes of one host).
int64_t unix_now_ns();
// Monotonic seconds, for intervals inside one process.
double monotonic_seconds();
// A random non-zero 64-bit id (incarnations, client routing ids).
uint64_t random_id();

// "ipc://<dir>/<name>.sock".
std::string ipc_endpoint(const std::string& dir, const std::string& name);
// Checks the scheme (ipc:// or tcp://) and creates the directory of an ipc:// path.
Status prepare_endpoint(const std::string& endpoint);

// Socket options every LiteLLaMA socket gets: no linger on close, generous queues.
void configure_socket(zmq::socket_t& socket);
// A ROUTER that reports unroutable sends (peer gone) instead of dropping them silently.
void configure_router(zmq::socket_t& socket);

enum class SendResult { kSent, kPeerGone, kWouldBlock };

// ROUTER: [identity, payload].
SendResult send_to(zmq::socket_t& router, std::string_view identity, std::string_view payload);
// DEALER / PAIR: [payload].
SendResult send_one(zmq::socket_t& socket, std::string_view payload);

// Receives every frame of one message without blocking; false when none was waiting.
bool recv_frames(zmq::socket_t& socket, std::vector<zmq::message_t>* frames);

inline std::string_view frame_view(const zmq::message_t& m) {
  return std::string_view(static_cast<const char*>(m.data()), m.size());
}

}  // namespace litellama::net
