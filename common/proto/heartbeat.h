// Scheduler -> worker and tokenizers: the scheduler is alive. Peers mark it down (and report 503
// on /ready) when none arrived for their peer timeout, and re-announce themselves on the next one.
#pragma once

#include <cstdint>

#include "common/proto/codec.h"

namespace litellama::proto {

struct SchedulerHeartbeat {
  static constexpr MessageType kType = MessageType::kSchedulerHeartbeat;
  uint64_t incarnation = 0;  // random per scheduler start
  // To a worker: true while the scheduler serves another worker and keeps this one as standby
  // (it is used once the serving worker is gone). Always false to tokenizers.
  bool standby = false;
  MSGPACK_DEFINE_MAP(incarnation, standby);
};

}  // namespace litellama::proto
