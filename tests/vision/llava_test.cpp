// LLaVA on the CPU: the tiny random checkpoint (make-model --preset llava-tiny) loads in both
// published tensor layouts, single and sharded; its vision tower and projector match an
// independent numpy reference (tests/vision/llava_reference.py, float64) within 1e-4 of the
// output's scale; the text model takes the image rows at the image-token positions, greedy ids
// are deterministic and change with the image, and rows read by index from a pool-like buffer
// give the same bits as contiguous rows; the transformers goldens (make_golden.py --presets
// llava-tiny) are checked when present.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "services/vision/llava_vision_encoder.h"
#include "services/worker/checkpoint.h"
#include "services/worker/offline_engine.h"
#include "services/worker/safetensors.h"
#include "tests/vision/vision_test_util.h"
#include "tests/worker/test_util.h"

namespace litellama::vision {
namespace {

namespace fs = std::filesystem;
using litellama::test::TempDir;
using nlohmann::json;

constexpr uint64_t kSeed = 1234;

std::string make_llava(const TempDir& tmp, const std::string& name, int32_t n_shards = 1) {
  const std::string dir = tmp.sub(name);
  litellama::test::make_model(dir, "llava-tiny", kSeed, n_shards);
  return dir;
}

Result<PixelValues> pixels_of(const std::string& model_dir, const std::string& image) {
  LITELLAMA_ASSIGN_OR_RETURN(ClipPreprocessConfig config, load_clip_preprocess_config(model_dir));
  LITELLAMA_ASSIGN_OR_RETURN(RgbImage rgb,
                             decode_image_file((test::images_dir() / image).string()));
  return clip_preprocess(rgb, config);
}

// max |a - b| / max |b|.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : INFINITY;
}

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  return v;
}

TEST(LlavaCheckpoint, LoadsBothPublishedLayoutsSingleAndSharded) {
  TempDir tmp;
  const std::string single = make_llava(tmp, "single");
  const std::string sharded = make_llava(tmp, "sharded", 3);
  auto a = Checkpoint::open(single);
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  ASSERT_NE(a->llava(), nullptr);
  EXPECT_EQ(a->config().text_prefix, "language_model.model.");
  EXPECT_EQ(a->llava_names().vision_prefix, "vision_tower.");
  EXPECT_EQ(a->llava()->n_image_tokens(), 25);
  EXPECT_EQ(a->llava()->n_layers_used(), 2);
  auto b = Checkpoint::open(sharded);
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->shard_bytes().size(), 3u);

  // transformers' newer layout: model.vision_tower., model.multi_modal_projector.,
  // model.language_model., lm_head.
  auto mapped = MappedFile::open(single + "/model.safetensors");
  ASSERT_TRUE(mapped.is_ok());
  auto entries = parse_safetensors(*mapped);
  ASSERT_TRUE(entries.is_ok());
  std::vector<SafetensorsTensor> renamed;
  for (const auto& e : *entries) {
    std::string name = e.name;
    if (name.rfind("language_model.model.", 0) == 0) {
      name = "model.language_model." + name.substr(21);
    } else if (name == "language_model.lm_head.weight") {
      name = "lm_head.weight";
    } else {
      name = "model." + name;
    }
    renamed.push_back({name, e.dtype, e.shape,
                       std::vector<uint8_t>(mapped->data() + e.offset_bytes,
                                            mapped->data() + e.offset_bytes + e.size_bytes)});
  }
  const std::string newer = tmp.sub("newer");
  fs::create_directories(newer);
  ASSERT_TRUE(write_safetensors(newer + "/model.safetensors", renamed).is_ok());
  fs::copy_file(single + "/config.json", newer + "/config.json");
  fs::copy_file(single + "/preprocessor_config.json", newer + "/preprocessor_config.json");
  auto c = Checkpoint::open(newer);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->config().text_prefix, "model.language_model.");
  EXPECT_EQ(c->lm_head_name(), "lm_head.weight");
  EXPECT_EQ(c->llava_names().vision_prefix, "model.vision_tower.");
  EXPECT_EQ(c->llava_names().projector_prefix, "model.multi_modal_projector.");

  // The three load the same encoder: identical embeddings.
  auto pixels = pixels_of(single, "rgb_61x45.jpg");
  ASSERT_TRUE(pixels.is_ok()) << pixels.status().to_string();
  std::vector<std::vector<float>> outs;
  for (const Checkpoint* ckpt : {&*a, &*b, &*c}) {
    auto enc = LlavaVisionEncoder::load(*ckpt, 2);
    ASSERT_TRUE(enc.is_ok()) << enc.status().to_string();
    auto e = (*enc)->encode(*pixels);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    outs.push_back(std::move(e).value());
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);

  // A missing vision tensor is named.
  renamed.erase(std::remove_if(renamed.begin(), renamed.end(),
                               [](const SafetensorsTensor& t) {
                                 return t.name.find("layers.1.mlp.fc2.bias") != std::string::npos;
                               }),
                renamed.end());
  ASSERT_TRUE(write_safetensors(newer + "/model.safetensors", renamed).is_ok());
  auto missing = Checkpoint::open(newer);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find(
                "model.vision_tower.vision_model.encoder.layers.1.mlp.fc2.bias"),
            std::string::npos)
      << missing.status().message();
}

