// litellama tokenize / detokenize: the tokenizer library from the command line, with the ids and
// texts transformers' AutoTokenizer gives (encode, decode, apply_chat_template).
#include <climits>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "cli/commands.h"
#ifdef LITELLAMA_WITH_TOKENIZER
#include "services/tokenizer/tokenizer.h"
#include "services/tokenizer/utf8.h"
#endif

namespace litellama::cli {

namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::string text;
  std::string messages_json;
  bool add_generation_prompt = false;
  bool add_special_tokens = false;
  bool json = false;
};

struct DetokenizeArgs {
  std::string tokenizer;
  std::string ids;
  bool skip_special_tokens = false;
  bool json = false;
};

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  std::cin >> std::noskipws;
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

#ifdef LITELLAMA_WITH_TOKENIZER

Result<Tokenizer> load_tokenizer(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return make_error(StatusCode::kNotFound, "--tokenizer '{}' is not a directory", dir);
  }
  return Tokenizer::load(dir);
}

// The first byte offset of `s` that is not well-formed UTF-8, or npos.
size_t first_invalid_utf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const utf8::Sequence seq = utf8::next(s.substr(pos));
    if (!seq.valid) return pos;
    pos += static_cast<size_t>(seq.length);
  }
  return std::string::npos;
}

Result<std::vector<Tokenizer::ChatMessage>> parse_messages(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Status(StatusCode::kInvalidArgument, "--messages-json is not valid JSON");
  }
  if (!j.is_array()) {
    return Status(StatusCode::kInvalidArgument,
                  "--messages-json must be a JSON array of {\"role\": ..., \"content\": ...}");
  }
  std::vector<Tokenizer::ChatMessage> messages;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& m = j[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return make_error(StatusCode::kInvalidArgument,
                        "--messages-json: message {} is not an object with string \"role\" and "
                        "\"content\"",
                        i);
    }
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return messages;
}

// Ids separated by commas and/or white space, or a JSON array, or tokenize's JSON output
// ({"ids": [...]}).
Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return Status(StatusCode::kInvalidArgument, "--ids holds no ids");
  if (text[first] == '[' || text[first] == '{') {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("ids")) j = j["ids"];
    if (!j.is_array()) {
      return Status(StatusCode::kInvalidArgument,
                    "--ids is neither a list of ids nor a JSON array of ids");
    }
    std::vector<int32_t> ids;
    for (const auto& v : j) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
        return make_error(StatusCode::kInvalidArgument, "{} is not a token id", dump(v));
      }
      ids.push_back(v.get<int32_t>());
    }
    return ids;
  }
  std::string list;
  bool pending_separator = false;
  for (size_t i = first; i < text.size(); ++i) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
      pending_separator = !list.empty() && list.back() != ',';
      continue;
    }
    if (pending_separator && c != ',') list += ',';
    pending_separator = false;
    list += c;
  }
  return parse_id_list(list);
}

int run_tokenize(const TokenizeArgs& a, bool text_given, bool messages_given) {
  const char* cmd = "tokenize";
  if (text_given == messages_given) {
    return fail(cmd, Status(StatusCode::kInvalidArgument,
                            "give exactly one of --text and --messages-json"));
  }
  if (a.add_generation_prompt && !messages_given) {
    return fail(
        cmd, Status(StatusCode::kInvalidArgument, "--add-generation-prompt needs --messages-json"));
  }
  // The input is checked before the tokenizer is loaded (loading takes a while).
  std::string input = text_given ? a.text : a.messages_json;
  if (input == "-") input = read_stdin();
  if (const size_t bad = first_invalid_utf8(input); bad != std::string::npos) {
    return fail(
        cmd, make_error(StatusCode::kInvalidArgument, "the {} is not valid UTF-8 (byte offset {})",
                        text_given ? "text" : "messages JSON", bad));
  }
  std::vector<Tokenizer::ChatMessage> messages;
  if (messages_given) {
    auto parsed = parse_messages(input);
    if (!parsed.is_ok()) return fail(cmd, parsed.status());
    messages = std::move(parsed).value();
  }
  auto tok = load_tokenizer(a.tokenizer);
  if (!tok.is_ok()) return fail(cmd, tok.status());
  std::string text = input;
  if (messages_given) {
    auto rendered = tok->apply_chat_template(messages, a.add_generation_prompt);
    if (!rendered.is_ok()) return fail(cmd, rendered.status());
    text = std::move(rendered).value();
  }
  const std::vector<int32_t> ids = tok->encode(text, a.add_special_tokens);
  if (a.json) {
    nlohmann::json j;
    j["ids"] = ids;
    if (messages_given) j["text"] = text;
    std::printf("%s\n", dump(j).c_str());
    return 0;
  }
  if (messages_given) std::printf("%s\n", text.c_str());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::printf("%6zu %8d  %s%s\n", i, ids[i], dump(std::string(tok->id_to_token(ids[i]))).c_str(),
                tok->is_special(ids[i]) ? "  (special)" : "");
  }
  std::printf("%zu tokens\n", ids.size());
  return 0;
}

