// Helpers shared by the steps of tokenizer.json's pipeline (normalizer, pre-tokenizer,
// post-processor, decoder).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace litellama {

// Runs `read`, a function reading one pipeline section of tokenizer.json, and returns its status;
// a JSON exception (a missing key or a value of the wrong type) becomes kInvalidArgument
// "malformed <section>: ...", so that no bad file throws past the loader.
template <typename Read>
Status read_pipeline_section(const char* section, Read&& read) {
  try {
    return read();
  } catch (const nlohmann::json::exception& e) {
    return make_error(StatusCode::kInvalidArgument, "malformed {}: {}", section, e.what());
  }
}

// tokenizer.json's nesting of a pipeline section: null adds nothing, a "Sequence" adds each entry
// of its `list_key` list in order (Sequences may nest), and any other object is one step, read by
// add_one(j, type).
template <typename AddOne>
Status add_section(const nlohmann::json& j, const char* list_key, AddOne&& add_one) {
  if (j.is_null()) return Status::ok();
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& entry : j.at(list_key)) {
      LITELLAMA_RETURN_IF_ERROR(add_section(entry, list_key, add_one));
    }
    return Status::ok();
  }
  return add_one(j, type);
}

// The steps of a section that nests with "Sequence" (its list under `list_key`), each read by
// add_one(j, type, steps), with read_pipeline_section's error for malformed JSON.
template <typename Step, typename AddOne>
Result<std::vector<Step>> read_section_steps(const nlohmann::json& j, const char* section,
                                             const char* list_key, AddOne&& add_one) {
  std::vector<Step> steps;
  LITELLAMA_RETURN_IF_ERROR(read_pipeline_section(section, [&] {
    return add_section(j, list_key, [&](const nlohmann::json& one, const std::string& type) {
      return add_one(one, type, steps);
    });
  }));
  return steps;
}

// Replaces every occurrence of `from` in s, left to right, without rescanning replaced text; an
// empty `from` leaves s as it is.
inline void replace_all_in_place(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  size_t start = 0;
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, start)) {
    out.append(s, start, p - start);
    out += to;
    start = p + from.size();
  }
  out.append(s, start, std::string::npos);
  s = std::move(out);
}

}  // namespace litellama
