// Wire codec shared by every process hop. A message is one msgpack map whose keys are the fields of
// a small typed struct (declared in one header per hop) plus two envelope keys every message
// carries: "v" (kProtocolVersion) and "type" (message_type_name). Decoding checks the envelope
// first, then converts the body; anything malformed comes back as a Status, never an exception,
// so a service counts and logs it and keeps going.
//
// What must stay true: a receiver ignores keys it does not know (fields may be added without a
// version bump); removing or retyping a field needs kProtocolVersion + 1.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <msgpack.hpp>

#include "common/status.h"

namespace litellama::proto {

inline constexpr uint32_t kProtocolVersion = 3;

// Every message type of every hop, in one list so a decoder can name what it got.
enum class MessageType : uint8_t {
  // client <-> scheduler (client_messages.h)
  kGenerateRequest,
  kGenerateChunk,
  kAbortRequest,
  kRequestError,
  kServerInfoRequest,
  kServerInfoReply,
  // scheduler <-> tokenizer (tokenizer_messages.h)
  kTokenizerHeartbeat,
  kEncodeRequest,
  kEncodeReply,
  kDetokenizeRequest,
  kDetokenizeReply,
  // scheduler <-> worker (worker_messages.h)
  kWorkerHeartbeat,
  kStepRequest,
  kStepResult,
  // scheduler -> any peer (heartbeat.h)
  kSchedulerHeartbeat,
  // scheduler <-> vision service (vision_messages.h)
  kVisionHeartbeat,
  kEncodeImageRequest,
  kEncodeImageReply,
};

const char* message_type_name(MessageType type);
std::optional<MessageType> parse_message_type(std::string_view name);

// A decoded frame whose envelope was checked; the body is converted on demand.
class Envelope {
 public:
  // Parses `bytes`: a msgpack map with a supported "v" and a known "type". Limits on array,
  // map and string sizes keep a hostile frame from allocating without bound.
  static Result<Envelope> parse(std::string_view bytes);

  MessageType type() const { return type_; }

  // Converts the body into T; fails when T is not the envelope's type or a field has the wrong
  // msgpack type.
  template <typename T>
  Result<T> as() const {
    if (T::kType != type_) {
      return make_error(StatusCode::kInvalidArgument, "expected message '{}', got '{}'",
                        message_type_name(T::kType), message_type_name(type_));
    }
    try {
      T message;
      handle_->get().convert(message);
      return message;
    } catch (const std::exception&) {
      return make_error(StatusCode::kInvalidArgument, "malformed '{}' message: {}",
                        message_type_name(type_), describe_bad_field<T>(handle_->get()));
    }
  }

 private:
  // Which field made the conversion to T fail: each key alone is converted into a fresh T (a
  // MSGPACK_DEFINE_MAP conversion skips absent keys, and unknown keys never fail), so the first
  // that throws is one of T's own field names, safe to report.
  template <typename T>
  static std::string describe_bad_field(const msgpack::object& root) {
    if (root.type == msgpack::type::MAP) {
      for (uint32_t i = 0; i < root.via.map.size; ++i) {
        msgpack::object_kv kv = root.via.map.ptr[i];
        if (kv.key.type != msgpack::type::STR) continue;
        msgpack::object single;
        single.type = msgpack::type::MAP;
        single.via.map.size = 1;
        single.via.map.ptr = &kv;
        try {
          T message;
          single.convert(message);
        } catch (const std::exception&) {
          return "field '" + std::string(kv.key.via.str.ptr, kv.key.via.str.size) +
                 "' has the wrong type";
        }
      }
    }
    return "a field has the wrong type";
  }

  std::shared_ptr<msgpack::object_handle> handle_;
  MessageType type_ = MessageType::kGenerateRequest;
};

// The request_id of a frame that could not be decoded as its message, so that the error can go
// back under the sender's own id: the value of a non-negative integer "request_id" key when the
// frame is a msgpack map, else 0.
uint64_t peek_request_id(std::string_view bytes);

// Encodes `message` (a struct with kType and MSGPACK_DEFINE_MAP) as one flat msgpack map.
template <typename T>
std::string encode(const T& message) {
  msgpack::zone zone;
  msgpack::object body(message, zone);
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  const uint32_t n_fields = body.type == msgpack::type::MAP ? body.via.map.size : 0;
  packer.pack_map(n_fields + 2);
  packer.pack(std::string_view("v"));
  packer.pack(kProtocolVersion);
  packer.pack(std::string_view("type"));
  packer.pack(std::string_view(message_type_name(T::kType)));
  for (uint32_t i = 0; i < n_fields; ++i) {
    packer.pack(body.via.map.ptr[i].key);
    packer.pack(body.via.map.ptr[i].val);
  }
  return std::string(buffer.data(), buffer.size());
}

// Decodes `bytes` straight into T (envelope checks included).
template <typename T>
Result<T> decode(std::string_view bytes) {
  LITELLAMA_ASSIGN_OR_RETURN(Envelope envelope, Envelope::parse(bytes));
  return envelope.as<T>();
}

}  // namespace litellama::proto
