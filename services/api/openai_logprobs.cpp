#include "services/api/openai_logprobs.h"

#include <fmt/format.h>

#include <cmath>

#include "services/api/openai_protocol.h"

namespace litellama::api {

namespace {

using ojson = nlohmann::ordered_json;

bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

ojson byte_values(const std::string& bytes) {
  ojson out = ojson::array();
  for (char c : bytes) out.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return out;
}

// JSON has neither NaN nor infinities: an unknown logprob is null, an impossible one (a logit
// of -inf) -9999 as OpenAI sends it.
ojson logprob_value(float v) {
  if (std::isnan(v)) return ojson(nullptr);
  if (std::isinf(v)) return ojson(-9999.0);
  return ojson(v);
}

}  // namespace

bool read_logprobs(const nlohmann::json& body, bool chat, proto::GenerateRequest* out,
                   ApiError* error) {
  auto bad = [&](const char* param, const std::string& message) {
    *error = ApiError{};
    error->param = param;
    error->message = message;
    return false;
  };
  auto lp = body.find("logprobs");
  const bool has_lp = lp != body.end() && !lp->is_null();
  if (chat) {
    if (has_lp && !lp->is_boolean()) return bad("logprobs", "'logprobs' must be a boolean");
    out->logprobs = has_lp && lp->get<bool>();
    auto top = body.find("top_logprobs");
    if (top == body.end() || top->is_null()) return true;
    if (!top->is_number_integer() || top->get<int64_t>() < 0 ||
        top->get<int64_t>() > proto::kMaxTopLogprobs) {
      return bad("top_logprobs", fmt::format("'top_logprobs' must be an integer in [0, {}]",
                                             proto::kMaxTopLogprobs));
    }
    if (!out->logprobs) return bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    out->top_logprobs = static_cast<int32_t>(top->get<int64_t>());
    return true;
  }
  if (!has_lp) return true;
  if (!lp->is_number_integer() || lp->get<int64_t>() < 0 ||
      lp->get<int64_t>() > proto::kMaxTopLogprobs) {
    return bad("logprobs",
               fmt::format("'logprobs' must be an integer in [0, {}]", proto::kMaxTopLogprobs));
  }
  out->logprobs = true;
  out->top_logprobs = static_cast<int32_t>(lp->get<int64_t>());
  return true;
}

std::vector<TokenLogprob> chunk_logprobs(const proto::GenerateChunk& chunk) {
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < chunk.token_ids.size() && i < chunk.logprobs.size(); ++i) {
    TokenLogprob t;
    t.logprob = chunk.logprobs[i];
    const std::vector<std::string>* pieces = i < chunk.pieces.size() ? &chunk.pieces[i] : nullptr;
    if (pieces != nullptr && !pieces->empty()) t.bytes = (*pieces)[0];
    if (i < chunk.top_logprobs.size()) {
      const auto& top = chunk.top_logprobs[i];
      for (size_t k = 0; k < top.size(); ++k) {
        const bool known = pieces != nullptr && k + 1 < pieces->size();
        t.top.emplace_back(known ? (*pieces)[k + 1] : std::string(), top[k].second);
      }
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::string token_text(const std::string& bytes) {
  if (valid_utf8(bytes)) return bytes;
  std::string out = "bytes:";
  for (char c : bytes) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  return out;
}

nlohmann::ordered_json chat_logprobs_json(const std::vector<TokenLogprob>& tokens) {
  ojson content = ojson::array();
  for (const TokenLogprob& t : tokens) {
    ojson top = ojson::array();
    for (const auto& [bytes, lp] : t.top) {
      top.push_back(ojson{{"token", token_text(bytes)},
                          {"logprob", logprob_value(lp)},
                          {"bytes", byte_values(bytes)}});
    }
    content.push_back(ojson{{"token", token_text(t.bytes)},
                            {"logprob", logprob_value(t.logprob)},
                            {"bytes", byte_values(t.bytes)},
                            {"top_logprobs", std::move(top)}});
  }
  return ojson{{"content", std::move(content)}};
}

nlohmann::ordered_json completion_logprobs_json(const std::vector<TokenLogprob>& tokens,
                                                size_t text_offset) {
  ojson text = ojson::array(), lps = ojson::array(), tops = ojson::array(),
        offsets = ojson::array();
  for (const TokenLogprob& t : tokens) {
    text.push_back(token_text(t.bytes));
    lps.push_back(logprob_value(t.logprob));
    ojson top = ojson::object();
    for (const auto& [bytes, lp] : t.top) top[token_text(bytes)] = logprob_value(lp);
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += t.bytes.size();
  }
  return ojson{{"tokens", std::move(text)},
               {"token_logprobs", std::move(lps)},
               {"top_logprobs", std::move(tops)},
               {"text_offset", std::move(offsets)}};
}

}  // namespace litellama::api
