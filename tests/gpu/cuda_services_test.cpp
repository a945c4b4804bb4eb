// The services on the CUDA backend: the scheduler, a CUDA worker and a tokenizer as processes over
// ZeroMQ. The worker computes in the dtype that --dtype auto picks (bfloat16 for this float32
// checkpoint), says so, and its greedy outputs equal those of a CUDA runner in this process with
// the same dtype, one request at a time (the same step shapes, hence the same kernels).
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <vector>

#include "common/proto/client_messages.h"
#include "services/worker/checkpoint.h"
#include "services/worker/offline_engine.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/integration/service_cluster.h"

namespace litellama {
namespace {

using testing::metric_value;
using testing::ServiceCluster;

// The ids of one request's stream, or an empty vector when it failed or timed out.
std::vector<int32_t> run_one(net::SchedulerClient& client, const proto::GenerateRequest& request) {
  auto id = client.submit(request);
  EXPECT_TRUE(id.is_ok());
  if (!id.is_ok()) return {};
  std::vector<int32_t> ids;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    auto event = client.next_event(100);
    if (!event.is_ok() || !*event || (*event)->request_id() != *id) continue;
    if ((*event)->kind == net::ClientEvent::Kind::kError) return {};
    const auto& chunk = (*event)->chunk;
    ids.insert(ids.end(), chunk.token_ids.begin(), chunk.token_ids.end());
    if (chunk.finished) return ids;
  }
  return {};
}

void serve_and_compare(const std::vector<std::string>& worker_args, DType expected_dtype) {
  ServiceCluster cluster;
  cluster.add_worker_args(worker_args);
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  auto client = cluster.client();
  auto info = client->server_info(5000);
  ASSERT_TRUE(info.is_ok()) << info.status().to_string();
  EXPECT_EQ(info->device, "cuda");
  EXPECT_EQ(info->dtype, dtype_torch_name(expected_dtype));

  auto ckpt = Checkpoint::open(cluster.model_dir());
  ASSERT_TRUE(ckpt.is_ok());
  RunnerOptions options;
  options.device = Device::kCuda;
  options.compute_dtype = expected_dtype;
  options.n_kv_slots = 4096;
  options.max_batch_tokens = 512;  // as ServiceCluster's worker: the same workspaces and kernels
  options.max_batch_seqs = 32;
  auto runner = create_model_runner(*ckpt, options);
  ASSERT_TRUE(runner.is_ok()) << runner.status().to_string();
  OfflineEngine engine(**runner);

  std::mt19937 rng(5);
  for (int i = 0; i < 3; ++i) {
    GenerationRequest reference;
    const int n_prompt = 1 + static_cast<int>(rng() % 200);
    for (int k = 0; k < n_prompt; ++k) {
      reference.prompt_ids.push_back(static_cast<int32_t>(rng() % 120000));
    }
    reference.max_new_tokens = 24;
    auto expected = engine.generate({reference});
    ASSERT_TRUE(expected.is_ok()) << expected.status().to_string();
    proto::GenerateRequest request;
    request.prompt_ids = reference.prompt_ids;
    request.max_tokens = reference.max_new_tokens;
    request.ignore_eos = true;
    const std::vector<int32_t> got = run_one(*client, request);
    ASSERT_EQ(got.size(), 24u) << "request " << i << "\n" << cluster.logs();
    EXPECT_EQ(got, (*expected)[0].output_ids) << "request " << i;
  }
  // The worker timed its steps on the device.
  const std::string m = cluster.worker_metrics();
  EXPECT_GT(metric_value(m, "litellama_worker_step_device_seconds_count"), 0);
  EXPECT_GT(metric_value(m, "litellama_worker_step_device_seconds_sum"), 0);
  // 24-token decodes of one sequence: most steps replay a captured graph.
  EXPECT_GT(metric_value(m, "litellama_worker_graph_steps_total{kind=\"replayed\"}"), 30);
  EXPECT_GE(metric_value(m, "litellama_worker_graph_steps_total{kind=\"captured\"}"), 1);
  // One sequence at a time shares no prefix: the cascade is exported and never ran.
  EXPECT_EQ(metric_value(m, "litellama_worker_cascade_steps_total"), 0);
}

TEST(CudaServices, AutoDtypeIsBfloat16AndOutputsMatchTheRunner) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  serve_and_compare({"--device", "cuda"}, DType::kBF16);
}

TEST(CudaServices, ExplicitFloat32IsKept) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  serve_and_compare({"--device", "cuda", "--dtype", "float32"}, DType::kF32);
}

}  // namespace
}  // namespace litellama
