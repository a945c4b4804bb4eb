// litellama make-model: writes a random checkpoint of a named preset in Hugging Face layout.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "services/worker/random_checkpoint.h"

namespace litellama::cli {

namespace {

struct MakeModelArgs {
  std::string preset;
  std::string out;
  uint64_t seed = 0;
  std::string dtype;
  int32_t shards = 1;
  std::string tokenizer_dir;
  bool no_tokenizer = false;
  bool list = false;
};

int run_make_model(const MakeModelArgs& a) {
  const char* cmd = "make-model";
  if (a.list) {
    for (const auto& p : random_checkpoint_presets()) {
      std::printf("%-20s %s\n", p.name.c_str(), p.description.c_str());
    }
    return 0;
  }
  if (a.preset.empty() || a.out.empty()) {
    return fail(cmd, Status(StatusCode::kInvalidArgument, "--preset and --out are required"));
  }
  auto preset = find_random_checkpoint_preset(a.preset);
  if (!preset.is_ok()) return fail(cmd, preset.status());
  const bool tiny =
      preset->name.size() > 5 && preset->name.compare(preset->name.size() - 5, 5, "-tiny") == 0;
  const std::string dtype_name = !a.dtype.empty() ? a.dtype : (tiny ? "float32" : "bfloat16");
  auto dtype = dtype_from_torch_name(dtype_name);
  if (!dtype) {
    return fail(cmd, make_error(StatusCode::kInvalidArgument, "unknown --dtype '{}'", dtype_name));
  }
  RandomCheckpointOptions options;
  options.seed = a.seed;
  options.storage_dtype = *dtype;
  options.n_shards = a.shards;
  options.tokenizer_dir = a.tokenizer_dir;
  if (a.no_tokenizer) {
    options.tokenizer_dir.clear();
  } else if (options.tokenizer_dir.empty() && !preset->tokenizer.empty()) {
    const auto tok = std::filesystem::path(assets_dir()) / "tokenizers" / preset->tokenizer;
    if (std::filesystem::exists(tok / "tokenizer.json")) options.tokenizer_dir = tok.string();
  }
  Status st = write_random_checkpoint(a.out, preset->config, options);
  if (!st.is_ok()) return fail(cmd, st);
  std::fprintf(stderr, "make-model: wrote %s (%s, seed %llu, %s%s)\n", a.out.c_str(),
               preset->name.c_str(), static_cast<unsigned long long>(a.seed), dtype_name.c_str(),
               options.tokenizer_dir.empty() ? ", no tokenizer" : "");
  return 0;
}

}  // namespace

CommandMain register_make_model_command(CLI::App& app) {
  auto args = std::make_shared<MakeModelArgs>();
  CLI::App* sub = app.add_subcommand(
      "make-model", "Write a random-weight checkpoint (Hugging Face layout) from a preset");
  sub->add_option("--preset", args->preset, "preset name (see --list)");
  sub->add_option("--out", args->out, "output directory");
  sub->add_option("--seed", args->seed, "weight seed")->capture_default_str();
  sub->add_option("--dtype", args->dtype,
                  "storage dtype (default: float32 for *-tiny presets, else bfloat16)");
  sub->add_option("--shards", args->shards, "number of safetensors shards")
      ->check(CLI::Range(1, 64));
  sub->add_option("--tokenizer-dir", args->tokenizer_dir,
                  "copy tokenizer files from here (default: the preset's, from assets/)");
  sub->add_flag("--no-tokenizer", args->no_tokenizer, "write no tokenizer files");
  sub->add_flag("--list", args->list, "list the presets");
  return [args]() { return run_make_model(*args); };
}

}  // namespace litellama::cli