TEST(LlavaVision, MatchesTheNumpyReference) {
  TempDir tmp;
  const std::string dir = make_llava(tmp, "model");
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  auto enc = LlavaVisionEncoder::load(*ckpt, 2);
  ASSERT_TRUE(enc.is_ok()) << enc.status().to_string();
  const LlavaConfig& lc = (*enc)->config();
  for (const char* image : {"rgb_61x45.jpg", "rgba_19x41.png"}) {
    SCOPED_TRACE(image);
    auto pixels = pixels_of(dir, image);
    ASSERT_TRUE(pixels.is_ok()) << pixels.status().to_string();
    const std::string px_path = tmp.sub("pixels.f32");
    {
      std::ofstream out(px_path, std::ios::binary);
      out.write(reinterpret_cast<const char*>(pixels->data.data()),
                static_cast<std::streamsize>(pixels->data.size() * 4));
    }
    const std::string cmd = std::string(LITELLAMA_TEST_PYTHON) + " " + test::source_dir() +
                            "/tests/vision/llava_reference.py " + dir + " " + px_path + " " +
                            tmp.sub("features.f32") + " " + tmp.sub("embeds.f32");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << " (needs python3-numpy)";
    const std::vector<float> ref_features = read_f32(tmp.sub("features.f32"));
    const std::vector<float> ref_embeds = read_f32(tmp.sub("embeds.f32"));

    auto features = (*enc)->vision_features(*pixels);
    ASSERT_TRUE(features.is_ok()) << features.status().to_string();
    ASSERT_EQ(features->size(), static_cast<size_t>(25) * lc.vision.hidden_size);
    ASSERT_EQ(ref_features.size(), features->size());
    const double feature_error = relative_error(*features, ref_features);
    EXPECT_LE(feature_error, 1e-4);
    auto embeds = (*enc)->project(*features);
    ASSERT_TRUE(embeds.is_ok()) << embeds.status().to_string();
    // The projector's output: one text-hidden row per image token.
    ASSERT_EQ(embeds->size(), static_cast<size_t>(lc.n_image_tokens()) * lc.text_hidden_size);
    ASSERT_EQ(ref_embeds.size(), embeds->size());
    const double embed_error = relative_error(*embeds, ref_embeds);
    EXPECT_LE(embed_error, 1e-4);
    for (float v : *embeds) ASSERT_TRUE(std::isfinite(v));
    std::printf("%s: vision features %.3g, projector output %.3g (relative to max |ref|)\n", image,
                feature_error, embed_error);
  }
  PixelValues wrong;
  wrong.height = wrong.width = 31;
  wrong.data.assign(3 * 31 * 31, 0.0f);
  EXPECT_EQ((*enc)->encode(wrong).status().code(), StatusCode::kInvalidArgument);
}

