// Decoder: the `decoder` of tokenizer.json, turning token strings back into text, written as a
// stream so that the same code serves Tokenizer::decode and IncrementalDetokenizer. Whatever the
// chunking, the stream's output is byte-identical to decoding the whole sequence at once: the
// only state carried between tokens is what Hugging Face's decoder would still combine with later
// tokens (an incomplete UTF-8 tail, an open run of <0xXX> byte tokens, a pending strip).
//
// Supported configurations (those of the Llama 2/3 and Qwen families and their relatives):
//   ByteLevel;
//   Sequence of per-token steps [Replace (string), Metaspace-like strip of the first token,
//   Strip before Fuse] then optional ByteFallback, optional Fuse, optional Strip (whole text);
//   Metaspace; null (tokens joined with spaces, as Hugging Face does without a decoder).
// Invalid UTF-8 is replaced as Hugging Face does: ByteLevel decodes the whole byte stream lossily
// (one U+FFFD per maximal ill-formed subsequence); ByteFallback turns a run of byte tokens that is
// not valid UTF-8 into one U+FFFD per byte token.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace litellama {

class Decoder {
 public:
  // `j` is the "decoder" value of tokenizer.json (may be null).
  static Result<Decoder> from_json(const nlohmann::json& j);
  // Token strings are in the GPT-2 byte-level alphabet (ByteLevel decoder).
  bool byte_level() const { return mode_ == Mode::kByteLevel; }

  class Stream {
   public:
    explicit Stream(const Decoder& decoder) : d_(&decoder) {}
    // Appends to `out` the text that is final once `token` is known.
    void push(std::string_view token, std::string& out);
    // Appends what was held back; the stream is then back at its initial state.
    void finish(std::string& out);

   private:
    void emit(std::string_view text, std::string& out);
    void flush_run(std::string& out);
    // Emits one U+FFFD per byte of the open run (ill-formed UTF-8) and empties it.
    void replace_run(std::string& out);

    const Decoder* d_;
    size_t n_tokens_ = 0;
    std::string pending_;       // ByteLevel: incomplete UTF-8 tail
    std::string run_;           // ByteFallback: open run of byte tokens
    size_t run_checked_ = 0;    // bytes of run_ known to be complete, valid characters
    bool run_invalid_ = false;  // the open run can no longer be valid UTF-8
    size_t strip_start_left_ = 0;
    bool strip_start_init_ = false;
    size_t held_stop_ = 0;  // trailing strip characters held back
  };

 private:
  enum class Mode { kText, kByteLevel, kByteFallback, kJoinWithSpace };
  struct Replacement {
    std::string from, to;
  };
  Status add(const nlohmann::json& j);
  void transform_token(std::string_view token, size_t index, std::string& out) const;

  Mode mode_ = Mode::kText;
  bool fused_ = false;
  std::vector<Replacement> replacements_;  // per token, in order
  bool strip_first_token_space_ = false;   // Metaspace decoder
  struct Strip {
    std::string content;  // one character
    size_t start = 0, stop = 0;
  };
  std::vector<Strip> token_strips_;  // Strip before Fuse (per token)
  Strip text_strip_;                 // Strip after Fuse (whole text)
};

}  // namespace litellama
