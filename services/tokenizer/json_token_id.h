#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace litellama {

// Token ids above this are taken for a corrupt file: the largest published vocabularies have a
// few hundred thousand tokens, and vocab_size() (the largest id + 1) sizes tables downstream.
inline constexpr int64_t kMaxTokenId = int64_t{1} << 24;

// A token id read from tokenizer.json or tokenizer_config.json. Only an integer in
// [0, kMaxTokenId) is accepted: nlohmann's get<int32_t>() on a float or an out-of-range integer
// would convert without a check (undefined for floats), so every id goes through here.
inline Result<int32_t> json_token_id(const nlohmann::json& id, const char* what) {
  if (id.is_number_unsigned()) {
    if (id.get<uint64_t>() < static_cast<uint64_t>(kMaxTokenId)) {
      return static_cast<int32_t>(id.get<uint64_t>());
    }
  } else if (id.is_number_integer()) {
    const int64_t v = id.get<int64_t>();
    if (v >= 0 && v < kMaxTokenId) return static_cast<int32_t>(v);
  }
  return make_error(StatusCode::kInvalidArgument, "{} id {} is not an integer in [0, {})", what,
                    id.dump(), kMaxTokenId);
}

}  // namespace litellama