// The prompt of the generation tests: a few text ids, the image's 25 tokens, a few more ids.
GenerationRequest image_request(const LlavaConfig& lc, std::vector<float> embeds, int32_t n_new) {
  GenerationRequest r;
  r.prompt_ids = {1, 319, 1967, 29901};
  for (int32_t i = 0; i < lc.n_image_tokens(); ++i) {
    r.input_embedding_positions.push_back(static_cast<int32_t>(r.prompt_ids.size()));
    r.prompt_ids.push_back(lc.image_token_id);
  }
  for (int32_t id : {13, 5618, 338, 445}) r.prompt_ids.push_back(id);
  r.input_embeddings = std::move(embeds);
  r.max_new_tokens = n_new;
  r.n_top_logits = 4;
  return r;
}

// The vision encoder and a two-thread CPU runner with n_kv_slots slots of `ckpt`.
void load_encoder_and_runner(const Checkpoint& ckpt, int32_t n_kv_slots,
                             std::unique_ptr<LlavaVisionEncoder>* enc,
                             std::unique_ptr<ModelRunner>* runner) {
  auto e = LlavaVisionEncoder::load(ckpt, 2);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  RunnerOptions options;
  options.n_kv_slots = n_kv_slots;
  options.n_threads = 2;
  auto r = create_model_runner(ckpt, options);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  *enc = std::move(e).value();
  *runner = std::move(r).value();
}

TEST(LlavaGeneration, GreedyIdsAreDeterministicAndFollowTheImage) {
  TempDir tmp;
  const std::string dir = make_llava(tmp, "model");
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  std::unique_ptr<LlavaVisionEncoder> enc;
  std::unique_ptr<ModelRunner> runner;
  ASSERT_NO_FATAL_FAILURE(load_encoder_and_runner(*ckpt, 256, &enc, &runner));
  EXPECT_TRUE(runner->supports_input_embeddings(EmbeddingMemory::kHost));
  EXPECT_FALSE(runner->supports_input_embeddings(EmbeddingMemory::kDevice));
  OfflineEngine engine(*runner);
  const LlavaConfig& lc = enc->config();

  std::vector<std::vector<float>> embeds;
  for (const char* image : {"rgb_61x45.jpg", "rgba_19x41.png"}) {
    auto pixels = pixels_of(dir, image);
    ASSERT_TRUE(pixels.is_ok()) << pixels.status().to_string();
    auto e = enc->encode(*pixels);
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    embeds.push_back(std::move(e).value());
  }
  constexpr int32_t kNew = 12;
  auto first = engine.generate({image_request(lc, embeds[0], kNew)});
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  auto again = engine.generate({image_request(lc, embeds[0], kNew)});
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ((*first)[0].output_ids, (*again)[0].output_ids);
  EXPECT_EQ((*first)[0].top_logits, (*again)[0].top_logits);
  ASSERT_EQ((*first)[0].output_ids.size(), static_cast<size_t>(kNew));

  // Another image, and the bare image-token embeddings: other tokens.
  auto other = engine.generate({image_request(lc, embeds[1], kNew)});
  ASSERT_TRUE(other.is_ok()) << other.status().to_string();
  EXPECT_NE((*first)[0].output_ids, (*other)[0].output_ids);
  GenerationRequest bare = image_request(lc, {}, kNew);
  bare.input_embedding_positions.clear();
  auto plain = engine.generate({bare});
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  EXPECT_NE((*first)[0].output_ids, (*plain)[0].output_ids);

  // Packed with another request and prefilled in chunks that split the image: the same ids.
  OfflineEngineOptions chunked;
  chunked.max_prefill_tokens = 7;
  OfflineEngine chunked_engine(*runner, chunked);
  auto together = chunked_engine.generate(
      {image_request(lc, embeds[1], kNew), image_request(lc, embeds[0], kNew)});
  ASSERT_TRUE(together.is_ok()) << together.status().to_string();
  EXPECT_EQ((*together)[0].output_ids, (*other)[0].output_ids);
  EXPECT_EQ((*together)[1].output_ids, (*first)[0].output_ids);

  // Bad requests are refused before any step.
  GenerationRequest short_rows = image_request(lc, embeds[0], kNew);
  short_rows.input_embeddings.pop_back();
  EXPECT_EQ(engine.generate({short_rows}).status().code(), StatusCode::kInvalidArgument);
  GenerationRequest past_end = image_request(lc, embeds[0], kNew);
  past_end.input_embedding_positions.back() = static_cast<int32_t>(past_end.prompt_ids.size());
  EXPECT_EQ(engine.generate({past_end}).status().code(), StatusCode::kInvalidArgument);
  StepBatch batch;
  batch.add_sequence(std::vector<int32_t>{1, 2}, std::vector<int32_t>{0, 1}, true, {}, 0);
  batch.embed_token_index = {1};
  StepOutput out;
  EXPECT_EQ(runner->step(batch, &out).code(), StatusCode::kInvalidArgument);
}

