#include "services/api/openai_protocol.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <regex>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>

namespace litellama::api {

using nlohmann::json;
// Responses keep OpenAI's field order (id, object, created, model, choices, usage).
using ojson = nlohmann::ordered_json;

namespace {

// Text out of the server is valid UTF-8 (the scheduler never splits a character); replacing
// anything else keeps dump() from throwing whatever reaches it.
std::string dump(const ojson& j) {
  return j.dump(-1, ' ', false, ojson::error_handler_t::replace);
}

ApiError bad(const std::string& param, const std::string& message) {
  ApiError e;
  e.http_status = 400;
  e.param = param;
  e.message = message;
  return e;
}

// Whether a present field asks for something (null, false, 0, "" and [] do not).
bool asks_for(const json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return true;
}

// Reads an optional numeric field within [lo, hi]: any finite number for double, an integer for
// int64_t (unsigned values above int64 read as the largest int64: out of range either way).
template <typename T>
bool read_in_range(const json& body, const char* name, T lo, T hi, T* out, ApiError* error) {
  constexpr bool kInteger = std::is_integral_v<T>;
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (kInteger ? !it->is_number_integer() : !it->is_number()) {
    *error = bad(name, fmt::format("'{}' must be {}", name, kInteger ? "an integer" : "a number"));
    return false;
  }
  T v;
  if constexpr (kInteger) {
    v = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX
                                                                              : it->get<int64_t>();
  } else {
    v = it->get<double>();
  }
  if ((!kInteger && !std::isfinite(static_cast<double>(v))) || v < lo || v > hi) {
    *error = bad(name, fmt::format("'{}' must be in [{}, {}], got {}", name, lo, hi, v));
    return false;
  }
  *out = v;
  return true;
}

bool read_number(const json& body, const char* name, double lo, double hi, double* out,
                 ApiError* error) {
  return read_in_range(body, name, lo, hi, out, error);
}

bool read_int(const json& body, const char* name, int64_t lo, int64_t hi, int64_t* out,
              ApiError* error) {
  return read_in_range(body, name, lo, hi, out, error);
}

bool read_bool(const json& body, const char* name, bool* out, ApiError* error) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_boolean()) {
    *error = bad(name, fmt::format("'{}' must be a boolean", name));
    return false;
  }
  *out = it->get<bool>();
  return true;
}

// Token ids: a non-empty array of non-negative integers.
bool read_ids(const json& v, const char* param, std::vector<int32_t>* out, ApiError* error) {
  out->clear();
  for (const auto& id : v) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      *error = bad(param, fmt::format("'{}' token ids must be non-negative integers", param));
      return false;
    }
    out->push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return true;
}

// Standard base64 (RFC 4648, with or without '=' padding; no whitespace) to bytes; nullopt when
// anything else is there. Hand-written: the few lines it takes are less than a dependency for
// it (none of the project's libraries exposes a public decoder).
std::optional<std::string> base64_decode(std::string_view in) {
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    int v = c >= 'A' && c <= 'Z'   ? c - 'A'
            : c >= 'a' && c <= 'z' ? c - 'a' + 26
            : c >= '0' && c <= '9' ? c - '0' + 52
            : c == '+'             ? 62
            : c == '/'             ? 63
                                   : -1;
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

// Whether `url` starts with `scheme` (lower case, with its colon), in any case.
bool has_scheme(const std::string& url, std::string_view scheme) {
  if (url.size() < scheme.size()) return false;
  for (size_t i = 0; i < scheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(url[i])) != scheme[i]) return false;
  }
  return true;
}

ApiError image_too_large(const std::string& where, const std::string& message) {
  ApiError e = bad(where, message);
  e.http_status = 413;
  e.code = "request_too_large";
  return e;
}

