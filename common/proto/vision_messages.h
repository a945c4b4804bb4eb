// Scheduler <-> vision service hop. The vision service connects a DEALER to the scheduler's
// vision ROUTER, announces itself and its embedding pool with VisionHeartbeat (and keeps doing
// so), and encodes the images the scheduler sends into the pool slots the scheduler names. The
// scheduler owns slot assignment (services/scheduler/image_table.h); the vision service only
// writes rows and says when they are complete, and the worker reads them in place through the
// pool (services/vision/embedding_pool.h).
//
// Framing: EncodeImageRequest is two ZeroMQ frames, the msgpack map and then the image's bytes
// as they came from the client (JPEG or PNG), so that images never pass through msgpack; a
// request without its bytes frame, or with more than the service's --max-image-bytes, is
// answered with an error.
#pragma once

#include <cstdint>
#include <string>

#include "common/proto/codec.h"

namespace litellama::proto {

// vision -> scheduler, every heartbeat interval and at start.
struct VisionHeartbeat {
  static constexpr MessageType kType = MessageType::kVisionHeartbeat;
  uint64_t incarnation = 0;   // random per process start: a new process has a new, empty pool
  std::string model;          // the checkpoint directory the tower came from
  std::string device;         // "cpu" (pool in shared memory) or "cuda" (pool in device memory)
  std::string pool_name;      // the EmbeddingPool the worker opens (shared-memory name on cpu)
  int32_t n_slots = 0;        // embedding slots of the pool
  int32_t rows_per_slot = 0;  // image tokens per image
  int32_t hidden = 0;         // the text model's hidden size
  int32_t image_token_id = -1;
  int64_t max_image_bytes = 0;
  MSGPACK_DEFINE_MAP(incarnation, model, device, pool_name, n_slots, rows_per_slot, hidden,
                     image_token_id, max_image_bytes);
};

// scheduler -> vision: encode the image of the next frame into `slot`.
struct EncodeImageRequest {
  static constexpr MessageType kType = MessageType::kEncodeImageRequest;
  uint64_t op_id = 0;       // the scheduler's operation, echoed by the reply
  uint64_t image_hash = 0;  // hash_image_bytes of the bytes (echoed; the reuse key)
  int32_t slot = -1;
  int64_t sent_unix_ns = 0;
  MSGPACK_DEFINE_MAP(op_id, image_hash, slot, sent_unix_ns);
};

struct EncodeImageReply {
  static constexpr MessageType kType = MessageType::kEncodeImageReply;
  uint64_t op_id = 0;
  uint64_t image_hash = 0;
  int32_t slot = -1;
  int32_t n_rows = 0;  // rows written into the slot (rows_per_slot on success)
  // Empty on success. bad_image: the bytes were no image the service can use (not JPEG/PNG,
  // truncated, too many pixels, too large), the client's fault; otherwise the service's.
  std::string error;
  bool bad_image = false;
  double encode_seconds = 0.0;   // decode + preprocess + tower + projector
  int64_t finished_unix_ns = 0;  // when the rows were complete in the pool
  MSGPACK_DEFINE_MAP(op_id, image_hash, slot, n_rows, error, bad_image, encode_seconds,
                     finished_unix_ns);
};

}  // namespace litellama::proto
