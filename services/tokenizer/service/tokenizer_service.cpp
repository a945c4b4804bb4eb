#include "services/tokenizer/service/tokenizer_service.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "common/log.h"
#include "common/net/metric_families.h"
#include "common/net/zmq_util.h"
#include "common/proto/heartbeat.h"
#include "services/tokenizer/service/detokenize_window.h"
#include "services/tokenizer/tokenizer.h"

namespace litellama {

namespace {

using net::frame_view;
using net::monotonic_seconds;

prometheus::Histogram::BucketBoundaries op_buckets() {
  return {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
          0.005,   0.01,     0.025,   0.05,   0.1,     0.25,   0.5,   1.0};
}

// Every image_token_id of `ids` becomes image_token_count copies of it; an error (the reply's
// text) when the count is out of range or the prompt would grow past kMaxExpandedPromptTokens.
Result<std::vector<int32_t>> expand_image_tokens(std::vector<int32_t> ids, int32_t image_token_id,
                                                 int32_t image_token_count) {
  if (image_token_id < 0) return ids;
  if (image_token_count < 1 || image_token_count > proto::kMaxTokensPerImage) {
    return make_error(StatusCode::kInvalidArgument, "image_token_count {} is outside [1, {}]",
                      image_token_count, proto::kMaxTokensPerImage);
  }
  const auto n_images = std::count(ids.begin(), ids.end(), image_token_id);
  if (n_images == 0 || image_token_count == 1) return ids;
  const int64_t n_expanded =
      static_cast<int64_t>(ids.size()) + n_images * (int64_t{image_token_count} - 1);
  if (n_expanded > proto::kMaxExpandedPromptTokens) {
    return make_error(StatusCode::kInvalidArgument,
                      "the prompt's {} image tokens (id {}) of {} tokens each make {} tokens, over "
                      "the limit of {}",
                      n_images, image_token_id, image_token_count, n_expanded,
                      proto::kMaxExpandedPromptTokens);
  }
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n_expanded));
  for (int32_t id : ids) {
    if (id == image_token_id) {
      out.insert(out.end(), static_cast<size_t>(image_token_count), id);
    } else {
      out.push_back(id);
    }
  }
  return out;
}

}  // namespace

struct TokenizerService::Impl {
  std::optional<Tokenizer> tokenizer;
  std::vector<int32_t> eos_token_ids;
};

TokenizerService::TokenizerService(TokenizerOptions options)
    : options_(std::move(options)),
      impl_(std::make_unique<Impl>()),
      registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  auto& duration = net::histogram_family(r, "litellama_tokenizer_op_duration_seconds",
                                         "Time to serve one encode or detokenize message");
  encode_duration_ = &duration.Add({{"op", "encode"}}, op_buckets());
  detokenize_duration_ = &duration.Add({{"op", "detokenize"}}, op_buckets());
  request_latency_ =
      net::histogram(r, "litellama_tokenizer_hop_latency_seconds",
                     "Scheduler sending a message to the tokenizer receiving it", op_buckets());
  encode_requests_ =
      net::counter(r, "litellama_tokenizer_encode_requests_total", "Encode requests served");
  detokenize_items_ = net::counter(r, "litellama_tokenizer_detokenize_items_total",
                                   "Detokenization windows served");
  protocol_errors_ =
      net::counter(r, "litellama_tokenizer_protocol_errors_total", "Unknown or malformed messages");
  net::WorkThreadServiceConfig loop;
  loop.name = "tokenizer";
  loop.peer = options_;
  loop.work_types = {proto::MessageType::kEncodeRequest, proto::MessageType::kDetokenizeRequest};
  loop.loading_what = "loading the tokenizer";
  loop_ = std::make_unique<net::WorkThreadService>(std::move(loop), registry_, protocol_errors_);
}

TokenizerService::~TokenizerService() = default;

Status TokenizerService::start() {
  LITELLAMA_RETURN_IF_ERROR(loop_->prepare());
  auto loaded = Tokenizer::load(options_.tokenizer_dir);
  if (!loaded) return loaded.status();
  impl_->tokenizer.emplace(std::move(loaded).value());
  const Tokenizer& tok = *impl_->tokenizer;
  impl_->eos_token_ids = tok.eos_token_ids();
  loop_->mark_loaded();
  {
    // A template we cannot render still serves text prompts: say so now, in the words chat
    // requests will get.
    const std::vector<Tokenizer::ChatMessage> probe = {{"user", "hello"}};
    auto rendered = options_.chat_template.empty()
                        ? tok.apply_chat_template(probe, true)
                        : tok.apply_chat_template(options_.chat_template, probe, true);
    if (!rendered) {
      LITELLAMA_LOG_WARN(
          "tokenizer: the chat template cannot be rendered: {}; text prompts are served, chat "
          "requests are refused with this reason",
          rendered.status().to_string());
    }
  }

  LITELLAMA_RETURN_IF_ERROR(loop_->connect(
      [this](std::vector<zmq::message_t>& frames) { return handle(frame_view(frames[0])); }));
  LITELLAMA_LOG_INFO("tokenizer: {} loaded, scheduler at {}, metrics on {}", options_.tokenizer_dir,
                     options_.scheduler_endpoint, loop_->metrics_port());
  return Status::ok();
}