// An image_url part: a data: URL with base64 image bytes, or a file:// URL of a file under the
// directory the server reads images from (--allowed-local-media-path). The server fetches no
// URL over the network.
bool read_image_part(const json& part, const std::string& where, const ParseContext& context,
                     ParsedRequest* out, ApiError* error) {
  auto image = part.find("image_url");
  const json* url = nullptr;
  if (image != part.end() && image->is_string()) url = &*image;
  if (image != part.end() && image->is_object() && image->contains("url") &&
      (*image)["url"].is_string()) {
    url = &(*image)["url"];
  }
  if (url == nullptr) {
    *error = bad(where, where + " needs image_url.url, a string");
    return false;
  }
  const std::string& text = url->get_ref<const std::string&>();
  out->n_image_url_bytes += static_cast<int64_t>(text.size());
  if (has_scheme(text, "file:")) {
    if (!context.local_media) {
      *error = bad(where, where +
                              ".image_url.url is a file:// URL, but this server reads no local "
                              "files: start it with --allowed-local-media-path DIR to take images "
                              "from under DIR, or send the image as a data: URL");
      return false;
    }
    auto read = read_local_media(text, *context.local_media, context.max_image_bytes);
    if (!read) {
      const std::string message = where + ".image_url.url: " + read.status().message();
      *error = read.status().code() == StatusCode::kResourceExhausted
                   ? image_too_large(where, message)
                   : bad(where, message);
      return false;
    }
    out->images.push_back(std::move(read).value());
    return true;
  }
  const size_t comma = text.find(',');
  if (!has_scheme(text, "data:") || comma == std::string::npos ||
      text.substr(0, comma).find(";base64") == std::string::npos) {
    *error = bad(where, where +
                            ".image_url.url must be a data: URL with base64 image bytes "
                            "(data:image/png;base64,...) or a file:// URL under the server's "
                            "--allowed-local-media-path; the server fetches no URL");
    return false;
  }
  auto decoded = base64_decode(std::string_view(text).substr(comma + 1));
  if (!decoded || decoded->empty()) {
    *error = bad(where, where + ".image_url.url does not hold valid base64 data");
    return false;
  }
  if (static_cast<int64_t>(decoded->size()) > context.max_image_bytes) {
    *error = image_too_large(where, fmt::format("{}.image_url.url holds an image of {} bytes, over "
                                                "the limit of {} bytes (--max-image-bytes)",
                                                where, decoded->size(), context.max_image_bytes));
    return false;
  }
  out->images.push_back(std::move(decoded).value());
  return true;
}

bool read_messages(const json& body, const ParseContext& context,
                   std::vector<proto::ChatMessage>* out, ParsedRequest* parsed, ApiError* error) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    *error = bad("messages", "'messages' must be a non-empty array");
    return false;
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) {
      *error = bad(where, where + " must be an object");
      return false;
    }
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      *error = bad(where + ".role", where + ".role must be a string");
      return false;
    }
    proto::ChatMessage msg;
    msg.role = role->get<std::string>();
    if (msg.role == "developer") msg.role = "system";  // OpenAI's newer name for system
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant") {
      *error = bad(where + ".role",
                   fmt::format("{}.role '{}' is not system, developer, user or assistant "
                               "(tool messages are not supported)",
                               where, msg.role));
      return false;
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      *error = bad(where + ".content", where + ".content is required");
      return false;
    }
    if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      // An array of parts: text parts concatenated, each image part an "<image>" placeholder
      // (the image token of a LLaVA tokenizer) where it stands, its bytes sent with the request;
      // the parts also go as they are, for chat templates that read typed parts.
      for (const auto& part : *content) {
        auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string()) {
          *error = bad(where + ".content", where + ".content parts must be objects with a type");
          return false;
        }
        if (*type == "image_url") {
          if (!read_image_part(part, where + ".content", context, parsed, error)) return false;
          msg.content += "<image>";
          msg.parts.push_back({"image", ""});
          continue;
        }
        if (*type != "text") {
          *error = bad(where + ".content",
                       fmt::format("{}.content part type '{}' is not supported (only 'text' and "
                                   "'image_url')",
                                   where, type->get<std::string>()));
          return false;
        }
        auto text = part.find("text");
        if (text == part.end() || !text->is_string()) {
          *error = bad(where + ".content", where + ".content text parts need a string 'text'");
          return false;
        }
        msg.content += text->get<std::string>();
        msg.parts.push_back({"text", text->get<std::string>()});
      }
    } else {
      *error = bad(where + ".content", where + ".content must be a string or an array of parts");
      return false;
    }
    out->push_back(std::move(msg));
  }
  return true;
}

// The prompts of a completions request: strings, or token-id lists.
struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

bool read_prompts(const json& body, std::vector<Prompt>* out, ApiError* error) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) {
    *error = bad("prompt", "'prompt' is required");
    return false;
  }
  const json& p = *it;
  if (p.is_string()) {
    out->push_back({p.get<std::string>(), {}, false});
    return true;
  }
  if (!p.is_array() || p.empty()) {
    *error = bad("prompt", "'prompt' must be a string, an array of strings or token ids");
    return false;
  }
  if (p[0].is_number()) {
    Prompt one;
    one.is_ids = true;
    if (!read_ids(p, "prompt", &one.ids, error)) return false;
    out->push_back(std::move(one));
    return true;
  }
  for (const auto& item : p) {
    if (item.is_string()) {
      out->push_back({item.get<std::string>(), {}, false});
    } else if (item.is_array() && !item.empty()) {
      Prompt one;
      one.is_ids = true;
      if (!read_ids(item, "prompt", &one.ids, error)) return false;
      out->push_back(std::move(one));
    } else {
      *error = bad("prompt", "'prompt' items must be strings or non-empty token-id arrays");
      return false;
    }
  }
  return true;
}

}  // namespace

