// The in-process answer to a LLaVA prompt, which the services must reproduce: the CPU encoder's
// rows at the image's positions (the prompt [before, image tokens, after]), the CPU runner in
// float32 on one thread (as a test cluster's worker runs), greedy, with the first generated
// position's four largest logits.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "services/vision/clip_preprocess.h"
#include "services/vision/image_decode.h"
#include "services/vision/llava_vision_encoder.h"
#include "services/worker/checkpoint.h"
#include "services/worker/model_runner.h"
#include "services/worker/offline_engine.h"

namespace litellama::vision::test {

struct EngineAnswer {
  std::vector<int32_t> ids;
  std::vector<std::pair<int32_t, float>> top;
};

inline EngineAnswer llava_engine_answer(const std::string& model,
                                        const std::vector<int32_t>& before,
                                        const std::string& image, const std::vector<int32_t>& after,
                                        int32_t n_new) {
  auto ckpt = Checkpoint::open(model);
  EXPECT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  if (!ckpt.is_ok()) return {};
  auto enc = LlavaVisionEncoder::load(*ckpt, 2);
  auto config = load_clip_preprocess_config(model);
  auto rgb = decode_image(std::span(reinterpret_cast<const uint8_t*>(image.data()), image.size()));
  EXPECT_TRUE(enc.is_ok() && config.is_ok() && rgb.is_ok());
  if (!enc.is_ok() || !config.is_ok() || !rgb.is_ok()) return {};
  auto pixels = clip_preprocess(*rgb, *config);
  EXPECT_TRUE(pixels.is_ok());
  if (!pixels.is_ok()) return {};
  auto rows = (*enc)->encode(*pixels);
  EXPECT_TRUE(rows.is_ok());
  RunnerOptions options;
  options.n_kv_slots = 512;
  options.n_threads = 1;
  auto runner = create_model_runner(*ckpt, options);
  EXPECT_TRUE(runner.is_ok());
  if (!rows.is_ok() || !runner.is_ok()) return {};
  OfflineEngine engine(**runner);
  GenerationRequest r;
  r.prompt_ids = before;
  const LlavaConfig& lc = (*enc)->config();
  for (int32_t i = 0; i < lc.n_image_tokens(); ++i) {
    r.input_embedding_positions.push_back(static_cast<int32_t>(r.prompt_ids.size()));
    r.prompt_ids.push_back(lc.image_token_id);
  }
  r.prompt_ids.insert(r.prompt_ids.end(), after.begin(), after.end());
  r.input_embeddings = std::move(rows).value();
  r.max_new_tokens = n_new;
  r.n_top_logits = 4;
  auto res = engine.generate({r});
  EXPECT_TRUE(res.is_ok());
  if (!res.is_ok()) return {};
  return {res->front().output_ids, res->front().top_logits};
}

}  // namespace litellama::vision::test
