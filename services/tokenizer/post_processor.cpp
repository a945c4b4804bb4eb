#include "services/tokenizer/post_processor.h"

#include "services/tokenizer/json_token_id.h"
#include "services/tokenizer/pipeline_util.h"

namespace litellama {

Status PostProcessor::add(const nlohmann::json& j) {
  if (j.is_null()) return Status::ok();
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : j.at("processors")) LITELLAMA_RETURN_IF_ERROR(add(p));
  } else if (type == "ByteLevel") {
    // Only adjusts offsets.
  } else if (type == "TemplateProcessing") {
    bool seen_sequence = false;
    const auto& specials = j.at("special_tokens");
    for (const auto& item : j.at("single")) {
      if (item.contains("Sequence")) {
        if (item["Sequence"].value("id", "A") != "A") {
          return Status(StatusCode::kUnsupported, "TemplateProcessing single template uses $B");
        }
        seen_sequence = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      if (!specials.contains(name)) {
        return make_error(StatusCode::kInvalidArgument,
                          "TemplateProcessing uses '{}' which is not in its special_tokens", name);
      }
      auto& target = seen_sequence ? suffix_ : prefix_;
      for (const auto& id : specials.at(name).at("ids")) {
        LITELLAMA_ASSIGN_OR_RETURN(const int32_t v, json_token_id(id, "TemplateProcessing"));
        target.push_back(v);
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    LITELLAMA_ASSIGN_OR_RETURN(const int32_t cls, json_token_id(j.at("cls").at(1), "cls"));
    LITELLAMA_ASSIGN_OR_RETURN(const int32_t sep, json_token_id(j.at("sep").at(1), "sep"));
    prefix_.push_back(cls);
    suffix_.push_back(sep);
  } else {
    return make_error(StatusCode::kUnsupported, "unsupported post_processor type '{}'", type);
  }
  return Status::ok();
}

Result<PostProcessor> PostProcessor::from_json(const nlohmann::json& j) {
  PostProcessor p;
  LITELLAMA_RETURN_IF_ERROR(read_pipeline_section("post_processor", [&] { return p.add(j); }));
  return p;
}

void PostProcessor::apply(std::vector<int32_t>& ids) const {
  if (!prefix_.empty()) ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
}

}  // namespace litellama