std::string error_body(const ApiError& e) {
  ojson err = {{"message", e.message},
               {"type", e.type},
               {"param", e.param.empty() ? ojson(nullptr) : ojson(e.param)},
               {"code", e.code.empty() ? ojson(nullptr) : ojson(e.code)}};
  return dump(ojson{{"error", err}});
}

bool parse_request(const std::string& text, bool chat, const ParseContext& context,
                   ParsedRequest* out, ApiError* error) {
  // Without exceptions: a syntax error or a string that is not UTF-8 gives a discarded value.
  const json body = json::parse(text, nullptr, false);
  if (body.is_discarded()) {
    *error = bad("", "the request body is not valid JSON (or not valid UTF-8)");
    return false;
  }
  if (!body.is_object()) {
    *error = bad("", "the request body must be a JSON object");
    return false;
  }
  // OpenAI fields this server does not implement: refused, never silently ignored.
  static const char* const kUnsupported[] = {
      "tools",      "tool_choice",         "functions",   "function_call", "response_format",
      "logit_bias", "parallel_tool_calls", "audio",       "modalities",    "prediction",
      "suffix",     "web_search_options",  "guided_json", "guided_regex",  "guided_choice"};
  for (const char* name : kUnsupported) {
    auto it = body.find(name);
    if (it != body.end() && asks_for(*it)) {
      *error = bad(name, fmt::format("'{}' is not supported by this server", name));
      return false;
    }
  }
  if (auto it = body.find("best_of"); it != body.end() && !it->is_null() && *it != 1) {
    *error = bad("best_of", "'best_of' other than 1 is not supported by this server");
    return false;
  }
  auto model = body.find("model");
  if (model == body.end() || !model->is_string()) {
    *error = bad("model", "'model' must be a string naming the served model");
    return false;
  }
  out->model = model->get<std::string>();
  if (out->model != context.served_model_name) {
    ApiError e;
    e.http_status = 404;
    e.param = "model";
    e.code = "model_not_found";
    e.message = fmt::format("The model '{}' does not exist; this server serves '{}'", out->model,
                            context.served_model_name);
    *error = e;
    return false;
  }
  out->chat = chat;
  if (!read_bool(body, "stream", &out->stream, error)) return false;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) {
      *error = bad("stream_options", "'stream_options' must be an object");
      return false;
    }
    if (!read_bool(*it, "include_usage", &out->include_usage, error)) {
      error->param = "stream_options.include_usage";
      return false;
    }
  }

  proto::GenerateRequest base;
  double d = 0.0;
  d = 1.0;  // OpenAI's default temperature is 1
  if (!read_number(body, "temperature", 0.0, 2.0, &d, error)) return false;
  base.sampling.temperature = static_cast<float>(d);
  d = 1.0;
  if (!read_number(body, "top_p", 0.0, 1.0, &d, error)) return false;
  if (d <= 0.0) {
    *error = bad("top_p", "'top_p' must be in (0, 1]");
    return false;
  }
  base.sampling.top_p = static_cast<float>(d);
  d = 0.0;
  if (!read_number(body, "min_p", 0.0, 1.0, &d, error)) return false;
  base.sampling.min_p = static_cast<float>(d);
  d = 0.0;
  if (!read_number(body, "presence_penalty", -2.0, 2.0, &d, error)) return false;
  base.sampling.presence_penalty = static_cast<float>(d);
  d = 0.0;
  if (!read_number(body, "frequency_penalty", -2.0, 2.0, &d, error)) return false;
  base.sampling.frequency_penalty = static_cast<float>(d);
  d = 1.0;
  if (!read_number(body, "repetition_penalty", 1e-3, 100.0, &d, error)) return false;
  base.sampling.repetition_penalty = static_cast<float>(d);
  int64_t top_k = 0;
  if (!read_int(body, "top_k", -1, 1 << 20, &top_k, error)) return false;
  base.sampling.top_k = top_k < 0 ? 0 : static_cast<int32_t>(top_k);  // -1: off, as vLLM
  int64_t n = 1;
  if (!read_int(body, "n", 1, context.max_n, &n, error)) return false;
  out->n = static_cast<int32_t>(n);

  // max_tokens: 16 for completions as OpenAI's; chat: the rest of the context. The newer name
  // max_completion_tokens wins when both are given.
  int64_t max_tokens = chat ? proto::kMaxTokensRestOfContext : 16;
  if (!read_int(body, "max_tokens", 1, 1 << 24, &max_tokens, error)) return false;
  if (!read_int(body, "max_completion_tokens", 1, 1 << 24, &max_tokens, error)) return false;
  base.max_tokens = static_cast<int32_t>(max_tokens);

  bool have_seed = false;
  uint64_t seed = 0;
  if (auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      *error = bad("seed", "'seed' must be an integer");
      return false;
    }
    have_seed = true;
    seed =
        it->is_number_unsigned() ? it->get<uint64_t>() : static_cast<uint64_t>(it->get<int64_t>());
  }
  if (auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      base.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) {
          *error = bad("stop", "'stop' must be a string or an array of strings");
          return false;
        }
        base.stop.push_back(s.get<std::string>());
      }
    } else {
      *error = bad("stop", "'stop' must be a string or an array of strings");
      return false;
    }
    for (const auto& s : base.stop) {
      if (s.empty()) {
        *error = bad("stop", "'stop' strings must not be empty");
        return false;
      }
    }
  }
  if (auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array() || !read_ids(*it, "stop_token_ids", &base.stop_token_ids, error)) {
      if (error->message.empty()) *error = bad("stop_token_ids", "'stop_token_ids' must be ids");
      return false;
    }
  }
  if (!read_bool(body, "ignore_eos", &base.ignore_eos, error)) return false;
  if (!read_bool(body, "skip_special_tokens", &base.skip_special_tokens, error)) return false;
  if (auto it = body.find("user"); it != body.end() && !it->is_null() && !it->is_string()) {
    *error = bad("user", "'user' must be a string");
    return false;
  }
  bool echo = false;
  if (!chat && !read_bool(body, "echo", &echo, error)) return false;
  if (!chat) {
    // Not a completions field: refused as an unknown OpenAI field would be.
    if (auto it = body.find("top_logprobs"); it != body.end() && asks_for(*it)) {
      *error = bad("top_logprobs", "'top_logprobs' is a chat field; completions take 'logprobs'");
      return false;
    }
  }
  if (!read_logprobs(body, chat, &base, error)) return false;
  out->logprobs = base.logprobs;

  std::vector<Prompt> prompts;
  if (chat) {
    if (!read_messages(body, context, &base.messages, out, error)) return false;
    prompts.emplace_back();
  } else {
    if (!read_prompts(body, &prompts, error)) return false;
  }
  std::random_device random;
  for (size_t p = 0; p < prompts.size(); ++p) {
    if (echo && prompts[p].is_ids) {
      *error = bad("echo", "'echo' with a token-id prompt is not supported (use a text prompt)");
      return false;
    }
    for (int32_t i = 0; i < out->n; ++i) {
      proto::GenerateRequest g = base;
      if (!chat) {
        if (prompts[p].is_ids) {
          g.prompt_ids = prompts[p].ids;
        } else {
          g.prompt = prompts[p].text;
          if (g.prompt.empty()) {
            *error = bad("prompt", "'prompt' must not be empty");
            return false;
          }
        }
      }
      // Choice i samples with seed + i; without a seed every choice draws its own.
      g.sampling.seed = have_seed ? seed + static_cast<uint64_t>(i)
                                  : (uint64_t{random()} << 32) ^ uint64_t { random() };
      out->generate.push_back(std::move(g));
      out->echo_prefix.push_back(echo ? prompts[p].text : std::string());
      out->prompt_index.push_back(static_cast<int32_t>(p));
    }
  }
  return true;
}

