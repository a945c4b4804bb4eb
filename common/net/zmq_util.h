// ZeroMQ helpers shared by the services and the client: endpoint preparation, framed send/receive
// that report a vanished peer instead of throwing, ids and clocks for heartbeats and latencies.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include <zmq.hpp>

#include "common/proto/codec.h"
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
// Checks an endpoint a service binds or connects: the scheme (ipc:// or tcp://); for ipc:// the
// run directory (created 0750 when missing, refused when another user owns it or others can write
// it: run_dir.h); for tcp:// that the host is loopback unless allow_insecure_tcp, since ZeroMQ's
// tcp transport as used here authenticates no one.
Status prepare_endpoint(const std::string& endpoint, bool allow_insecure_tcp = false);
// Whether a tcp://HOST:PORT endpoint's host is a loopback address (127.0.0.0/8, ::1, localhost).
bool is_loopback_tcp(const std::string& endpoint);

// A peer is down after peer_timeout_ms without a heartbeat; less than two heartbeat intervals
// would declare healthy peers down whenever one heartbeat is late.
Status check_liveness_flags(int32_t heartbeat_interval_ms, int32_t peer_timeout_ms);

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

// Waits up to timeout_ms for a message on any of `sockets`. A wait cut short by a signal returns
// as a timeout would, so that the caller's loop gets to check its stop flag.
void wait_readable(std::initializer_list<zmq::socket_t*> sockets, int timeout_ms);

// Sends each message waiting on `from` on to `to`, frame by frame: a service's work thread
// answers through its loop's socket this way.
void forward_waiting(zmq::socket_t& from, zmq::socket_t& to, std::vector<zmq::message_t>* frames);

// The envelope of a one-frame message; an error for more frames or a frame that does not parse.
Result<proto::Envelope> parse_one_frame(const std::vector<zmq::message_t>& frames);

}  // namespace litellama::net
