#include "services/tokenizer/decoder.h"

#include "services/tokenizer/byte_level.h"
#include "services/tokenizer/pipeline_util.h"
#include "services/tokenizer/utf8.h"

namespace litellama {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xAB>" -> 0xAB, as Hugging Face's ByteFallback decoder recognizes byte tokens.
int byte_token(std::string_view t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

Status Decoder::add(const nlohmann::json& j) {
  const std::string type = j.value("type", "");
  auto after_bytes = [&]() {
    return mode_ == Mode::kByteFallback || mode_ == Mode::kByteLevel || fused_;
  };
  if (type == "Sequence") {
    for (const auto& d : j.at("decoders")) LITELLAMA_RETURN_IF_ERROR(add(d));
  } else if (type == "ByteLevel") {
    if (mode_ != Mode::kText || fused_ || !replacements_.empty()) {
      return Status(StatusCode::kUnsupported, "ByteLevel decoder must come first in a Sequence");
    }
    mode_ = Mode::kByteLevel;
  } else if (type == "Replace") {
    const auto& pattern = j.at("pattern");
    if (!pattern.contains("String")) {
      return make_error(StatusCode::kUnsupported, "unsupported Replace decoder pattern {}",
                        pattern.dump());
    }
    if (after_bytes()) {
      return Status(StatusCode::kUnsupported,
                    "Replace decoder after ByteFallback/Fuse is not supported");
    }
    replacements_.push_back(
        {pattern.at("String").get<std::string>(), j.at("content").get<std::string>()});
  } else if (type == "ByteFallback") {
    if (mode_ != Mode::kText)
      return Status(StatusCode::kUnsupported, "ByteFallback after ByteLevel");
    mode_ = Mode::kByteFallback;
  } else if (type == "Fuse") {
    fused_ = true;
  } else if (type == "Strip") {
    Strip s;
    s.content = j.at("content").get<std::string>();
    s.start = j.value("start", 0);
    s.stop = j.value("stop", 0);
    if (utf8::next(s.content).length != static_cast<int>(s.content.size())) {
      return Status(StatusCode::kUnsupported, "Strip decoder content must be one character");
    }
    if (fused_ || mode_ != Mode::kText) {
      if (!text_strip_.content.empty())
        return Status(StatusCode::kUnsupported, "two Strip decoders");
      text_strip_ = s;
    } else {
      token_strips_.push_back(s);
    }
  } else if (type == "Metaspace") {
    if (after_bytes())
      return Status(StatusCode::kUnsupported, "Metaspace decoder after ByteFallback");
    replacements_.push_back({j.value("replacement", "\u2581"), " "});
    std::string scheme = j.value("prepend_scheme", "");
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    strip_first_token_space_ = scheme != "never";
  } else {
    return make_error(StatusCode::kUnsupported, "unsupported decoder type '{}'", type);
  }
  return Status::ok();
}

Result<Decoder> Decoder::from_json(const nlohmann::json& j) {
  Decoder d;
  if (j.is_null()) {
    d.mode_ = Mode::kJoinWithSpace;
    return d;
  }
  LITELLAMA_RETURN_IF_ERROR(read_pipeline_section("decoder", [&] { return d.add(j); }));
  return d;
}

void Decoder::transform_token(std::string_view token, size_t index, std::string& out) const {
  out.assign(token);
  for (const Replacement& r : replacements_) replace_all_in_place(out, r.from, r.to);
  if (strip_first_token_space_ && index == 0 && !out.empty() && out[0] == ' ') out.erase(0, 1);
  for (const Strip& s : token_strips_) {
    for (size_t k = 0; k < s.start && out.compare(0, s.content.size(), s.content) == 0; ++k) {
      out.erase(0, s.content.size());
    }
    for (size_t k = 0; k < s.stop && out.size() >= s.content.size() &&
                       out.compare(out.size() - s.content.size(), s.content.size(), s.content) == 0;
         ++k) {
      out.resize(out.size() - s.content.size());
    }
  }
}

void Decoder::Stream::emit(std::string_view text, std::string& out) {
  const Strip& s = d_->text_strip_;
  if (s.content.empty()) {
    out.append(text);
    return;
  }
  if (!strip_start_init_) {
    strip_start_left_ = s.start;
    strip_start_init_ = true;
  }
  while (strip_start_left_ > 0 && !text.empty()) {
    if (text.compare(0, s.content.size(), s.content) != 0) {
      strip_start_left_ = 0;
      break;
    }
    text.remove_prefix(s.content.size());
    --strip_start_left_;
  }
  if (text.empty()) return;
  strip_start_left_ = 0;
  if (s.stop == 0) {
    out.append(text);
    return;
  }
  // Hold back the trailing run of strip characters until something else follows it.
  size_t end = text.size(), trailing = 0;
  while (end >= s.content.size() &&
         text.compare(end - s.content.size(), s.content.size(), s.content) == 0) {
    end -= s.content.size();
    ++trailing;
  }
  if (end == 0) {
    held_stop_ += trailing;
    return;
  }
  for (size_t k = 0; k < held_stop_; ++k) out += s.content;
  out.append(text.substr(0, end));
  held_stop_ = trailing;
}

void Decoder::Stream::replace_run(std::string& out) {
  std::string r;
  for (size_t k = 0; k < run_.size(); ++k) r += utf8::kReplacement;
  emit(r, out);
  run_.clear();
  run_checked_ = 0;
}

void Decoder::Stream::flush_run(std::string& out) {
  if (!run_invalid_ && !run_.empty()) {
    if (utf8::is_valid(run_)) {
      emit(run_, out);
    } else {
      replace_run(out);
    }
  }
  run_.clear();
  run_checked_ = 0;
  run_invalid_ = false;
}

void Decoder::Stream::push(std::string_view token, std::string& out) {
  const size_t index = n_tokens_++;
  switch (d_->mode_) {
    case Mode::kJoinWithSpace:
      if (index > 0) out += ' ';
      out.append(token);
      return;
    case Mode::kByteLevel: {
      if (!ByteLevel::get().decode(token, pending_)) pending_.append(token);
      const size_t tail = static_cast<size_t>(utf8::incomplete_tail(pending_));
      if (pending_.size() > tail) {
        const std::string text =
            utf8::lossy(std::string_view(pending_).substr(0, pending_.size() - tail));
        pending_.erase(0, pending_.size() - tail);
        emit(text, out);
      }
      return;
    }
    case Mode::kText: {
      std::string t;
      d_->transform_token(token, index, t);
      emit(t, out);
      return;
    }
    case Mode::kByteFallback: {
      std::string t;
      d_->transform_token(token, index, t);
      const int b = byte_token(t);
      if (b < 0) {
        flush_run(out);
        emit(t, out);
        return;
      }
      if (run_invalid_) {
        emit(utf8::kReplacement, out);
        return;
      }
      run_.push_back(static_cast<char>(b));
      // Check the new bytes; an ill-formed sequence anywhere makes the whole run U+FFFDs.
      while (run_checked_ < run_.size()) {
        const utf8::Sequence seq = utf8::next(std::string_view(run_).substr(run_checked_));
        if (seq.incomplete) break;
        if (!seq.valid) {
          replace_run(out);
          run_invalid_ = true;
          break;
        }
        run_checked_ += static_cast<size_t>(seq.length);
      }
      return;
    }
  }
}

void Decoder::Stream::finish(std::string& out) {
  if (d_->mode_ == Mode::kByteLevel && !pending_.empty()) {
    const std::string text = utf8::lossy(pending_);
    pending_.clear();
    emit(text, out);
  }
  if (d_->mode_ == Mode::kByteFallback) flush_run(out);
  const Strip& s = d_->text_strip_;
  if (held_stop_ > s.stop) {
    for (size_t k = 0; k < held_stop_ - s.stop; ++k) out += s.content;
  }
  *this = Stream(*d_);
}

}  // namespace litellama
