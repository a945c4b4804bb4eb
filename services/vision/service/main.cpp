// litellama-vision: parses flags and runs one VisionService.
#include <CLI/CLI.hpp>

#include "common/cli_option.h"
#include "common/log.h"
#include "common/net/service_main.h"
#include "common/net/zmq_util.h"
#include "services/vision/service/vision_service.h"

int main(int argc, char** argv) {
  CLI::App app{"litellama-vision: encodes images into the embedding pool the worker reads"};
  litellama::VisionOptions options;
  std::string run_dir;  // add_common_service_flags sets the default
  std::string log_level = "info";
  app.add_option("--model", options.model_dir, "LLaVA checkpoint directory")->required();
  app.add_option("--scheduler", options.scheduler_endpoint,
                 "The scheduler's vision endpoint (default ipc://RUN_DIR/vision.sock)");
  app.add_option("--device", options.device,
                 "cpu (shared-memory pool) or cuda (device pool shared with the worker through "
                 "CUDA IPC)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", options.dtype,
                 "cuda: the tower's compute dtype (auto: as the worker's, float16 for float16 "
                 "checkpoints, else bfloat16)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16"}));
  litellama::add_bounded_option(app, "--max-image-bytes", options.max_image_bytes,
                                "Largest image accepted, in bytes", int64_t{1}, int64_t{1} << 30);
  litellama::add_bounded_option(app, "--vision-pool-bytes", options.pool_bytes,
                                "Size of the embedding pool (whole image slots, at least one)",
                                int64_t{1}, int64_t{1} << 40);
  app.add_option("--pool-name", options.pool_name,
                 "Shared-memory name of the pool (default: one per process start)");
  app.add_flag("--pad-to-square", options.pad_to_square,
               "Pad images to a square of the mean colour before preprocessing (the original "
               "LLaVA's expand2square)");
  litellama::add_bounded_option(app, "--threads", options.n_threads,
                                "Encoder threads (0: all hardware threads)", 0, 1024);
  litellama::net::add_common_service_flags(app, options, run_dir, log_level, "127.0.0.1:9409",
                                           "The scheduler silent this long is down");
  CLI11_PARSE(app, argc, argv);

  litellama::init_logging("vision", log_level);
  if (options.scheduler_endpoint.empty()) {
    options.scheduler_endpoint = litellama::net::ipc_endpoint(run_dir, "vision");
  }
  litellama::VisionService service(options);
  return litellama::net::run_service(service);
}
