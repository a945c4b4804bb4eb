#include "services/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <iterator>
#include <string_view>
#include <utility>

#include "services/tokenizer/byte_level.h"
#include "services/tokenizer/pipeline_util.h"

namespace litellama {
namespace {

// The GPT-2 pattern ByteLevel uses when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void replace_spaces(std::string& s, const std::string& replacement) {
  if (s.find(' ') == std::string::npos) return;
  std::string out;
  out.reserve(s.size() + s.size() / 2);
  for (const char c : s) {
    if (c == ' ') {
      out += replacement;
    } else {
      out += c;
    }
  }
  s = std::move(out);
}

}  // namespace

Status PreTokenizer::add_one(const nlohmann::json& j, const std::string& type,
                             std::vector<Step>& steps) {
  Step step;
  if (type == "Split") {
    step.kind = Kind::kSplit;
    const auto& pattern = j.at("pattern");
    std::string regex;
    if (pattern.contains("Regex")) {
      regex = pattern.at("Regex").get<std::string>();
    } else if (pattern.contains("String")) {
      regex = UnicodeRegex::escape(pattern.at("String").get<std::string>());
    } else {
      return make_error(StatusCode::kUnsupported, "unsupported Split pattern: {}", pattern.dump());
    }
    LITELLAMA_ASSIGN_OR_RETURN(step.regex, UnicodeRegex::compile(regex));
    // tokenizer.json's names of the Split behaviors.
    static constexpr std::pair<std::string_view, Behavior> kBehaviors[] = {
        {"Isolated", Behavior::kIsolated},
        {"Removed", Behavior::kRemoved},
        {"MergedWithPrevious", Behavior::kMergedWithPrevious},
        {"MergedWithNext", Behavior::kMergedWithNext}};
    const std::string behavior = j.value("behavior", "Isolated");
    const auto* named = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                                     [&](const auto& b) { return b.first == behavior; });
    if (named == std::end(kBehaviors)) {
      return make_error(StatusCode::kUnsupported, "unsupported Split behavior '{}'", behavior);
    }
    step.behavior = named->second;
    step.invert = j.value("invert", false);
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    step.add_prefix_space = j.value("add_prefix_space", true);
    step.use_regex = j.value("use_regex", true);
    if (step.use_regex) {
      LITELLAMA_ASSIGN_OR_RETURN(step.regex, UnicodeRegex::compile(kGpt2Pattern));
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.replacement = j.value("replacement", "\u2581");
    step.prepend_scheme = j.value("prepend_scheme", "");
    if (step.prepend_scheme.empty()) {
      step.prepend_scheme = j.value("add_prefix_space", true) ? "always" : "never";
    }
    if (step.prepend_scheme != "always" && step.prepend_scheme != "first" &&
        step.prepend_scheme != "never") {
      return make_error(StatusCode::kUnsupported, "unsupported Metaspace prepend_scheme '{}'",
                        step.prepend_scheme);
    }
    step.split = j.value("split", true);
  } else {
    return make_error(StatusCode::kUnsupported, "unsupported pre_tokenizer type '{}'", type);
  }
  steps.push_back(std::move(step));
  return Status::ok();
}

PreTokenizer& PreTokenizer::operator=(PreTokenizer&& other) noexcept {
  steps_ = std::move(other.steps_);
  other.steps_.clear();
  other.byte_level_split_ = nullptr;
  find_byte_level_split();
  return *this;
}

void PreTokenizer::find_byte_level_split() {
  byte_level_split_ = nullptr;
  byte_level_prefix_space_ = false;
  if (steps_.size() == 1 && steps_[0].kind == Kind::kByteLevel && steps_[0].use_regex) {
    byte_level_split_ = &steps_[0].regex;
    byte_level_prefix_space_ = steps_[0].add_prefix_space;
  } else if (steps_.size() == 2 && steps_[0].kind == Kind::kSplit &&
             steps_[0].behavior == Behavior::kIsolated && !steps_[0].invert &&
             steps_[1].kind == Kind::kByteLevel && !steps_[1].use_regex &&
             !steps_[1].add_prefix_space) {
    byte_level_split_ = &steps_[0].regex;
  }
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& j) {
  PreTokenizer p;
  LITELLAMA_ASSIGN_OR_RETURN(
      p.steps_, read_section_steps<Step>(j, "pre_tokenizer", "pretokenizers", add_one));
  p.find_byte_level_split();
  return p;
}

