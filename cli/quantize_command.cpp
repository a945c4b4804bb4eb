// litellama quantize: writes a quantized copy of an unquantized Hugging Face checkpoint.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "services/worker/quantize.h"

namespace litellama::cli {

namespace {

struct QuantizeArgs {
  std::string method;
  int32_t group_size = 128;
  std::string calibration;
  std::string in_dir, out_dir;
};

int run_quantize(const QuantizeArgs& a) {
  const char* cmd = "quantize";
  auto method = quantize_method_from_name(a.method);
  if (!method.is_ok()) return fail(cmd, method.status());
  QuantizeOptions options;
  options.method = *method;
  options.group_size = a.group_size;
  options.calibration_path = a.calibration;
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
      "quantize", "Write a quantized copy of a checkpoint (GPTQ round-to-nearest or FP8)");
  sub->add_option("--method", args->method,
                  "gptq-rtn (4-bit, GPTQ layout) or fp8 (e4m3, per-channel scales); awq and w8a8 "
                  "are not available yet")
      ->required();
  sub->add_option("--group-size", args->group_size,
                  "gptq-rtn: input rows per scale group (-1: one group per output channel)")
      ->capture_default_str()
      ->check([](const std::string& v) -> std::string {
        try {
          const int g = std::stoi(v);
          return g == -1 || g > 0 ? "" : "must be positive or -1";
        } catch (const std::exception&) {
          return "must be an integer";
        }
      });
  sub->add_option("--calibration", args->calibration, "text file to calibrate over (awq, w8a8)")
      ->check(CLI::ExistingFile);
  sub->add_option("IN_DIR", args->in_dir, "unquantized checkpoint directory")->required();
  sub->add_option("OUT_DIR", args->out_dir, "directory to write the quantized checkpoint to")
      ->required();
  return [args]() { return run_quantize(*args); };
}

}  // namespace litellama::cli