// One request generated step by step on `runner`, its prompt prefilled in chunks of `chunk`
// tokens, asking every step for top logits and the log-sum-exp. The image rows go in
// contiguously in token order (StepBatch::embed_rows alone) when `pool` is null, else by row
// index (StepBatch::embed_row_index) into `pool`, where the image's row k is row
// pool_first_row + k.
struct StepByStep {
  std::vector<int32_t> ids;
  std::vector<std::vector<std::pair<int32_t, float>>> top_logits;  // per generated id
  std::vector<float> lse;
};

Result<StepByStep> generate_step_by_step(ModelRunner& runner, const GenerationRequest& r,
                                         int32_t chunk, const float* pool, int32_t pool_first_row) {
  const size_t H = static_cast<size_t>(runner.config().hidden_size);
  const auto n_prompt = static_cast<int32_t>(r.prompt_ids.size());
  StepByStep result;
  StepBatch batch;
  StepOutput out;
  std::vector<int32_t> slots, tokens;
  std::vector<float> rows;
  int32_t n_prefilled = 0;
  while (static_cast<int32_t>(result.ids.size()) < r.max_new_tokens) {
    batch.clear();
    rows.clear();
    batch.n_top_logits = 8;
    batch.logprobs = true;
    if (n_prefilled < n_prompt) {
      const int32_t n = std::min(chunk, n_prompt - n_prefilled);
      tokens.assign(r.prompt_ids.begin() + n_prefilled, r.prompt_ids.begin() + n_prefilled + n);
      for (size_t k = 0; k < r.input_embedding_positions.size(); ++k) {
        const int32_t p = r.input_embedding_positions[k];
        if (p < n_prefilled || p >= n_prefilled + n) continue;
        batch.embed_token_index.push_back(p - n_prefilled);
        if (pool != nullptr) {
          batch.embed_row_index.push_back(pool_first_row + static_cast<int32_t>(k));
        } else {
          rows.insert(rows.end(), r.input_embeddings.begin() + static_cast<ptrdiff_t>(k * H),
                      r.input_embeddings.begin() + static_cast<ptrdiff_t>((k + 1) * H));
        }
      }
      n_prefilled += n;
    } else {
      tokens = {result.ids.back()};
    }
    for (size_t k = 0; k < tokens.size(); ++k) slots.push_back(static_cast<int32_t>(slots.size()));
    batch.add_sequence(tokens, slots, n_prefilled == n_prompt, r.sampling,
                       static_cast<int32_t>(result.ids.size()));
    if (!batch.embed_token_index.empty()) batch.embed_rows = pool != nullptr ? pool : rows.data();
    LITELLAMA_RETURN_IF_ERROR(runner.step(batch, &out));
    if (out.sampled_ids[0] < 0) continue;  // a prefill chunk before the prompt's last
    result.ids.push_back(out.sampled_ids[0]);
    result.top_logits.push_back(out.top_logits[0]);
    result.lse.push_back(out.lse[0]);
  }
  return result;
}