PreTokenizer PreTokenizer::metaspace(std::string replacement, std::string prepend_scheme,
                                     bool split) {
  PreTokenizer p;
  Step step;
  step.kind = Kind::kMetaspace;
  step.replacement = std::move(replacement);
  step.prepend_scheme = std::move(prepend_scheme);
  step.split = split;
  p.steps_.push_back(std::move(step));
  return p;
}

void PreTokenizer::split_pieces(const UnicodeRegex& regex, Behavior behavior, bool invert,
                                std::vector<Piece>& pieces) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  for (Piece& piece : pieces) {
    const std::string& t = piece.text;
    // (begin, end, is_match) spans covering the piece.
    std::vector<std::tuple<size_t, size_t, bool>> spans;
    size_t prev = 0;
    regex.for_each_match(t, [&](size_t b, size_t e) {
      if (b > prev) spans.emplace_back(prev, b, invert);
      spans.emplace_back(b, e, !invert);
      prev = e;
    });
    if (prev < t.size()) spans.emplace_back(prev, t.size(), invert);
    // Merge according to the behaviour; `delim` spans are the matches (after inversion).
    std::vector<std::pair<size_t, size_t>> kept;
    bool pending_next = false;
    size_t pending_begin = 0;
    for (const auto& [b, e, delim] : spans) {
      switch (behavior) {
        case Behavior::kIsolated:
          kept.emplace_back(b, e);
          break;
        case Behavior::kRemoved:
          if (!delim) kept.emplace_back(b, e);
          break;
        case Behavior::kMergedWithPrevious:
          if (delim && !kept.empty() && kept.back().second == b) {
            kept.back().second = e;
          } else {
            kept.emplace_back(b, e);
          }
          break;
        case Behavior::kMergedWithNext:
          if (delim) {
            if (!pending_next) pending_begin = b;
            pending_next = true;
          } else if (pending_next) {
            kept.emplace_back(pending_begin, e);
            pending_next = false;
          } else {
            kept.emplace_back(b, e);
          }
          break;
      }
    }
    if (pending_next) kept.emplace_back(pending_begin, t.size());
    for (const auto& [b, e] : kept) {
      if (e > b) out.push_back({t.substr(b, e - b), piece.at_origin && b == 0});
    }
  }
  pieces = std::move(out);
}

void PreTokenizer::pre_tokenize(std::string_view text, bool at_origin,
                                std::vector<std::string>& words) const {
  if (text.empty()) return;
  std::vector<Piece> pieces{{std::string(text), at_origin}};
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kSplit:
        split_pieces(step.regex, step.behavior, step.invert, pieces);
        break;
      case Kind::kByteLevel: {
        if (step.add_prefix_space) {
          for (Piece& p : pieces) {
            if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
          }
        }
        if (step.use_regex) split_pieces(step.regex, Behavior::kIsolated, false, pieces);
        const ByteLevel& bl = ByteLevel::get();
        for (Piece& p : pieces) {
          std::string mapped;
          mapped.reserve(p.text.size() * 2);
          bl.encode(p.text, mapped);
          p.text = std::move(mapped);
        }
        break;
      }
      case Kind::kMetaspace: {
        std::vector<Piece> out;
        for (Piece& p : pieces) {
          if (p.text.empty()) continue;
          replace_spaces(p.text, step.replacement);
          const bool starts = p.text.compare(0, step.replacement.size(), step.replacement) == 0;
          if (!starts && (step.prepend_scheme == "always" ||
                          (step.prepend_scheme == "first" && p.at_origin))) {
            p.text.insert(0, step.replacement);
          }
          if (!step.split) {
            out.push_back(std::move(p));
            continue;
          }
          // MergedWithNext on the replacement character: "▁a▁b" -> "▁a", "▁b".
          size_t begin = 0;
          for (size_t pos = p.text.find(step.replacement, step.replacement.size());
               pos != std::string::npos;
               pos = p.text.find(step.replacement, pos + step.replacement.size())) {
            if (pos > begin)
              out.push_back({p.text.substr(begin, pos - begin), p.at_origin && begin == 0});
            begin = pos;
          }
          out.push_back({p.text.substr(begin), p.at_origin && begin == 0});
        }
        pieces = std::move(out);
        break;
      }
    }
  }
  for (Piece& p : pieces) {
    if (!p.text.empty()) words.push_back(std::move(p.text));
  }
}

}  // namespace litellama