int run_detokenize(const DetokenizeArgs& a) {
  const char* cmd = "detokenize";
  const std::string input = a.ids == "-" ? read_stdin() : a.ids;
  auto ids = parse_ids(input);
  if (!ids.is_ok()) return fail(cmd, ids.status());
  auto tok = load_tokenizer(a.tokenizer);
  if (!tok.is_ok()) return fail(cmd, tok.status());
  for (const int32_t id : *ids) {
    if (tok->token_for_decode(id, /*skip_special_tokens=*/false) == nullptr) {
      return fail(cmd, make_error(StatusCode::kInvalidArgument,
                                  "token id {} is not in the vocabulary (ids 0..{})", id,
                                  tok->vocab_size() - 1));
    }
  }
  const std::string text = tok->decode(*ids, a.skip_special_tokens);
  if (a.json) {
    std::printf("%s\n", dump(nlohmann::json{{"text", text}}).c_str());
  } else {
    std::printf("%s\n", text.c_str());
  }
  return 0;
}

#else

int run_tokenize(const TokenizeArgs&, bool, bool) {
  return fail("tokenize", Status(StatusCode::kUnsupported, "this build has no tokenizer"));
}
int run_detokenize(const DetokenizeArgs&) {
  return fail("detokenize", Status(StatusCode::kUnsupported, "this build has no tokenizer"));
}

#endif

}  // namespace

CommandMain register_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "tokenize",
      "Encode text (or a chat rendered with the tokenizer's template) into token ids, as "
      "transformers' AutoTokenizer does. Special tokens (BOS/EOS) are added only with "
      "--add-special-tokens; text that spells a special token always becomes that token. Input "
      "must be valid UTF-8.");
  sub->add_option("--tokenizer", args->tokenizer,
                  "tokenizer or model directory (holding tokenizer.json)")
      ->required();
  CLI::Option* text = sub->add_option("--text", args->text, "the text; '-' reads it from stdin");
  CLI::Option* messages = sub->add_option(
      "--messages-json", args->messages_json,
      "a chat as a JSON array of {\"role\", \"content\"} objects, rendered with the tokenizer's "
      "chat template; '-' reads it from stdin");
  sub->add_flag("--add-generation-prompt", args->add_generation_prompt,
                "with --messages-json: end the rendered chat with the assistant turn's header");
  sub->add_flag("--add-special-tokens", args->add_special_tokens,
                "add the tokenizer's BOS/EOS (its post-processor); off by default, as "
                "apply_chat_template(tokenize=True) does for chats (their template writes BOS)");
  sub->add_flag("--json", args->json,
                "print one JSON object: {\"ids\": [...]}, plus \"text\" (the rendered chat) with "
                "--messages-json");
  return [args, text, messages]() {
    return run_tokenize(*args, text->count() > 0, messages->count() > 0);
  };
}

CommandMain register_detokenize_command(CLI::App& app) {
  auto args = std::make_shared<DetokenizeArgs>();
  CLI::App* sub = app.add_subcommand("detokenize",
                                     "Decode token ids into text, as transformers' decode() does");
  sub->add_option("--tokenizer", args->tokenizer,
                  "tokenizer or model directory (holding tokenizer.json)")
      ->required();
  sub->add_option("--ids", args->ids,
                  "token ids separated by commas or spaces, or a JSON array (also tokenize's "
                  "--json output); '-' reads them from stdin")
      ->required();
  sub->add_flag("--skip-special-tokens", args->skip_special_tokens,
                "drop special tokens (BOS, EOS, <|eot_id|>, ...) from the text; off by default, "
                "as in decode(skip_special_tokens=False)");
  sub->add_flag("--json", args->json, "print one JSON object: {\"text\": \"...\"}");
  return [args]() { return run_detokenize(*args); };
}

}  // namespace litellama::cli
