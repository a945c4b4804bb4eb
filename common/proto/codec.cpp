#include "common/proto/codec.h"

#include <array>
#include <memory>

namespace litellama::proto {

namespace {

struct TypeName {
  MessageType type;
  const char* name;
};

// Every MessageType once; message_type_name's switch keeps the two in step at compile time.
constexpr std::array kTypeNames = {
    TypeName{MessageType::kGenerateRequest, "generate_request"},
    TypeName{MessageType::kGenerateChunk, "generate_chunk"},
    TypeName{MessageType::kAbortRequest, "abort_request"},
    TypeName{MessageType::kRequestError, "request_error"},
    TypeName{MessageType::kServerInfoRequest, "server_info_request"},
    TypeName{MessageType::kServerInfoReply, "server_info_reply"},
    TypeName{MessageType::kTokenizerHeartbeat, "tokenizer_heartbeat"},
    TypeName{MessageType::kEncodeRequest, "encode_request"},
    TypeName{MessageType::kEncodeReply, "encode_reply"},
    TypeName{MessageType::kDetokenizeRequest, "detokenize_request"},
    TypeName{MessageType::kDetokenizeReply, "detokenize_reply"},
    TypeName{MessageType::kWorkerHeartbeat, "worker_heartbeat"},
    TypeName{MessageType::kStepRequest, "step_request"},
    TypeName{MessageType::kStepResult, "step_result"},
    TypeName{MessageType::kSchedulerHeartbeat, "scheduler_heartbeat"},
    TypeName{MessageType::kVisionHeartbeat, "vision_heartbeat"},
    TypeName{MessageType::kEncodeImageRequest, "encode_image_request"},
    TypeName{MessageType::kEncodeImageReply, "encode_image_reply"},
};

// Frames are small control messages; step data rides in shared memory.
constexpr size_t kMaxArrayElements = size_t{1} << 22;
constexpr size_t kMaxMapEntries = 1024;
constexpr size_t kMaxStringBytes = size_t{16} << 20;
constexpr size_t kMaxBinBytes = size_t{16} << 20;
constexpr size_t kMaxDepth = 8;

const msgpack::object* find_key(const msgpack::object& map, std::string_view key) {
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR &&
        std::string_view(kv.key.via.str.ptr, kv.key.via.str.size) == key) {
      return &kv.val;
    }
  }
  return nullptr;
}

}  // namespace

const char* message_type_name(MessageType type) {
  switch (type) {
    case MessageType::kGenerateRequest:
    case MessageType::kGenerateChunk:
    case MessageType::kAbortRequest:
    case MessageType::kRequestError:
    case MessageType::kServerInfoRequest:
    case MessageType::kServerInfoReply:
    case MessageType::kTokenizerHeartbeat:
    case MessageType::kEncodeRequest:
    case MessageType::kEncodeReply:
    case MessageType::kDetokenizeRequest:
    case MessageType::kDetokenizeReply:
    case MessageType::kWorkerHeartbeat:
    case MessageType::kStepRequest:
    case MessageType::kStepResult:
    case MessageType::kSchedulerHeartbeat:
    case MessageType::kVisionHeartbeat:
    case MessageType::kEncodeImageRequest:
    case MessageType::kEncodeImageReply:
      return kTypeNames[static_cast<size_t>(type)].name;
  }
  return "unknown";
}

std::optional<MessageType> parse_message_type(std::string_view name) {
  for (const TypeName& t : kTypeNames) {
    if (name == t.name) return t.type;
  }
  return std::nullopt;
}

uint64_t peek_request_id(std::string_view bytes) {
  try {
    size_t offset = 0;
    const msgpack::unpack_limit limit(kMaxArrayElements, kMaxMapEntries, kMaxStringBytes,
                                      kMaxBinBytes, 0, kMaxDepth);
    msgpack::object_handle handle =
        msgpack::unpack(bytes.data(), bytes.size(), offset, nullptr, nullptr, limit);
    const msgpack::object& root = handle.get();
    if (root.type != msgpack::type::MAP) return 0;
    const msgpack::object* id = find_key(root, "request_id");
    if (id != nullptr && id->type == msgpack::type::POSITIVE_INTEGER) return id->via.u64;
  } catch (const std::exception&) {
  }
  return 0;
}

Result<Envelope> Envelope::parse(std::string_view bytes) {
  auto handle = std::make_shared<msgpack::object_handle>();
  try {
    size_t offset = 0;
    const msgpack::unpack_limit limit(kMaxArrayElements, kMaxMapEntries, kMaxStringBytes,
                                      kMaxBinBytes, 0, kMaxDepth);
    *handle = msgpack::unpack(bytes.data(), bytes.size(), offset, nullptr, nullptr, limit);
    if (offset != bytes.size()) {
      return make_error(StatusCode::kInvalidArgument, "{} trailing bytes after the message",
                        bytes.size() - offset);
    }
  } catch (const std::exception& e) {
    return make_error(StatusCode::kInvalidArgument, "not a msgpack message: {}", e.what());
  }
  const msgpack::object& root = handle->get();
  if (root.type != msgpack::type::MAP) {
    return make_error(StatusCode::kInvalidArgument, "message is not a msgpack map");
  }
  const msgpack::object* v = find_key(root, "v");
  if (v == nullptr || v->type != msgpack::type::POSITIVE_INTEGER) {
    return make_error(StatusCode::kInvalidArgument, "message has no protocol version 'v'");
  }
  if (v->via.u64 != kProtocolVersion) {
    return make_error(StatusCode::kUnsupported,
                      "protocol version {} is not supported (this build speaks version {})",
                      v->via.u64, kProtocolVersion);
  }
  const msgpack::object* type = find_key(root, "type");
  if (type == nullptr || type->type != msgpack::type::STR) {
    return make_error(StatusCode::kInvalidArgument, "message has no 'type'");
  }
  const std::string_view type_name(type->via.str.ptr, type->via.str.size);
  const std::optional<MessageType> parsed = parse_message_type(type_name);
  if (!parsed) {
    // Never echo the peer's bytes back into logs beyond a short, printable prefix.
    return make_error(StatusCode::kInvalidArgument, "unknown message type ({} bytes)",
                      type_name.size());
  }
  Envelope envelope;
  envelope.handle_ = std::move(handle);
  envelope.type_ = *parsed;
  return envelope;
}

}  // namespace litellama::proto
