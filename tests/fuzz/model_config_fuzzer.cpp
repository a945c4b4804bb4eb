// Fuzz target: config.json parsing (services/worker/model_config.h). Properties: the parser
// returns a config or an error, never crashes; a config it accepts has the shape the backends
// rely on (positive sizes, whole heads, a head count divisible by the KV head count).
#include <cstdint>
#include <string>

#include "services/worker/model_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = litellama::parse_model_config(text);
  if (!config.is_ok()) {
    FUZZ_CHECK(!config.status().to_string().empty(), "an error without a message");
    return 0;
  }
  const litellama::ModelConfig& c = *config;
  FUZZ_CHECK(c.hidden_size > 0 && c.intermediate_size > 0 && c.n_layers > 0, "non-positive size");
  FUZZ_CHECK(c.n_heads > 0 && c.n_kv_heads > 0 && c.head_dim > 0, "non-positive head count");
  FUZZ_CHECK(c.n_heads % c.n_kv_heads == 0, "query heads not a multiple of KV heads");
  FUZZ_CHECK(c.vocab_size > 0, "non-positive vocab_size");
  FUZZ_CHECK(c.max_position_embeddings > 0, "non-positive max_position_embeddings");
  FUZZ_CHECK(c.rope.theta > 0, "non-positive rope theta");
  return 0;
}