// The image's rows read in place from a pool-like buffer (slot 2 of 3, slots padded, the other
// slots NaN so a wrong row shows) through embed_row_index give bit for bit the ids, top logits
// and log-sum-exps of the same rows given contiguously, whole or in prefill chunks that split the
// image; malformed row indices are refused.
TEST(LlavaGeneration, PoolRowIndicesMatchContiguousRowsBitForBit) {
  TempDir tmp;
  const std::string dir = make_llava(tmp, "model");
  auto ckpt = Checkpoint::open(dir);
  ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
  std::unique_ptr<LlavaVisionEncoder> enc;
  std::unique_ptr<ModelRunner> runner;
  ASSERT_NO_FATAL_FAILURE(load_encoder_and_runner(*ckpt, 256, &enc, &runner));
  const LlavaConfig& lc = enc->config();
  auto pixels = pixels_of(dir, "rgb_61x45.jpg");
  ASSERT_TRUE(pixels.is_ok()) << pixels.status().to_string();
  auto embeds = enc->encode(*pixels);
  ASSERT_TRUE(embeds.is_ok()) << embeds.status().to_string();
  const auto H = static_cast<size_t>(runner->config().hidden_size);
  const auto n_rows = static_cast<size_t>(lc.n_image_tokens());
  ASSERT_EQ(embeds->size(), n_rows * H);

  const size_t slot_rows = n_rows + 3;  // padding rows, as a pool may have
  std::vector<float> pool(3 * slot_rows * H, std::nanf(""));
  std::copy(embeds->begin(), embeds->end(),
            pool.begin() + static_cast<ptrdiff_t>(2 * slot_rows * H));
  const auto first_row = static_cast<int32_t>(2 * slot_rows);

  constexpr int32_t kNew = 8;
  const GenerationRequest r = image_request(lc, *embeds, kNew);
  OfflineEngineOptions chunked;
  chunked.max_prefill_tokens = 7;
  auto engine = OfflineEngine(*runner, chunked).generate({r});
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  for (int32_t chunk : {7, 1000}) {
    SCOPED_TRACE(chunk);
    auto contiguous = generate_step_by_step(*runner, r, chunk, nullptr, 0);
    ASSERT_TRUE(contiguous.is_ok()) << contiguous.status().to_string();
    auto in_place = generate_step_by_step(*runner, r, chunk, pool.data(), first_row);
    ASSERT_TRUE(in_place.is_ok()) << in_place.status().to_string();
    EXPECT_EQ(in_place->ids, contiguous->ids);
    EXPECT_EQ((*engine)[0].output_ids, in_place->ids);
    ASSERT_EQ(in_place->top_logits.size(), static_cast<size_t>(kNew));
    for (size_t i = 0; i < in_place->top_logits.size(); ++i) {
      const auto& a = in_place->top_logits[i];
      const auto& b = contiguous->top_logits[i];
      ASSERT_EQ(a.size(), b.size());
      for (size_t k = 0; k < a.size(); ++k) {
        EXPECT_EQ(a[k].first, b[k].first) << i << " " << k;
        EXPECT_EQ(std::memcmp(&a[k].second, &b[k].second, sizeof(float)), 0) << i << " " << k;
      }
      EXPECT_EQ(std::memcmp(&in_place->lse[i], &contiguous->lse[i], sizeof(float)), 0) << i;
      EXPECT_FALSE(std::isnan(in_place->lse[i])) << i;
    }
    if (chunk == 7) {  // the engine prefills in the same chunks: the same logits
      const auto& first = in_place->top_logits[0];
      const auto& want = (*engine)[0].top_logits;
      ASSERT_LE(want.size(), first.size());
      for (size_t k = 0; k < want.size(); ++k) EXPECT_EQ(first[k], want[k]) << k;
    }
  }

  StepBatch batch;
  batch.add_sequence(std::vector<int32_t>{1, 2}, std::vector<int32_t>{0, 1}, true, {}, 0);
  batch.embed_token_index = {1};
  batch.embed_rows = pool.data();
  StepOutput out;
  batch.embed_row_index = {first_row, first_row + 1};  // one more than embedded tokens
  EXPECT_EQ(runner->step(batch, &out).code(), StatusCode::kInvalidArgument);
  batch.embed_row_index = {-1};
  EXPECT_EQ(runner->step(batch, &out).code(), StatusCode::kInvalidArgument);
  batch.embed_token_index.clear();
  batch.embed_row_index = {first_row};  // rows named for no token
  EXPECT_EQ(runner->step(batch, &out).code(), StatusCode::kInvalidArgument);
  batch.embed_token_index = {1};
  EXPECT_TRUE(runner->step(batch, &out).is_ok());
}