proto::EncodeReply TokenizerService::encode(const proto::EncodeRequest& request) {
  const Tokenizer& tok = *impl_->tokenizer;
  proto::EncodeReply reply;
  reply.op_id = request.op_id;
  std::string text = request.text;
  bool add_special = request.add_special_tokens;
  if (!request.messages.empty()) {
    std::vector<Tokenizer::ChatMessage> messages;
    for (const auto& m : request.messages) {
      Tokenizer::ChatMessage& msg = messages.emplace_back();
      msg.role = m.role;
      msg.content = m.content;
      for (const auto& p : m.parts) msg.parts.push_back({p.type, p.text});
    }
    auto templated = options_.chat_template.empty()
                         ? tok.apply_chat_template(messages, true)
                         : tok.apply_chat_template(options_.chat_template, messages, true);
    if (!templated) {
      reply.error = "the chat template cannot be rendered: " + templated.status().to_string();
      return reply;
    }
    text = std::move(templated).value();
    add_special = false;  // the template writes BOS itself
  }
  if (static_cast<int64_t>(text.size()) > options_.max_prompt_bytes) {
    reply.error = fmt::format("the prompt is {} bytes, over the limit of {} bytes", text.size(),
                              options_.max_prompt_bytes);
    return reply;
  }
  auto ids = expand_image_tokens(tok.encode(text, add_special), request.image_token_id,
                                 request.image_token_count);
  if (!ids) {
    reply.error = ids.status().message();
    return reply;
  }
  reply.token_ids = std::move(ids).value();
  return reply;
}

proto::DetokenizeReply TokenizerService::detokenize(const proto::DetokenizeRequest& request) {
  const Tokenizer& tok = *impl_->tokenizer;
  proto::DetokenizeReply reply;
  reply.op_id = request.op_id;
  for (const proto::DetokenizeItem& item : request.items) {
    const DecodeFn decode = [&](std::span<const int32_t> ids) -> Result<std::string> {
      return tok.decode(ids, item.skip_special_tokens);
    };
    auto result = detokenize_window(item, decode);
    if (!result) {
      reply.error = result.status().to_string();
      reply.items.clear();
      return reply;
    }
    reply.items.push_back(std::move(result).value());
    for (int32_t id : item.piece_ids) reply.items.back().pieces.push_back(tok.token_bytes(id));
  }
  return reply;
}

std::string TokenizerService::handle(std::string_view bytes) {
  auto envelope = proto::Envelope::parse(bytes);
  if (!envelope) {
    protocol_errors_->Increment();
    return "";
  }
  const double start = monotonic_seconds();
  auto observe_hop = [&](int64_t sent_unix_ns) {
    if (sent_unix_ns > 0) {
      request_latency_->Observe(std::max<int64_t>(0, net::unix_now_ns() - sent_unix_ns) * 1e-9);
    }
  };
  // Serves a decoded request and times it; a malformed one is a protocol error, unanswered.
  auto reply_to = [&](auto request, auto&& serve, prometheus::Histogram* duration) -> std::string {
    if (!request) {
      protocol_errors_->Increment();
      return "";
    }
    observe_hop(request->sent_unix_ns);
    std::string reply = proto::encode(serve(*request));
    duration->Observe(monotonic_seconds() - start);
    return reply;
  };
  if (envelope->type() == proto::MessageType::kEncodeRequest) {
    return reply_to(
        envelope->as<proto::EncodeRequest>(),
        [&](const proto::EncodeRequest& r) {
          proto::EncodeReply reply = encode(r);
          encode_requests_->Increment();
          return reply;
        },
        encode_duration_);
  }
  return reply_to(
      envelope->as<proto::DetokenizeRequest>(),
      [&](const proto::DetokenizeRequest& r) {
        proto::DetokenizeReply reply = detokenize(r);
        detokenize_items_->Increment(static_cast<double>(r.items.size()));
        return reply;
      },
      detokenize_duration_);
}

void TokenizerService::run() {
  proto::TokenizerHeartbeat hb;
  hb.incarnation = loop_->incarnation();
  hb.eos_token_ids = impl_->eos_token_ids;
  loop_->run(proto::encode(hb));
}

}  // namespace litellama
