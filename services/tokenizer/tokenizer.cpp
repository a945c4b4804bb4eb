#include "services/tokenizer/tokenizer.h"

#include "services/tokenizer/byte_level.h"

#include <cctype>

#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "services/tokenizer/json_token_id.h"
#include "services/tokenizer/utf8.h"

namespace litellama {
namespace {

Result<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "cannot open '{}'", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(StatusCode::kDataLoss, "cannot read '{}'", path.string());
  return ss.str();
}

Result<nlohmann::json> read_json(const std::filesystem::path& path) {
  LITELLAMA_ASSIGN_OR_RETURN(const std::string text, read_file(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return make_error(StatusCode::kInvalidArgument, "'{}' is not valid JSON", path.string());
  }
  if (!j.is_object()) {
    return make_error(StatusCode::kInvalidArgument, "'{}' does not hold a JSON object",
                      path.string());
  }
  return j;
}

// A special token entry of tokenizer_config.json: "<s>", {"content": "<s>", ...} or null.
std::optional<std::string> token_content(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const auto& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

// An added token's id from tokenizer.json ("id") or tokenizer_config.json (a decimal key).
Result<int32_t> added_token_id(const nlohmann::json& id) {
  return json_token_id(id, "added token");
}

AddedToken added_token_from_json(const nlohmann::json& t, int32_t id) {
  AddedToken a;
  a.id = id;
  a.content = t.at("content").get<std::string>();
  a.special = t.value("special", false);
  a.lstrip = t.value("lstrip", false);
  a.rstrip = t.value("rstrip", false);
  a.single_word = t.value("single_word", false);
  a.normalized = t.value("normalized", !a.special);
  return a;
}

}  // namespace

Tokenizer::Tokenizer(BpeModel model, Normalizer normalizer, PreTokenizer pre_tokenizer,
                     Decoder decoder, PostProcessor post_processor)
    : model_(std::move(model)),
      normalizer_(std::move(normalizer)),
      pre_tokenizer_(std::move(pre_tokenizer)),
      decoder_(std::move(decoder)),
      post_processor_(std::move(post_processor)) {}

Result<Tokenizer> Tokenizer::load(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path root(dir);
  const fs::path tokenizer_path = root / "tokenizer.json";
  std::error_code ec;
  if (!fs::is_regular_file(tokenizer_path, ec)) {
    return make_error(StatusCode::kNotFound, "no tokenizer.json in '{}'", dir);
  }
  LITELLAMA_ASSIGN_OR_RETURN(const nlohmann::json tj, read_json(tokenizer_path));
  nlohmann::json config = nlohmann::json::object();
  const fs::path config_path = root / "tokenizer_config.json";
  if (fs::exists(config_path, ec)) {
    LITELLAMA_ASSIGN_OR_RETURN(config, read_json(config_path));
  }

  try {
    if (!tj.contains("model") || !tj["model"].is_object()) {
      return make_error(StatusCode::kInvalidArgument, "'{}' has no \"model\" object",
                        tokenizer_path.string());
    }
    const auto& model_json = tj["model"];
    const std::string model_type =
        model_json.value("type", model_json.contains("merges") ? "BPE" : "");
    if (model_type != "BPE") {
      return make_error(StatusCode::kUnsupported,
                        "unsupported tokenizer model type '{}' in '{}' (only BPE is supported)",
                        model_type, tokenizer_path.string());
    }
    LITELLAMA_ASSIGN_OR_RETURN(BpeModel model, BpeModel::from_json(model_json));
    const nlohmann::json null_json;
    auto field = [&](const char* key) -> const nlohmann::json& {
      return tj.contains(key) ? tj[key] : null_json;
    };
    LITELLAMA_ASSIGN_OR_RETURN(Normalizer normalizer, Normalizer::from_json(field("normalizer")));
    LITELLAMA_ASSIGN_OR_RETURN(PreTokenizer pre_tokenizer,
                               PreTokenizer::from_json(field("pre_tokenizer")));
    nlohmann::json decoder_json = field("decoder");
    const std::string tokenizer_class = config.value("tokenizer_class", "");
    if ((tokenizer_class == "LlamaTokenizer" || tokenizer_class == "LlamaTokenizerFast") &&
        model.byte_fallback()) {
      // transformers (v5) builds LlamaTokenizer's pipeline itself and only takes vocab and
      // merges from tokenizer.json: no normalizer, a Metaspace pre-tokenizer (prepend "always"
      // for legacy tokenizers, "first" otherwise) and a Replace/ByteFallback/Fuse[/Strip] decoder.
      const bool add_prefix_space = config.value("add_prefix_space", true);
      const bool legacy = config.value("legacy", false);
      LITELLAMA_ASSIGN_OR_RETURN(normalizer, Normalizer::from_json(nlohmann::json()));
      pre_tokenizer = PreTokenizer::metaspace(
          "\u2581", add_prefix_space ? (legacy ? "always" : "first") : "never", false);
      decoder_json = nlohmann::json::parse(R"({"type": "Sequence", "decoders": [
          {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
          {"type": "ByteFallback"}, {"type": "Fuse"}]})");
      if (add_prefix_space) {
        decoder_json["decoders"].push_back(
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
      }
    }
    LITELLAMA_ASSIGN_OR_RETURN(Decoder decoder, Decoder::from_json(decoder_json));
    LITELLAMA_ASSIGN_OR_RETURN(PostProcessor post_processor,
                               PostProcessor::from_json(field("post_processor")));

    // Byte-level pipelines (GPT-2, Llama 3, Qwen) hand raw pre-tokenized bytes to the model.
    const bool raw_bytes = pre_tokenizer.byte_level_split() != nullptr && model.enable_raw_bytes();
    Tokenizer tok(std::move(model), std::move(normalizer), std::move(pre_tokenizer),
                  std::move(decoder), std::move(post_processor));
    tok.raw_bytes_ = raw_bytes;

    // Added tokens: tokenizer.json first, then any that only tokenizer_config.json declares.
    if (tj.contains("added_tokens")) {
      for (const auto& t : tj["added_tokens"]) {
        LITELLAMA_ASSIGN_OR_RETURN(const int32_t id, added_token_id(t.at("id")));
        tok.added_.add(added_token_from_json(t, id));
      }
    }
    if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
      for (auto it = config["added_tokens_decoder"].begin();
           it != config["added_tokens_decoder"].end(); ++it) {
        int64_t key = -1;
        const auto parsed =
            std::from_chars(it.key().data(), it.key().data() + it.key().size(), key);
        if (parsed.ec != std::errc() || parsed.ptr != it.key().data() + it.key().size()) key = -1;
        LITELLAMA_ASSIGN_OR_RETURN(const int32_t id, added_token_id(nlohmann::json(key)));
        if (tok.added_.find(id) == nullptr) tok.added_.add(added_token_from_json(*it, id));
      }
    }
    tok.added_.build();
    tok.vocab_size_ = tok.model_.size();
    for (const AddedToken& t : tok.added_.tokens()) {
      tok.vocab_size_ = std::max(tok.vocab_size_, t.id + 1);
    }
    // The post-processor's ids must be tokens: encode() never returns an id outside the vocabulary.
    for (const auto* ids : {&tok.post_processor_.prefix(), &tok.post_processor_.suffix()}) {
      for (int32_t id : *ids) {
        if (id < 0 || id >= tok.vocab_size_) {
          return make_error(StatusCode::kInvalidArgument,
                            "'{}': the post_processor adds id {}, outside the vocabulary of {}",
                            tokenizer_path.string(), id, tok.vocab_size_);
        }
      }
    }

    // Special tokens as the chat template sees them (only those that are set).
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
      if (auto content = token_content(config, key)) tok.special_tokens_map_[key] = *content;
    }
    if (config.contains("additional_special_tokens") &&
        config["additional_special_tokens"].is_array()) {
      nlohmann::ordered_json extra = nlohmann::ordered_json::array();
      for (const auto& t : config["additional_special_tokens"]) {
        if (t.is_string()) extra.push_back(t.get<std::string>());
        if (t.is_object() && t.contains("content"))
          extra.push_back(t["content"].get<std::string>());
      }
      tok.special_tokens_map_["additional_special_tokens"] = extra;
    }
    if (auto bos = token_content(config, "bos_token")) tok.bos_token_id_ = tok.token_to_id(*bos);
    if (auto eos = token_content(config, "eos_token")) {
      if (auto id = tok.token_to_id(*eos)) tok.eos_token_ids_.push_back(*id);
    }
    for (const char* end :
         {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>", "</s>"}) {
      const auto id = tok.added_.find(std::string_view(end));
      if (id && tok.is_special(*id) &&
          std::find(tok.eos_token_ids_.begin(), tok.eos_token_ids_.end(), *id) ==
              tok.eos_token_ids_.end()) {
        tok.eos_token_ids_.push_back(*id);
      }
    }

    // Chat template: tokenizer_config.json (a string, or a list of named templates), else
    // chat_template.jinja, else the processor's chat_template.json (where llava-hf checkpoints
    // keep theirs). It is parsed here; a parse failure is reported when it is used.
    if (config.contains("chat_template")) {
      const auto& ct = config["chat_template"];
      if (ct.is_string()) {
        tok.chat_template_source_ = ct.get<std::string>();
      } else if (ct.is_array()) {
        for (const auto& named : ct) {
          if (named.value("name", "") == "default" || tok.chat_template_source_.empty()) {
            tok.chat_template_source_ = named.value("template", "");
          }
        }
      }
    }
    if (tok.chat_template_source_.empty() && fs::exists(root / "chat_template.jinja", ec)) {
      LITELLAMA_ASSIGN_OR_RETURN(tok.chat_template_source_,
                                 read_file(root / "chat_template.jinja"));
    }
    if (tok.chat_template_source_.empty() && fs::exists(root / "chat_template.json", ec)) {
      LITELLAMA_ASSIGN_OR_RETURN(const std::string text, read_file(root / "chat_template.json"));
      const nlohmann::json processor = nlohmann::json::parse(text, nullptr, false);
      if (!processor.is_object() || !processor.contains("chat_template") ||
          !processor["chat_template"].is_string()) {
        return make_error(StatusCode::kInvalidArgument,
                          "'{}': chat_template.json has no string \"chat_template\"", dir);
      }
      tok.chat_template_source_ = processor["chat_template"].get<std::string>();
    }
    if (!tok.chat_template_source_.empty()) {
      tok.chat_template_ = std::make_shared<const Result<ChatTemplate>>(
          ChatTemplate::parse(tok.chat_template_source_));
    }
    return tok;
  } catch (const nlohmann::json::exception& e) {
    return make_error(StatusCode::kInvalidArgument, "malformed tokenizer files in '{}': {}", dir,
                      e.what());
  }
}

void Tokenizer::encode_byte_level(std::string_view text, std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  std::string prefixed;
  if (pre_tokenizer_.byte_level_prefix_space() && text[0] != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed += ' ';
    prefixed += text;
    text = prefixed;
  }
  // Isolated split: the matches and the text between them (none for the hand-written
  // matchers, whose matches tile the text) are the words.
  size_t prev = 0;
  pre_tokenizer_.byte_level_split()->for_each(text, [&](size_t b, size_t e) {
    if (b > prev) model_.tokenize_bytes(text.substr(prev, b - prev), ids);
    model_.tokenize_bytes(text.substr(b, e - b), ids);
    prev = e;
  });
  if (prev < text.size()) model_.tokenize_bytes(text.substr(prev), ids);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::string sanitized;
  if (!utf8::is_valid(text)) {
    sanitized = utf8::lossy(text);
    text = sanitized;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  // Scratch buffers reused by every call on this thread (encode allocates only its result).
  thread_local std::vector<AddedVocabulary::Segment> segments, inner;
  thread_local std::vector<std::string> words;
  thread_local std::string piece;
  segments.clear();
  added_.split(text, /*normalized=*/false, segments);
  for (const auto& seg : segments) {
    if (seg.id) {
      ids.push_back(*seg.id);
      continue;
    }
    std::string_view normalized = seg.text;
    if (!normalizer_.is_identity()) {
      piece.assign(seg.text);
      normalizer_.normalize(piece);
      normalized = piece;
    }
    inner.clear();
    if (added_.has_normalized()) {
      added_.split(normalized, /*normalized=*/true, inner);
    } else {
      inner.push_back({normalized, std::nullopt, 0});
    }
    for (const auto& sub : inner) {
      if (sub.id) {
        ids.push_back(*sub.id);
        continue;
      }
      if (raw_bytes_) {
        encode_byte_level(sub.text, ids);
        continue;
      }
      words.clear();
      pre_tokenizer_.pre_tokenize(sub.text, seg.offset == 0 && sub.offset == 0, words);
      for (const std::string& w : words) model_.tokenize(w, ids);
    }
  }
  if (add_special_tokens) post_processor_.apply(ids);
  return ids;
}

const std::string* Tokenizer::token_for_decode(int32_t id, bool skip_special_tokens) const {
  if (const AddedToken* t = added_.find(id)) {
    if (skip_special_tokens && t->special) return nullptr;
    return &t->content;
  }
  return model_.id_to_token(id);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  Decoder::Stream stream(decoder_);
  for (const int32_t id : ids) {
    if (const std::string* token = token_for_decode(id, skip_special_tokens)) {
      stream.push(*token, out);
    }
  }
  stream.finish(out);
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.find(token)) return id;
  return model_.token_to_id(token);
}

std::string_view Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* t = added_.find(id)) return t->content;
  if (const std::string* s = model_.id_to_token(id)) return *s;
  return {};
}