// transformers' references (tests/golden/make_golden.py --presets llava-tiny on a machine with
// transformers): pixel values, vision features, greedy ids. Every llava*.json present is checked.
TEST(LlavaGolden, MatchesTransformersWhereReferencesExist) {
  const fs::path dir = fs::path(test::source_dir()) / "tests/golden/models";
  int n_files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("llava", 0) != 0 || entry.path().extension() != ".json") continue;
    if (name.find(".bfloat16.") != std::string::npos ||
        name.find(".float16.") != std::string::npos) {
      continue;  // 16-bit references are the GPU test's
    }
    SCOPED_TRACE(name);
    ++n_files;
    std::ifstream in(entry.path());
    const json golden = json::parse(in, nullptr, false);
    ASSERT_FALSE(golden.is_discarded());
    TempDir tmp;
    const std::string model = tmp.sub("model");
    litellama::test::make_model(model, golden["preset"].get<std::string>(),
                                golden["seed"].get<uint64_t>());
    auto ckpt = Checkpoint::open(model);
    ASSERT_TRUE(ckpt.is_ok()) << ckpt.status().to_string();
    std::unique_ptr<LlavaVisionEncoder> enc;
    std::unique_ptr<ModelRunner> runner;
    ASSERT_NO_FATAL_FAILURE(load_encoder_and_runner(*ckpt, 512, &enc, &runner));
    OfflineEngine engine(*runner);
    for (const json& c : golden["cases"]) {
      SCOPED_TRACE(c["image"].get<std::string>());
      auto pixels = pixels_of(model, c["image"].get<std::string>());
      ASSERT_TRUE(pixels.is_ok()) << pixels.status().to_string();
      const auto ref_px = c["pixel_values"].get<std::vector<float>>();
      ASSERT_EQ(ref_px.size(), pixels->data.size());
      for (size_t i = 0; i < ref_px.size(); ++i) {
        ASSERT_NEAR(pixels->data[i], ref_px[i], 1.0 / 255) << "pixel value " << i;
      }
      auto features = enc->vision_features(*pixels);
      ASSERT_TRUE(features.is_ok()) << features.status().to_string();
      EXPECT_LE(relative_error(*features, c["vision_features"].get<std::vector<float>>()), 1e-4);
      auto embeds = enc->project(*features);
      ASSERT_TRUE(embeds.is_ok());
      EXPECT_LE(relative_error(*embeds, c["image_embeddings"].get<std::vector<float>>()), 1e-4);
      GenerationRequest r;
      r.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
      for (size_t p = 0; p < r.prompt_ids.size(); ++p) {
        if (r.prompt_ids[p] == enc->config().image_token_id) {
          r.input_embedding_positions.push_back(static_cast<int32_t>(p));
        }
      }
      r.input_embeddings = std::move(embeds).value();
      r.max_new_tokens = static_cast<int32_t>(c["greedy_ids"].size());
      auto res = engine.generate({r});
      ASSERT_TRUE(res.is_ok()) << res.status().to_string();
      EXPECT_EQ((*res)[0].output_ids, c["greedy_ids"].get<std::vector<int32_t>>());
    }
  }
  if (n_files == 0) {
    GTEST_SKIP() << "no tests/golden/models/llava*.json yet: run tests/golden/make_golden.py "
                    "--presets llava-tiny on a machine with transformers";
  }
}

}  // namespace
}  // namespace litellama::vision
