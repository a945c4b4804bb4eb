#include "services/tokenizer/normalizer.h"

#include <cstdlib>

#include <utf8proc.h>

#include "services/tokenizer/pipeline_util.h"
#include "services/tokenizer/utf8.h"

namespace litellama {
namespace {

bool is_ascii(const std::string& s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

void unicode_normalize(std::string& text, int options) {
  if (is_ascii(text)) return;  // ASCII is invariant under every normalization form
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | options));
  if (n >= 0 && out != nullptr)
    text.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
}

}  // namespace

Status Normalizer::add_one(const nlohmann::json& j, const std::string& type,
                           std::vector<Step>& steps) {
  if (type == "NFC") {
    steps.push_back({Kind::kNfc, "", ""});
  } else if (type == "NFD") {
    steps.push_back({Kind::kNfd, "", ""});
  } else if (type == "NFKC") {
    steps.push_back({Kind::kNfkc, "", ""});
  } else if (type == "NFKD") {
    steps.push_back({Kind::kNfkd, "", ""});
  } else if (type == "Lowercase") {
    steps.push_back({Kind::kLowercase, "", ""});
  } else if (type == "Prepend") {
    steps.push_back({Kind::kPrepend, j.at("prepend").get<std::string>(), ""});
  } else if (type == "Replace") {
    const auto& pattern = j.at("pattern");
    if (!pattern.contains("String")) {
      return make_error(StatusCode::kUnsupported,
                        "unsupported Replace normalizer pattern (only String patterns): {}",
                        pattern.dump());
    }
    steps.push_back({Kind::kReplace, pattern.at("String").get<std::string>(),
                     j.at("content").get<std::string>()});
  } else {
    return make_error(StatusCode::kUnsupported, "unsupported normalizer type '{}'", type);
  }
  return Status::ok();
}

Result<Normalizer> Normalizer::from_json(const nlohmann::json& j) {
  Normalizer n;
  LITELLAMA_ASSIGN_OR_RETURN(n.steps_,
                             read_section_steps<Step>(j, "normalizer", "normalizers", add_one));
  return n;
}

void Normalizer::normalize(std::string& text) const {
  for (const Step& s : steps_) {
    switch (s.kind) {
      case Kind::kNfc:
        unicode_normalize(text, UTF8PROC_COMPOSE);
        break;
      case Kind::kNfd:
        unicode_normalize(text, UTF8PROC_DECOMPOSE);
        break;
      case Kind::kNfkc:
        unicode_normalize(text, UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
        break;
      case Kind::kNfkd:
        unicode_normalize(text, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
        break;
      case Kind::kLowercase: {
        std::string out;
        out.reserve(text.size());
        size_t i = 0;
        while (i < text.size()) {
          const utf8::Sequence seq = utf8::next(std::string_view(text).substr(i));
          utf8::append(
              out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(seq.cp))));
          i += static_cast<size_t>(seq.length);
        }
        text = std::move(out);
        break;
      }
      case Kind::kPrepend:
        if (!text.empty()) text.insert(0, s.a);
        break;
      case Kind::kReplace:
        replace_all_in_place(text, s.a, s.b);
        break;
    }
  }
}

}  // namespace litellama
