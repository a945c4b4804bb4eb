// Fuzz target: the wire codec (common/proto/codec.h) on arbitrary frames, for every message type
// of every hop. Properties: Envelope::parse and Envelope::as<T> return a value or an error, never
// crash; a frame decodes as at most its envelope's type; a decoded message re-encodes to bytes
// that decode to the same message (encode(decode(encode(m))) == encode(m)).
#include <cstdint>
#include <string>
#include <string_view>

#include "common/proto/client_messages.h"
#include "common/proto/codec.h"
#include "common/proto/heartbeat.h"
#include "common/proto/tokenizer_messages.h"
#include "common/proto/worker_messages.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using namespace litellama::proto;

template <typename T>
void check(const Envelope& envelope) {
  auto message = envelope.as<T>();
  if (envelope.type() != T::kType) {
    FUZZ_CHECK(!message.is_ok(), "a frame decoded as a type other than its envelope's");
    return;
  }
  if (!message.is_ok()) return;
  const std::string once = encode(*message);
  auto again = decode<T>(once);
  FUZZ_CHECK(again.is_ok(), std::string("re-encoded ") + message_type_name(T::kType) +
                                " does not decode: " + again.status().to_string());
  FUZZ_CHECK(encode(*again) == once,
             std::string("re-encoded ") + message_type_name(T::kType) + " changed on a round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto envelope = Envelope::parse(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!envelope.is_ok()) return 0;
  FUZZ_CHECK(message_type_name(envelope->type()) != nullptr, "unnamed message type");
  FUZZ_CHECK(parse_message_type(message_type_name(envelope->type())) == envelope->type(),
             "message type name does not parse back");
  check<GenerateRequest>(*envelope);
  check<GenerateChunk>(*envelope);
  check<AbortRequest>(*envelope);
  check<RequestError>(*envelope);
  check<ServerInfoRequest>(*envelope);
  check<ServerInfoReply>(*envelope);
  check<TokenizerHeartbeat>(*envelope);
  check<EncodeRequest>(*envelope);
  check<EncodeReply>(*envelope);
  check<DetokenizeRequest>(*envelope);
  check<DetokenizeReply>(*envelope);
  check<WorkerHeartbeat>(*envelope);
  check<StepRequest>(*envelope);
  check<StepResult>(*envelope);
  check<SchedulerHeartbeat>(*envelope);
  return 0;
}
