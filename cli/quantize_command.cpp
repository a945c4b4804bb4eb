// litellama quantize: writes a quantized copy of an unquantized Hugging Face checkpoint.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/mapped_file.h"
#include "services/worker/quantize.h"
#ifdef LITELLAMA_WITH_TOKENIZER
#include "services/tokenizer/tokenizer.h"
#endif

namespace litellama::cli {

namespace {

struct QuantizeArgs {
  std::string method;
  int32_t group_size = 128;
  std::string calibration;
  int32_t calibration_tokens = 4096;
  int32_t sequence_length = 512;
  std::string in_dir, out_dir;
};

// The calibration text encoded with the model's tokenizer, cut into sequences of at most
// `length` tokens, `total` tokens in all.
Result<std::vector<std::vector<int32_t>>> calibration_sequences(const QuantizeArgs& a) {
#ifdef LITELLAMA_WITH_TOKENIZER
  LITELLAMA_ASSIGN_OR_RETURN(std::string text, read_text_file(a.calibration));
  LITELLAMA_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::load(a.in_dir));
  const std::vector<int32_t> ids = tokenizer.encode(text, /*add_special_tokens=*/false);
  if (ids.empty()) {
    return make_error(StatusCode::kInvalidArgument, "--calibration '{}' holds no text",
                      a.calibration);
  }
  std::vector<std::vector<int32_t>> sequences;
  const size_t total = std::min(ids.size(), static_cast<size_t>(a.calibration_tokens));
  for (size_t start = 0; start < total; start += static_cast<size_t>(a.sequence_length)) {
    const size_t end = std::min(total, start + static_cast<size_t>(a.sequence_length));
    sequences.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(start),
                           ids.begin() + static_cast<std::ptrdiff_t>(end));
  }
  return sequences;
#else
  (void)a;
  return make_error(StatusCode::kUnsupported, "this build has no tokenizer for --calibration");
#endif
}

int run_quantize(const QuantizeArgs& a) {
  const char* cmd = "quantize";
  auto method = quantize_method_from_name(a.method);
  if (!method.is_ok()) return fail(cmd, method.status());
  QuantizeOptions options;
  options.method = *method;
  options.group_size = a.group_size;
  if (!a.calibration.empty()) {
    auto sequences = calibration_sequences(a);
    if (!sequences.is_ok()) return fail(cmd, sequences.status());
    options.calibration_ids = std::move(sequences).value();
  }
  auto report = quantize_checkpoint(a.in_dir, a.out_dir, options);
  if (!report.is_ok()) return fail(cmd, report.status());
  std::fprintf(stderr,
               "quantize: wrote %s (%s): %d projections quantized, %.1f MiB -> %.1f MiB, largest "
               "weight error %.3g\n",
               a.out_dir.c_str(), a.method.c_str(), report->modules,
               static_cast<double>(report->bytes_in) / (1 << 20),
               static_cast<double>(report->bytes_out) / (1 << 20), report->max_abs_error);
  return 0;
}

}  // namespace

CommandMain register_quantize_command(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* sub = app.add_subcommand(
      "quantize", "Write a quantized copy of a checkpoint (AWQ, GPTQ round-to-nearest, FP8, W8A8)");
  sub->add_option("--method", args->method,
                  "awq (4-bit, AutoAWQ GEMM layout), gptq-rtn (4-bit, GPTQ layout), fp8 (e4m3) "
                  "or w8a8 (int8 with SmoothQuant); awq and w8a8 need --calibration")
      ->required();
  sub->add_option("--group-size", args->group_size,
                  "awq, gptq-rtn: input rows per scale group (-1: one group per output channel)")
      ->capture_default_str()
      ->check([](const std::string& v) -> std::string {
        try {
          const int g = std::stoi(v);
          return g == -1 || g > 0 ? "" : "must be positive or -1";
        } catch (const std::exception&) {
          return "must be an integer";
        }
      });
  sub->add_option("--calibration", args->calibration,
                  "text file to calibrate over (awq, w8a8), encoded with IN_DIR's tokenizer")
      ->check(CLI::ExistingFile);
  sub->add_option("--calibration-tokens", args->calibration_tokens,
                  "tokens of the calibration text to use")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  sub->add_option("--calibration-sequence-length", args->sequence_length,
                  "tokens per calibration sequence")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("IN_DIR", args->in_dir, "unquantized checkpoint directory")->required();
  sub->add_option("OUT_DIR", args->out_dir, "directory to write the quantized checkpoint to")
      ->required();
  return [args]() { return run_quantize(*args); };
}

}  // namespace litellama::cli
