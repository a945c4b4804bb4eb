// litellama-tokenizer: parses flags and runs one TokenizerService.
#include <fstream>
#include <iterator>

#include <CLI/CLI.hpp>

#include "common/cli_option.h"
#include "common/log.h"
#include "common/net/service_main.h"
#include "common/net/zmq_util.h"
#include "services/tokenizer/service/tokenizer_service.h"

int main(int argc, char** argv) {
  CLI::App app{"litellama-tokenizer: stateless encode and incremental detokenize"};
  litellama::TokenizerOptions options;
  std::string run_dir;  // add_common_service_flags sets the default
  std::string log_level = "info";
  app.add_option("--model", options.tokenizer_dir,
                 "Model (or tokenizer) directory with tokenizer.json")
      ->required();
  app.add_option("--scheduler", options.scheduler_endpoint,
                 "The scheduler's tokenizer endpoint (default ipc://RUN_DIR/tokenizer.sock)");
  litellama::add_bounded_option(
      app, "--max-prompt-bytes", options.max_prompt_bytes,
      "Largest text to encode in bytes (after the chat template); larger is refused", int64_t{1},
      int64_t{15} << 20);
  std::string chat_template_file;
  app.add_option("--chat-template", chat_template_file,
                 "Jinja chat template file used instead of the tokenizer's own")
      ->check(CLI::ExistingFile);
  litellama::net::add_common_service_flags(app, options, run_dir, log_level, "127.0.0.1:9402",
                                           "The scheduler silent this long is down");
  CLI11_PARSE(app, argc, argv);

  litellama::init_logging("tokenizer", log_level);
  if (options.scheduler_endpoint.empty()) {
    options.scheduler_endpoint = litellama::net::ipc_endpoint(run_dir, "tokenizer");
  }
  if (!chat_template_file.empty()) {
    std::ifstream in(chat_template_file, std::ios::binary);
    options.chat_template.assign(std::istreambuf_iterator<char>(in), {});
    if (!in.good() && !in.eof()) {
      LITELLAMA_LOG_ERROR("--chat-template {}: cannot read it", chat_template_file);
      return litellama::net::kExitConfigError;
    }
  }
  litellama::TokenizerService service(options);
  return litellama::net::run_service(service);
}
