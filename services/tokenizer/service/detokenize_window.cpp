#include "services/tokenizer/service/detokenize_window.h"

namespace litellama {

namespace {

bool ends_with_replacement(const std::string& s) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  return s.size() >= kReplacement.size() &&
         std::string_view(s).substr(s.size() - kReplacement.size()) == kReplacement;
}

}  // namespace

Result<proto::DetokenizeResult> detokenize_window(const proto::DetokenizeItem& item,
                                                  const DecodeFn& decode) {
  if (item.read_offset < 0 || static_cast<size_t>(item.read_offset) > item.token_ids.size()) {
    return make_error(StatusCode::kInvalidArgument, "read_offset {} outside a window of {} ids",
                      item.read_offset, item.token_ids.size());
  }
  const std::span<const int32_t> ids(item.token_ids);
  LITELLAMA_ASSIGN_OR_RETURN(std::string prefix,
                             decode(ids.first(static_cast<size_t>(item.read_offset))));
  LITELLAMA_ASSIGN_OR_RETURN(std::string full, decode(ids));
  proto::DetokenizeResult result;
  result.request_id = item.request_id;
  const bool grew = full.size() > prefix.size();
  if (item.final || (grew && !ends_with_replacement(full))) {
    result.text = grew ? full.substr(prefix.size()) : std::string();
    result.advanced = true;
  }
  return result;
}

}  // namespace litellama