ApiError map_scheduler_error(const std::string& code, const std::string& message, bool chat) {
  ApiError e;
  e.message = message;
  if (code == "invalid argument") {
    e.http_status = 400;
    // The batcher's words: "prompt (A tokens) + max_tokens (B) = C exceeds the model's context
    // of D tokens by E" (or "... exceeds the KV pool of D slots by E").
    static const std::regex kFit(
        R"(prompt \((\d+) tokens\) \+ max_tokens \((\d+)\) = (\d+) exceeds the (model's context of|KV pool of) (\d+))");
    std::smatch m;
    if (std::regex_search(message, m, kFit)) {
      e.code = "context_length_exceeded";
      e.param = chat ? "messages" : "prompt";
      e.message = fmt::format(
          "This model's maximum context length is {} tokens. However, you requested {} tokens "
          "({} in the {}, {} in the completion). Please reduce the length of the {} or the "
          "completion.",
          m[5].str(), m[3].str(), m[1].str(), chat ? "messages" : "prompt", m[2].str(),
          chat ? "messages" : "prompt");
      if (m[4].str() != "model's context of") e.message += " (limited by the KV cache size)";
    } else if (message.find("chat template") != std::string::npos) {
      e.param = "messages";
    }
  } else if (code == "resource exhausted") {
    e.http_status = 429;
    e.type = "rate_limit_exceeded";
  } else if (code == "unavailable") {
    e.http_status = 503;
    e.type = "service_unavailable";
  } else {
    e.http_status = 500;
    e.type = "server_error";
  }
  return e;
}

