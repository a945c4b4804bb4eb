// litellama-worker: parses flags and runs the WorkerService.
#include <CLI/CLI.hpp>

#include "common/cli_option.h"
#include "common/log.h"
#include "common/net/service_main.h"
#include "common/net/zmq_util.h"
#include "services/worker/service/worker_service.h"

int main(int argc, char** argv) {
  CLI::App app{"litellama-worker: owns the device, runs prefill/decode steps, samples"};
  litellama::WorkerOptions options;
  std::string run_dir;  // add_common_service_flags sets the default
  std::string device = "cpu";
  std::string log_level = "info";
  app.add_option("--model", options.model_dir, "Hugging Face model directory")->required();
  app.add_option("--device", device, "cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--dtype", options.dtype,
                 "compute dtype: auto (cpu: float32; cuda: the checkpoint's bfloat16 or float16, "
                 "bfloat16 for float32 checkpoints), float32, bfloat16 or float16")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16"}));
  app.add_option("--scheduler", options.scheduler_endpoint,
                 "The scheduler's worker endpoint (default ipc://RUN_DIR/worker.sock)");
  litellama::add_bounded_option(
      app, "--kv-slots", options.runner.n_kv_slots,
      "KV pool size in tokens (0: cuda: from free memory; cpu: four of the model's "
      "contexts, at most 1 GiB, mapped on first use)",
      0, 1 << 28);
  litellama::add_bounded_option(app, "--kv-cache-bytes", options.runner.kv_memory_bytes,
                                "cpu, --kv-slots 0: the most memory the KV pool takes",
                                int64_t{1} << 20, int64_t{1} << 40);
  litellama::add_bounded_option(
      app, "--gpu-memory-utilization", options.runner.gpu_memory_utilization,
      "cuda, --kv-slots 0: share of the device's total memory for weights, KV and "
      "workspaces, as vLLM's (0: 85% of the memory free after loading)",
      0.0, 1.0);
  litellama::add_bounded_option(
      app, "--reserve-device-bytes", options.runner.reserve_device_bytes,
      "cuda, --kv-slots 0: device memory left to another process on the GPU (the vision "
      "service), started before or after this one; sizes the KV pool against the device's total "
      "memory (--gpu-memory-utilization, 0.9 when unset)",
      int64_t{0}, int64_t{1} << 42);
  litellama::add_bounded_option(
      app, "--max-model-len", options.runner.max_model_len,
      "longest sequence served; sizes the cpu's default KV pool (0: the model's)", int64_t{0},
      int64_t{1} << 30);
  app.add_option("--threads", options.runner.n_threads, "CPU threads (0: all)")
      ->capture_default_str();
  litellama::add_bounded_option(app, "--max-batch-tokens", options.runner.max_batch_tokens,
                                "Tokens per step", 1, 1 << 20);
  litellama::add_bounded_option(app, "--max-batch-seqs", options.runner.max_batch_seqs,
                                "Sequences per step", 1, 1 << 16);
  app.add_option("--step-ring", options.step_ring_name,
                 "Shared-memory name of the step ring (default litellama-step-PID-RANDOM)");
  litellama::net::add_common_service_flags(app, options, run_dir, log_level, "127.0.0.1:9401",
                                           "The scheduler silent this long is down");
  CLI11_PARSE(app, argc, argv);

  litellama::init_logging("worker", log_level);
  options.runner.device = device == "cuda" ? litellama::Device::kCuda : litellama::Device::kCpu;
  if (options.scheduler_endpoint.empty()) {
    options.scheduler_endpoint = litellama::net::ipc_endpoint(run_dir, "worker");
  }
  litellama::WorkerService service(options);
  return litellama::net::run_service(service);
}
