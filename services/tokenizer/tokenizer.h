// Tokenizer: a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) that encodes and
// decodes exactly as transformers' AutoTokenizer does for the Llama 2, Llama 3/3.1 and
// Qwen2/Qwen3 families, and renders their chat templates.
//
// Encoding: added/special tokens are matched in the raw text first; the text between them is
// normalized, pre-tokenized and BPE-merged; the post-processor adds BOS/EOS when asked. Where
// transformers replaces the pipeline of tokenizer.json with its own, this class does the same
// (LlamaTokenizer with byte fallback: Metaspace pre-tokenizer instead of the legacy
// Prepend/Replace normalizer), so ids match AutoTokenizer, not only the tokenizers library.
//
// Input that is not valid UTF-8 is never an error: each maximal ill-formed subsequence is
// replaced by U+FFFD before encoding. All methods are const and safe to call from many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "services/tokenizer/added_vocabulary.h"
#include "services/tokenizer/bpe_model.h"
#include "services/tokenizer/chat_template.h"
#include "services/tokenizer/decoder.h"
#include "services/tokenizer/normalizer.h"
#include "services/tokenizer/post_processor.h"
#include "services/tokenizer/pre_tokenizer.h"

namespace litellama {

class Tokenizer {
 public:
  // `dir` holds tokenizer.json and, optionally, tokenizer_config.json (special tokens, chat
  // template, tokenizer class) and chat_template.jinja.
  static Result<Tokenizer> load(const std::string& dir);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // Ids outside the vocabulary are skipped.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One typed part of a message's content, as OpenAI's format has them: "text" (with its text)
  // or "image".
  struct ContentPart {
    std::string type;
    std::string text;
  };
  struct ChatMessage {
    std::string role;
    std::string content;             // the text, with "<image>" where each image part stands
    std::vector<ContentPart> parts;  // the same as parts; empty: a plain string
  };
  // Renders the tokenizer's chat template with the variables transformers passes (messages,
  // add_generation_prompt, tools=None, documents=None and the special tokens bos_token,
  // eos_token, ...). A template that reads typed content parts
  // (ChatTemplate::reads_content_parts, e.g. llava-hf's) gets every message's content as a list
  // of {"type": "text", "text": ...} and {"type": "image"} (a plain string as one text part,
  // where transformers would hand it the string and the template would render nothing); any
  // other template gets the content string. Fails with kNotFound when the tokenizer has no chat
  // template, kUnsupported for a template construct outside the supported subset, kInvalidArgument
  // when the template raises an exception (e.g. roles that do not alternate).
  Result<std::string> apply_chat_template(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt = true) const;
  // The same with another template (e.g. a model's template that its tokenizer_config lacks).
  Result<std::string> apply_chat_template(const std::string& chat_template,
                                          const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt) const;
  bool has_chat_template() const { return !chat_template_source_.empty(); }

  // Including added tokens.
  int32_t vocab_size() const { return vocab_size_; }
  std::optional<int32_t> bos_token_id() const { return bos_token_id_; }
  // tokenizer_config's eos_token first, then the end-of-turn/end-of-text tokens the model
  // families generate (<|eot_id|>, <|eom_id|>, <|end_of_text|>, <|im_end|>, <|endoftext|>,
  // </s>) when the vocabulary has them as special tokens: generation stops on any of these.
  std::vector<int32_t> eos_token_ids() const { return eos_token_ids_; }
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string of an id (added token content or model token); empty when unknown.
  std::string_view id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // The bytes id stands for alone (what a logprobs answer calls the token's bytes): a byte-level
  // token's bytes, a byte-fallback token's (<0xNN>) one byte, a Metaspace token with each
  // "\u2581" as a space (a leading one too, which decode strips), else decode({id}). May be
  // incomplete UTF-8. Empty for unknown ids.
  std::string token_bytes(int32_t id) const;

  // The token string decode() feeds to the decoder for `id`, or nullptr when it contributes
  // nothing (unknown id, or a special token while skipping them).
  const std::string* token_for_decode(int32_t id, bool skip_special_tokens) const;
  const Decoder& decoder() const { return decoder_; }

 private:
  Tokenizer(BpeModel model, Normalizer normalizer, PreTokenizer pre_tokenizer, Decoder decoder,
            PostProcessor post_processor);

  // The byte-level fast path: pre_tokenizer_.byte_level_split()'s matches go to
  // model_.tokenize_bytes() without building the byte-level strings.
  void encode_byte_level(std::string_view text, std::vector<int32_t>& ids) const;
  // What a chat template renders: the special tokens, the messages, no tools or documents, and
  // whether to open the assistant's turn.
  nlohmann::ordered_json chat_context(const std::vector<ChatMessage>& messages,
                                      bool add_generation_prompt, bool content_parts) const;

  BpeModel model_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  Decoder decoder_;
  PostProcessor post_processor_;
  bool raw_bytes_ = false;
  AddedVocabulary added_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> bos_token_id_;
  std::vector<int32_t> eos_token_ids_;
  nlohmann::ordered_json special_tokens_map_ = nlohmann::ordered_json::object();
  std::string chat_template_source_;
  std::shared_ptr<const Result<ChatTemplate>> chat_template_;
};

}  // namespace litellama