std::string Tokenizer::token_bytes(int32_t id) const {
  const std::string* token = token_for_decode(id, false);
  if (token == nullptr) return {};
  const std::string& t = *token;
  if (added_.find(id) == nullptr) {
    std::string bytes;
    if (decoder_.byte_level() && ByteLevel::get().decode(t, bytes)) return bytes;
    if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>' &&
        std::isxdigit(static_cast<unsigned char>(t[3])) &&
        std::isxdigit(static_cast<unsigned char>(t[4]))) {
      return std::string(1, static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
    }
    // Metaspace: "\u2581" stands for a space; the decoder would strip a first token's leading
    // one, which a piece keeps.
    constexpr std::string_view kMetaspace = "\u2581";
    if (!decoder_.byte_level() && t.find(kMetaspace) != std::string::npos) {
      std::string out;
      for (size_t i = 0; i < t.size();) {
        if (t.compare(i, kMetaspace.size(), kMetaspace) == 0) {
          out += ' ';
          i += kMetaspace.size();
        } else {
          out += t[i++];
        }
      }
      return out;
    }
  }
  const int32_t one[] = {id};
  return decode(std::span<const int32_t>(one), false);
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* t = added_.find(id);
  return t != nullptr && t->special;
}

nlohmann::ordered_json Tokenizer::chat_context(const std::vector<ChatMessage>& messages,
                                               bool add_generation_prompt,
                                               bool content_parts) const {
  nlohmann::ordered_json context = special_tokens_map_;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) {
    if (!content_parts) {
      list.push_back({{"role", m.role}, {"content", m.content}});
      continue;
    }
    nlohmann::ordered_json parts = nlohmann::ordered_json::array();
    if (m.parts.empty()) parts.push_back({{"type", "text"}, {"text", m.content}});
    for (const ContentPart& p : m.parts) {
      if (p.type == "text") {
        parts.push_back({{"type", "text"}, {"text", p.text}});
      } else {
        parts.push_back({{"type", p.type}});
      }
    }
    list.push_back({{"role", m.role}, {"content", std::move(parts)}});
  }
  context["messages"] = std::move(list);
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  return context;
}

Result<std::string> Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt) const {
  if (!chat_template_) {
    return Status(StatusCode::kNotFound,
                  "the tokenizer has no chat template (none in tokenizer_config.json, "
                  "chat_template.jinja or chat_template.json)");
  }
  if (!chat_template_->is_ok()) return chat_template_->status();
  const ChatTemplate& t = chat_template_->value();
  return t.render(chat_context(messages, add_generation_prompt, t.reads_content_parts()));
}

Result<std::string> Tokenizer::apply_chat_template(const std::string& chat_template,
                                                   const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt) const {
  LITELLAMA_ASSIGN_OR_RETURN(ChatTemplate parsed, ChatTemplate::parse(chat_template));
  return parsed.render(chat_context(messages, add_generation_prompt, parsed.reads_content_parts()));
}

}  // namespace litellama