nlohmann::ordered_json usage_json(const std::vector<ChoiceResult>& choices,
                                  const std::vector<int32_t>& prompt_index) {
  int64_t prompt = 0, completion = 0, cached = 0;
  int32_t last_prompt = -1;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (prompt_index[i] != last_prompt) {
      prompt += choices[i].n_prompt_tokens;
      cached += choices[i].n_cached_tokens;
    }
    last_prompt = prompt_index[i];
    completion += choices[i].n_generated_tokens;
  }
  return ojson{{"prompt_tokens", prompt},
               {"completion_tokens", completion},
               {"total_tokens", prompt + completion},
               {"prompt_tokens_details", ojson{{"cached_tokens", cached}}}};
}

std::string completion_body(const ParsedRequest& request, const std::string& id, int64_t created,
                            const std::vector<ChoiceResult>& choices) {
  ojson out_choices = ojson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    ojson c;
    c["index"] = i;
    if (request.chat) {
      c["message"] = {{"role", "assistant"}, {"content", choices[i].text}};
    } else {
      c["text"] = request.echo_prefix[i] + choices[i].text;
    }
    if (!request.logprobs) {
      c["logprobs"] = nullptr;
    } else if (request.chat) {
      c["logprobs"] = chat_logprobs_json(choices[i].logprobs);
    } else {
      c["logprobs"] = completion_logprobs_json(choices[i].logprobs, request.echo_prefix[i].size());
    }
    c["finish_reason"] = choices[i].finish_reason;
    out_choices.push_back(std::move(c));
  }
  ojson body = {{"id", id},
                {"object", request.chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", request.model},
                {"choices", std::move(out_choices)},
                {"usage", usage_json(choices, request.prompt_index)}};
  return dump(body);
}

std::string stream_chunk(const ParsedRequest& request, const std::string& id, int64_t created,
                         int32_t index, const std::string* delta_text, bool role,
                         const std::string& finish_reason,
                         const std::vector<TokenLogprob>* logprobs, size_t text_offset) {
  ojson c;
  c["index"] = index;
  if (request.chat) {
    ojson delta = ojson::object();
    if (role) delta["role"] = "assistant";
    if (delta_text) delta["content"] = *delta_text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = delta_text ? *delta_text : std::string();
  }
  if (request.logprobs && logprobs != nullptr) {
    c["logprobs"] = request.chat ? chat_logprobs_json(*logprobs)
                                 : completion_logprobs_json(*logprobs, text_offset);
  } else {
    c["logprobs"] = nullptr;
  }
  c["finish_reason"] = finish_reason.empty() ? ojson(nullptr) : ojson(finish_reason);
  ojson body = {{"id", id},
                {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", request.model},
                {"choices", ojson::array({std::move(c)})}};
  if (request.include_usage) body["usage"] = nullptr;
  return "data: " + dump(body) + "\n\n";
}

std::string stream_usage_chunk(const ParsedRequest& request, const std::string& id, int64_t created,
                               const nlohmann::ordered_json& usage) {
  ojson body = {{"id", id},
                {"object", request.chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", request.model},
                {"choices", ojson::array()},
                {"usage", usage}};
  return "data: " + dump(body) + "\n\n";
}

std::string stream_error(const ApiError& e) {
  return "data: " + error_body(e) + "\n\n";
}

std::string models_body(const std::string& served_model_name, int64_t created,
                        int64_t max_model_len) {
  ojson model = {{"id", served_model_name},
                 {"object", "model"},
                 {"created", created},
                 {"owned_by", "litellama"}};
  if (max_model_len > 0) model["max_model_len"] = max_model_len;
  return dump(ojson{{"object", "list"}, {"data", ojson::array({model})}});
}

}  // namespace litellama::api
