// litellama generate: offline generation with the in-process engine. A LLaVA prompt's --image
// files are encoded here (decode, CLIP preprocessing, tower and projector on the CPU, as the
// vision service does) and their rows take the places of the prompt's image tokens.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/generate_remote.h"
#include "common/cli_option.h"
#include "common/image_token_runs.h"
#include "services/vision/clip_preprocess.h"
#include "services/vision/image_decode.h"
#include "services/vision/llava_vision_encoder.h"
#include "services/worker/checkpoint.h"
#include "services/worker/offline_engine.h"
#ifdef LITELLAMA_WITH_TOKENIZER
#include "services/tokenizer/tokenizer.h"
#endif

namespace litellama::cli {

namespace {

// The request's fields are those of the served path (--server), which gets them as they are.
struct GenerateArgs : RemoteGenerateArgs {
  std::string model;
  std::string device = "cpu";
  std::string dtype;
  bool prompt_given = false;  // --prompt appeared, possibly empty
  int32_t kv_slots = 0;
  double kv_memory_fraction = 0.85;
  int32_t threads = 0;
};

// The rows of each image, in order, as the vision service computes them:
// [n_images * n_image_tokens, text hidden].
Result<std::vector<float>> encode_images(const Checkpoint& ckpt, const std::string& model_dir,
                                         const std::vector<std::string>& paths, int32_t n_threads) {
  LITELLAMA_ASSIGN_OR_RETURN(auto encoder, vision::LlavaVisionEncoder::load(ckpt, n_threads));
  LITELLAMA_ASSIGN_OR_RETURN(vision::ClipPreprocessConfig config,
                             vision::load_clip_preprocess_config(model_dir));
  std::vector<float> rows;
  for (const std::string& path : paths) {
    LITELLAMA_ASSIGN_OR_RETURN(std::string bytes, read_image_file(path));
    auto image = vision::decode_image(
        std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    if (!image) {
      return make_error(image.status().code(), "--image {}: {}", path, image.status().message());
    }
    auto pixels = vision::clip_preprocess(*image, config);
    if (!pixels) {
      return make_error(pixels.status().code(), "--image {}: {}", path, pixels.status().message());
    }
    LITELLAMA_ASSIGN_OR_RETURN(std::vector<float> one, encoder->encode(*pixels));
    rows.insert(rows.end(), one.begin(), one.end());
  }
  return rows;
}

int run_generate(const GenerateArgs& a) {
  const char* cmd = "generate";
  if (a.prompt_given && a.prompt.empty()) {
    return fail(cmd, Status(StatusCode::kInvalidArgument, "--prompt is empty"));
  }
  if (a.input_ids.empty() == a.prompt.empty()) {
    return fail(
        cmd, Status(StatusCode::kInvalidArgument, "give exactly one of --input-ids and --prompt"));
  }
  std::string model_dir = a.model;
  if (model_dir.empty()) {
    auto dir = default_model_dir();
    if (!dir.is_ok()) return fail(cmd, dir.status());
    model_dir = *dir;
  }
  auto ckpt = Checkpoint::open(model_dir);
  if (!ckpt.is_ok()) return fail(cmd, ckpt.status());

  RunnerOptions options;
  if (a.device == "cpu") {
    options.device = Device::kCpu;
  } else if (a.device == "cuda") {
    options.device = Device::kCuda;
  } else {
    return fail(cmd, make_error(StatusCode::kInvalidArgument, "unknown --device '{}' (cpu or cuda)",
                                a.device));
  }
  auto dtype = resolve_compute_dtype(options.device, a.dtype, ckpt->config().torch_dtype);
  if (!dtype.is_ok()) return fail(cmd, dtype.status());
  options.compute_dtype = *dtype;
  options.n_threads = a.threads;
  options.kv_memory_fraction = a.kv_memory_fraction;

  GenerationRequest req;
  std::vector<int32_t> eos = ckpt->config().eos_token_ids;
#ifdef LITELLAMA_WITH_TOKENIZER
  std::unique_ptr<Tokenizer> tokenizer;
  if (std::filesystem::exists(std::filesystem::path(model_dir) / "tokenizer.json")) {
    auto tok = Tokenizer::load(model_dir);
    if (!tok.is_ok()) return fail(cmd, tok.status());
    tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
    for (int32_t id : tokenizer->eos_token_ids()) {
      if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
    }
  }
#endif
  if (!a.input_ids.empty()) {
    auto ids = parse_id_list(a.input_ids);
    if (!ids.is_ok()) return fail(cmd, ids.status());
    req.prompt_ids = std::move(ids).value();
  } else {
#ifdef LITELLAMA_WITH_TOKENIZER
    if (!tokenizer) {
      return fail(
          cmd, make_error(StatusCode::kNotFound,
                          "--prompt needs tokenizer.json in the model directory '{}'", model_dir));
    }
    std::string text = a.prompt;
    if (a.chat) {
      auto rendered = tokenizer->apply_chat_template({{"user", a.prompt}}, true);
      if (!rendered.is_ok()) return fail(cmd, rendered.status());
      text = std::move(rendered).value();
      req.prompt_ids = tokenizer->encode(text, /*add_special_tokens=*/false);
    } else {
      req.prompt_ids = tokenizer->encode(text, /*add_special_tokens=*/true);
    }
#else
    return fail(cmd, Status(StatusCode::kUnsupported,
                            "this build has no tokenizer: use "
                            "--input-ids"));
#endif
  }
  if (req.prompt_ids.empty()) {
    return fail(cmd, Status(StatusCode::kInvalidArgument, "the prompt encodes to no tokens"));
  }
  // Images: each is one image token of the prompt (expanded here to the image's token count) or
  // a run of exactly that count, as the server takes them.
  if (!a.images.empty()) {
    const LlavaConfig* llava = ckpt->llava();
    if (llava == nullptr) {
      return fail(cmd, make_error(StatusCode::kInvalidArgument,
                                  "--image needs a LLaVA checkpoint (a config.json with "
                                  "vision_config); '{}' is not one",
                                  model_dir));
    }
    auto runs = expand_image_token_runs(req.prompt_ids, llava->image_token_id,
                                        llava->n_image_tokens(), a.images.size());
    if (!runs) {
      return fail(cmd, runs.status());
    }
    req.prompt_ids = std::move(runs->prompt_ids);
    for (int32_t first : runs->image_positions) {
      for (int32_t k = 0; k < llava->n_image_tokens(); ++k) {
        req.input_embedding_positions.push_back(first + k);
      }
    }
  }
  // The same bound as the served path's admission (ContinuousBatcher::plan).
  if (const int64_t context = ckpt->config().max_position_embeddings; context > 0) {
    const int64_t need = static_cast<int64_t>(req.prompt_ids.size()) + a.max_new_tokens;
    if (need > context) {
      return fail(
          cmd, make_error(StatusCode::kInvalidArgument,
                          "the prompt ({} tokens) + --max-new-tokens ({}) = {} exceeds the "
                          "model's context of {} tokens by {}",
                          req.prompt_ids.size(), a.max_new_tokens, need, context, need - context));
    }
  }
  req.sampling = a.sampling;
  req.max_new_tokens = a.max_new_tokens;
  req.n_top_logits = a.top_logits;
  if (!a.ignore_eos) req.stop_token_ids = eos;
  if (!a.stop_token_ids.empty()) {
    auto ids = parse_id_list(a.stop_token_ids);
    if (!ids.is_ok()) return fail(cmd, ids.status());
    req.stop_token_ids.insert(req.stop_token_ids.end(), ids->begin(), ids->end());
  }
  // Exactly enough KV for this request unless told otherwise.
  options.n_kv_slots =
      a.kv_slots > 0 ? a.kv_slots
                     : static_cast<int32_t>(req.prompt_ids.size()) + std::max(a.max_new_tokens, 1);
  options.max_batch_tokens = std::max<int32_t>(8192, static_cast<int32_t>(req.prompt_ids.size()));
  auto runner = create_model_runner(*ckpt, options);
  if (!runner.is_ok()) return fail(cmd, runner.status());
  if (!a.images.empty()) {
    if (!(*runner)->supports_input_embeddings(EmbeddingMemory::kHost)) {
      return fail(cmd, make_error(StatusCode::kUnsupported,
                                  "--image runs in process on the CPU backend only: the {} "
                                  "runner does not read image rows from host memory (use "
                                  "--device cpu, or --server with litellama serve)",
                                  a.device));
    }
    auto rows = encode_images(*ckpt, model_dir, a.images, a.threads);
    if (!rows.is_ok()) return fail(cmd, rows.status());
    req.input_embeddings = std::move(rows).value();
  }

  OfflineEngine engine(**runner);
  const auto t0 = std::chrono::steady_clock::now();
  auto results = engine.generate({req});
  const auto t1 = std::chrono::steady_clock::now();
  if (!results.is_ok()) return fail(cmd, results.status());
  const GenerationResult& r = results->front();
  const double seconds = std::chrono::duration<double>(t1 - t0).count();

  std::string text;
#ifdef LITELLAMA_WITH_TOKENIZER
  if (tokenizer) text = tokenizer->decode(r.output_ids, /*skip_special_tokens=*/true);
#endif
  if (a.json) {
    nlohmann::json j;
    j["output_ids"] = r.output_ids;
    j["finish_reason"] = finish_reason_name(r.finish_reason);
    j["n_prompt_tokens"] = req.prompt_ids.size();
    if (a.top_logits > 0) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [id, value] : r.top_logits) top.push_back({id, value});
      j["top_logits"] = top;
    }
#ifdef LITELLAMA_WITH_TOKENIZER
    if (tokenizer) j["text"] = text;
#endif
    j["seconds"] = seconds;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
#ifdef LITELLAMA_WITH_TOKENIZER
    if (tokenizer) {
      std::printf("%s\n", text.c_str());
      return 0;
    }
#endif
    for (size_t i = 0; i < r.output_ids.size(); ++i) {
      std::printf("%s%d", i ? "," : "", r.output_ids[i]);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

CommandMain register_generate_command(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate tokens for one prompt");
  sub->add_option("--model", args->model,
                  "Hugging Face model directory (default: the embedded random default model)");
  sub->add_option("--device", args->device, "cpu or cuda")->capture_default_str();
  sub->add_option("--dtype", args->dtype,
                  "compute dtype: auto (cpu: float32; cuda: bfloat16, or float16 for float16 "
                  "checkpoints), float32, bfloat16 or float16");
  sub->add_option("--input-ids", args->input_ids, "prompt token ids, comma-separated");
  CLI::Option* prompt_option =
      sub->add_option("--prompt", args->prompt, "prompt text (encoded with the model's tokenizer)");
  sub->add_flag("--chat", args->chat, "wrap --prompt in the model's chat template as a user turn");
  add_bounded_option(*sub, "--max-new-tokens", args->max_new_tokens, "tokens to generate", 1,
                     1 << 20);
  add_bounded_option(*sub, "--temperature", args->sampling.temperature, "0 = greedy", 0.0f, 100.0f);
  sub->add_option("--top-k", args->sampling.top_k, "0 = off")->check(non_negative("off"));
  sub->add_option("--top-p", args->sampling.top_p, "1 = off")
      ->check(CLI::Range(0.0f, 1.0f) & CLI::PositiveNumber);
  sub->add_option("--min-p", args->sampling.min_p, "0 = off")->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--repetition-penalty", args->sampling.repetition_penalty, "1 = off")
      ->check(CLI::PositiveNumber);
  sub->add_option("--frequency-penalty", args->sampling.frequency_penalty, "0 = off");
  sub->add_option("--presence-penalty", args->sampling.presence_penalty, "0 = off");
  sub->add_option("--seed", args->sampling.seed, "sampling seed");
  sub->add_option("--stop-token-ids", args->stop_token_ids, "extra stop ids, comma-separated");
  sub->add_flag("--ignore-eos", args->ignore_eos, "do not stop at the model's EOS ids");
  sub->add_option("--top-logits", args->top_logits,
                  "report the K largest raw logits of the first generated position")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--json", args->json, "print one JSON object");
  sub->add_option("--kv-slots", args->kv_slots, "KV pool size in tokens (default: just enough)");
  sub->add_option("--kv-memory-fraction", args->kv_memory_fraction,
                  "cuda: share of free device memory for the KV pool")
      ->check(CLI::Range(0.01, 0.99));
  sub->add_option("--threads", args->threads, "cpu: worker threads (default: all)");
  sub->add_option("--server", args->server,
                  "send the request to a running scheduler (litellama serve) at ADDR");
  sub->add_option("--priority", args->priority,
                  "with --server: scheduling priority (larger is served first; default 0)");
  sub->add_option("--image", args->images,
                  "an image file (JPEG/PNG) for a LLaVA prompt, once per image token of "
                  "--input-ids or <image> of --prompt (one token, or already expanded to the "
                  "image's token count), in order; in process on the CPU backend, or with "
                  "--server encoded by its vision service");
  return [args, prompt_option]() {
    args->prompt_given = prompt_option->count() > 0;
    if (!args->server.empty()) return run_generate_remote(*args);
    return run_generate(*args);
  };
}

}  // namespace litellama::cli
