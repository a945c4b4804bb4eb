// LLaVA on the GPU. The device vision tower and projector against the CPU encoder (float32 within
// 1e-4 of the output's scale, bf16 within bf16's rounding), and images through the services with
// litellama-vision and the worker both on CUDA: the worker maps the vision process's device pool
// (CUDA IPC) and reads the rows in place; greedy ids equal the CPU in-process engine's in float32;
// a repeated image is not encoded again; the vision process killed and started anew, the same
// worker process maps the new pool and answers as before.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "kernels/linear.h"
#include "kernels/vision_ops.h"
#include "services/vision/clip_preprocess.h"
#include "services/vision/cuda/cuda_vision_encoder.h"
#include "services/vision/image_decode.h"
#include "services/vision/llava_vision_encoder.h"
#include "services/worker/checkpoint.h"
#include "services/worker/cuda/cuda_context.h"
#include "services/worker/cuda/device_buffer.h"
#include "services/worker/model_runner.h"
#include "services/worker/offline_engine.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/integration/service_cluster.h"
#include "tests/vision/llava_engine_answer.h"

namespace litellama {
namespace {

using testing::ServiceCluster;

std::string read_image(const std::string& name) {
  std::ifstream in(testing::env_or("LITELLAMA_SOURCE_DIR", ".") + "/tests/golden/images/" + name,
                   std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

vision::PixelValues pixels_of(const std::string& model, const std::string& image) {
  auto config = vision::load_clip_preprocess_config(model);
  auto rgb =
      vision::decode_image(std::span(reinterpret_cast<const uint8_t*>(image.data()), image.size()));
  EXPECT_TRUE(config.is_ok() && rgb.is_ok());
  auto pixels = vision::clip_preprocess(*rgb, *config);
  EXPECT_TRUE(pixels.is_ok());
  return std::move(pixels).value();
}

// Largest |got - want| over the largest |want|.
double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// The llava-tiny checkpoint, written into the cluster's model directory and opened.
void open_tiny_llava(ServiceCluster& cluster, std::optional<Checkpoint>* ckpt) {
  cluster.use_preset("llava-tiny");
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  auto opened = Checkpoint::open(cluster.model_dir());
  ASSERT_TRUE(opened.is_ok()) << opened.status().to_string();
  ckpt->emplace(std::move(opened).value());
}

TEST(CudaVision, TowerAndProjectorMatchTheCpuEncoder) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  ServiceCluster cluster;
  std::optional<Checkpoint> ckpt;
  ASSERT_NO_FATAL_FAILURE(open_tiny_llava(cluster, &ckpt));
  auto cpu = vision::LlavaVisionEncoder::load(*ckpt, 2);
  ASSERT_TRUE(cpu.is_ok());
  for (const char* image : {"rgb_37x23.png", "gray_29x40.jpg"}) {
    const vision::PixelValues pixels = pixels_of(cluster.model_dir(), read_image(image));
    auto want_features = (*cpu)->vision_features(pixels);
    auto want_rows = (*cpu)->encode(pixels);
    ASSERT_TRUE(want_features.is_ok() && want_rows.is_ok());
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(image) + " " + dtype_torch_name(dtype));
      auto gpu = vision::CudaVisionEncoder::load(*ckpt, dtype);
      ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
      auto features = (*gpu)->vision_features(pixels);
      auto rows = (*gpu)->encode(pixels);
      ASSERT_TRUE(features.is_ok()) << features.status().to_string();
      ASSERT_TRUE(rows.is_ok()) << rows.status().to_string();
      // bf16: a few roundings of 2^-8 relative each through three layers and the projector.
      const double tolerance = dtype == DType::kF32 ? 1e-4 : 4e-2;
      EXPECT_LT(relative_error(*features, *want_features), tolerance);
      EXPECT_LT(relative_error(*rows, *want_rows), tolerance);
      EXPECT_GT((*gpu)->last_device_seconds(), 0.0);
    }
  }
  // Pixel values of another size are refused, not read out of bounds.
  auto gpu = vision::CudaVisionEncoder::load(*ckpt, DType::kF32);
  ASSERT_TRUE(gpu.is_ok());
  vision::PixelValues wrong;
  wrong.height = wrong.width = 12;
  wrong.data.assign(3 * 12 * 12, 0.0f);
  EXPECT_EQ((*gpu)->encode(wrong).status().code(), StatusCode::kInvalidArgument);
}

// The device preprocessing (uint8 passes and value tables on the GPU) writes the patch rows the
// host's clip_preprocess + flatten_patches give, bit for bit in float32 and after the same bf16
// rounding, over images of every kind and the preprocessing options that change its passes.
TEST(CudaVision, DevicePreprocessingIsTheHostsBitForBit) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  ServiceCluster cluster;
  std::optional<Checkpoint> ckpt;
  ASSERT_NO_FATAL_FAILURE(open_tiny_llava(cluster, &ckpt));
  auto base = vision::load_clip_preprocess_config(cluster.model_dir());
  ASSERT_TRUE(base.is_ok());
  const int32_t side = ckpt->llava()->vision.image_size;
  const int32_t patch = ckpt->llava()->vision.patch_size;

  std::vector<std::pair<std::string, vision::RgbImage>> images;
  for (const char* name : {"rgb_37x23.png", "gray_29x40.jpg", "rgb_400x300.jpg", "cmyk_20x16.jpg",
                           "palette_33x21.png", "rgba_19x41.png", "bilevel_13x9.png"}) {
    const std::string bytes = read_image(name);
    auto rgb = vision::decode_image(
        std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    ASSERT_TRUE(rgb.is_ok()) << name;
    images.emplace_back(name, std::move(rgb).value());
  }
  // Noise, where every weight of every tap shows: a strong downscale, a tall sliver, and one past
  // kVisionDevicePreprocessPixels (preprocessed on the host by the same encoder call).
  uint32_t seed = 7;
  auto noise = [&](int32_t w, int32_t h) {
    vision::RgbImage img;
    img.width = w;
    img.height = h;
    img.pixels.resize(static_cast<size_t>(w) * h * 3);
    for (uint8_t& b : img.pixels) {
      seed = seed * 1664525u + 1013904223u;
      b = static_cast<uint8_t>(seed >> 24);
    }
    return img;
  };
  images.emplace_back("noise 1024x768", noise(1024, 768));
  images.emplace_back("noise 31x500", noise(31, 500));
  images.emplace_back("noise 4200x4100", noise(4200, 4100));

  std::vector<std::pair<std::string, vision::ClipPreprocessConfig>> configs;
  configs.emplace_back("checkpoint's", *base);
  for (const auto r : {vision::Resample::kLanczos, vision::Resample::kBilinear,
                       vision::Resample::kBox, vision::Resample::kHamming}) {
    vision::ClipPreprocessConfig c = *base;
    c.resample = r;
    configs.emplace_back("resample " + std::to_string(static_cast<int>(r)), c);
  }
  {
    vision::ClipPreprocessConfig c = *base;
    c.pad_to_square = true;
    configs.emplace_back("pad to square", c);
    c = *base;
    c.shortest_edge = side - 7;  // smaller than the crop: zero padding
    configs.emplace_back("crop larger than the image", c);
    c = *base;
    c.resize_height = side;
    c.resize_width = side;
    c.do_center_crop = false;
    configs.emplace_back("exact size, no crop", c);
    c = *base;
    c.do_resize = false;
    configs.emplace_back("crop only", c);
    c = *base;
    c.do_normalize = false;
    c.do_rescale = false;
    configs.emplace_back("raw bytes", c);
  }
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    auto gpu = vision::CudaVisionEncoder::load(*ckpt, dtype);
    ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
    for (const auto& [image_name, image] : images) {
      for (const auto& [config_name, config] : configs) {
        // The host's passes over the largest image take seconds: its configuration alone.
        if (image.width * image.height > (1 << 22) && &config != &configs.front().second) break;
        SCOPED_TRACE(image_name + ", " + config_name + ", " + dtype_torch_name(dtype));
        auto host = vision::clip_preprocess(image, config);
        auto device = (*gpu)->preprocess_on_device(image, config);
        if (!host.is_ok()) {
          // Refused alike (an image too thin for the resize, say).
          EXPECT_EQ(device.status().code(), host.status().code()) << host.status().to_string();
          continue;
        }
        if (host->width != side || host->height != side) {
          EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
          continue;
        }
        ASSERT_TRUE(device.is_ok()) << device.status().to_string();
        std::vector<float> want = vision::flatten_patches(*host, patch);
        if (dtype != DType::kF32) {
          std::vector<char> stored(want.size() * dtype_size_bytes(dtype));
          convert_from_f32(stored.data(), dtype, want.data(), want.size());
          convert_to_f32(want.data(), stored.data(), dtype, want.size());
        }
        ASSERT_EQ(device->size(), want.size());
        size_t mismatches = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          if (std::memcmp(&(*device)[i], &want[i], sizeof(float)) != 0) ++mismatches;
        }
        EXPECT_EQ(mismatches, 0u);
      }
    }
  }
}

using Reference = vision::test::EngineAnswer;

Reference cpu_reference(const std::string& model, const std::vector<int32_t>& before,
                        const std::string& image, const std::vector<int32_t>& after,
                        int32_t n_new) {
  return vision::test::llava_engine_answer(model, before, image, after, n_new);
}

// The four services with the worker and the vision service on CUDA in `dtype`; waits until the
// scheduler has the vision service.
void start_on_cuda(ServiceCluster& cluster, const char* dtype) {
  cluster.use_preset("llava-tiny");
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  cluster.add_worker_args({"--device", "cuda", "--dtype", dtype});
  cluster.add_vision_args({"--device", "cuda", "--dtype", dtype});
  ASSERT_NO_FATAL_FAILURE(cluster.start_with_vision(int64_t{1} << 20));
}

TEST(CudaVision, ServicesReadTheDevicePoolInPlaceAndMapANewOneAfterAVisionRestart) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(start_on_cuda(cluster, "float32"));
  auto client = cluster.client();
  auto vision_up = [&] {
    auto info = client->server_info(1000);
    return info.is_ok() && info->vision_up;
  };
  EXPECT_NE(cluster.log("vision").find("device memory shared through CUDA IPC"), std::string::npos)
      << cluster.log("vision");
  // Warmed up at start: the tower replays its graph from the first request on.
  EXPECT_NE(cluster.log("vision").find("tower as a CUDA graph"), std::string::npos)
      << cluster.log("vision");

  const std::vector<int32_t> before = {1, 319, 1967, 29901};
  const std::vector<int32_t> after = {13, 5618, 338, 445};
  const std::string png = read_image("rgb_37x23.png");
  const std::string jpg = read_image("gray_29x40.jpg");
  const Reference want_png = cpu_reference(cluster.model_dir(), before, png, after, 8);
  const Reference want_jpg = cpu_reference(cluster.model_dir(), before, jpg, after, 8);
  ASSERT_EQ(want_png.ids.size(), 8u);
  ASSERT_NE(want_png.ids, want_jpg.ids);
  auto request = [&] {
    std::vector<int32_t> ids = before;
    ids.push_back(32000);  // one image token, expanded by the scheduler
    ids.insert(ids.end(), after.begin(), after.end());
    proto::GenerateRequest r = testing::ignoring_eos_request(ids, 8);
    r.top_logits = 4;
    return r;
  };
  auto check = [&](const std::string& image, const Reference& want, const char* what) {
    SCOPED_TRACE(what);
    auto got = client->generate(request(), nullptr, 30000, {image});
    ASSERT_TRUE(got.is_ok()) << got.status().to_string() << "\n" << cluster.logs();
    EXPECT_EQ(got->token_ids, want.ids);
    ASSERT_EQ(got->top_logits.size(), want.top.size());
    for (size_t i = 0; i < want.top.size(); ++i) {
      EXPECT_EQ(got->top_logits[i].first, want.top[i].first);
      EXPECT_NEAR(got->top_logits[i].second, want.top[i].second, 1e-3);
    }
  };
  ASSERT_NO_FATAL_FAILURE(check(png, want_png, "first image"));
  EXPECT_EQ(cluster.vision_encodes(), 1);
  // The hand-off from the vision service's rows to the prefill, measured in both processes.
  const std::string worker_metrics = cluster.worker_metrics();
  EXPECT_EQ(testing::metric_value(worker_metrics, "litellama_worker_image_handoff_seconds_count"),
            1);
  std::printf(
      "image hand-off: %.1f us\n",
      1e6 * testing::metric_value(worker_metrics, "litellama_worker_image_handoff_seconds_sum"));
  ASSERT_NO_FATAL_FAILURE(check(png, want_png, "the same image again"));
  EXPECT_EQ(cluster.vision_encodes(), 1);
  ASSERT_NO_FATAL_FAILURE(check(jpg, want_jpg, "another image"));
  EXPECT_EQ(cluster.vision_encodes(), 2);

  // A new vision process: a new device pool, which the same worker maps when a step names it.
  const pid_t worker_pid = cluster.process("worker").pid();
  cluster.process("vision").signal(SIGKILL);
  ASSERT_TRUE(testing::poll_until([&] { return !vision_up(); }, 10000));
  cluster.start_vision(int64_t{1} << 20);
  ASSERT_TRUE(testing::poll_until(vision_up, 30000)) << cluster.log("vision");
  ASSERT_NO_FATAL_FAILURE(check(jpg, want_jpg, "after the restart"));
  ASSERT_NO_FATAL_FAILURE(check(png, want_png, "after the restart, the other image"));
  EXPECT_EQ(cluster.process("worker").pid(), worker_pid);
  EXPECT_TRUE(cluster.process("worker").running());
}

TEST(CudaVision, Bf16ServicesStayNearTheFloat32Reference) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(start_on_cuda(cluster, "bfloat16"));
  auto client = cluster.client();
  const std::vector<int32_t> before = {1, 319, 1967, 29901};
  const std::vector<int32_t> after = {13, 5618, 338, 445};
  const std::string png = read_image("rgb_37x23.png");
  const Reference want = cpu_reference(cluster.model_dir(), before, png, after, 1);
  std::vector<int32_t> ids = before;
  ids.push_back(32000);
  ids.insert(ids.end(), after.begin(), after.end());
  proto::GenerateRequest r = testing::ignoring_eos_request(ids, 1);
  r.top_logits = 4;
  auto got = client->generate(r, nullptr, 30000, {png});
  ASSERT_TRUE(got.is_ok()) << got.status().to_string() << "\n" << cluster.logs();
  ASSERT_EQ(got->top_logits.size(), want.top.size());
  float scale = 0;
  for (const auto& [id, logit] : want.top) scale = std::max(scale, std::abs(logit));
  // The first position's largest logits, as the bf16 text tests bound them: 3% of their scale.
  for (size_t i = 0; i < want.top.size(); ++i) {
    EXPECT_NEAR(got->top_logits[i].second, want.top[i].second, 0.03 * scale) << i;
  }
  // The greedy token: the reference's, or one within the same bound of it (a near tie).
  bool near_top = false;
  for (const auto& [id, logit] : want.top) {
    near_top |= id == got->token_ids.front() && logit >= want.top.front().second - 0.03f * scale;
  }
  EXPECT_TRUE(near_top) << got->token_ids.front() << " against " << want.ids.front();
}

}  // namespace
}  // namespace litellama

namespace litellama {
namespace {

// The tower's operations one at a time at LLaVA-1.5's shape (CLIP ViT-L/14 at 336 px: 577
// tokens, hidden 1024, 16 heads, MLP 4096; 23 layers run), bf16, each launched 23 times in a row
// on one stream between two events: where an encode's device time goes. Run by hand:
//   cuda_vision_test --gtest_also_run_disabled_tests --gtest_filter='*DISABLED_TowerOps*'
TEST(CudaVisionTiming, DISABLED_TowerOpsAtLlava15Shape) {
  LITELLAMA_SKIP_WITHOUT_CUDA_DEVICE();
  constexpr int32_t T = 577, H = 1024, I = 4096, heads = 16, layers = 23;
  const DType dt = DType::kBF16;
  CudaContext ctx;
  ASSERT_TRUE(ctx.init().is_ok());
  auto buffer = [](size_t bytes) {
    auto b = DeviceBuffer::allocate(bytes);
    EXPECT_TRUE(b.is_ok());
    (void)cudaMemset(b->data(), 0x3c, bytes);  // bf16 0x3c3c, about 0.0115: finite everywhere
    return std::move(b).value();
  };
  DeviceBuffer x = buffer(T * H * 2), h = buffer(T * H * 2), qkv = buffer(T * 3 * H * 2),
               attn = buffer(T * H * 2), mid = buffer(T * I * 2), w = buffer(I * I * 2),
               out32 = buffer(T * I * 4), bias = buffer(I * 4),
               ws = buffer(dense_attention_workspace_bytes(T, heads, dt)),
               blas_ws = buffer(32 << 20);
  ASSERT_TRUE(linear_handle_set_workspace(ctx.linear(), blas_ws.data(), 32 << 20).is_ok());
  const cudaStream_t s = ctx.stream();
  const auto* b = bias.as<float>();
  auto time_us = [&](const char* what, const std::function<Status()>& op) {
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(op().is_ok()) << what;
    std::vector<float> runs;
    for (int r = 0; r < 5; ++r) {
      ASSERT_EQ(cudaEventRecord(ctx.step_start(), s), cudaSuccess);
      for (int l = 0; l < layers; ++l) ASSERT_TRUE(op().is_ok());
      ASSERT_EQ(cudaEventRecord(ctx.step_end(), s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      float ms = 0;
      ASSERT_EQ(cudaEventElapsedTime(&ms, ctx.step_start(), ctx.step_end()), cudaSuccess);
      runs.push_back(ms);
    }
    std::sort(runs.begin(), runs.end());
    std::printf("%-28s %8.1f us per layer, %8.1f us for %d layers\n", what, 1e3 * runs[2] / layers,
                1e3 * runs[2], layers);
  };
  const LinearHandle blas = ctx.linear();
  time_us("qkv GEMM 577x3072x1024", [&] {
    return launch_linear(qkv.data(), h.data(), w.data(), T, 3 * H, H, dt, dt, blas, s);
  });
  time_us("qkv bias", [&] {
    return launch_bias_act(qkv.data(), qkv.data(), b, nullptr, T, 3 * H, VisionActivation::kNone,
                           dt, s);
  });
  time_us("attention", [&] {
    return launch_dense_attention(attn.data(), qkv.data(), ws.data(), T, heads, H / heads, dt, blas,
                                  s);
  });
  time_us("out GEMM 577x1024x1024",
          [&] { return launch_linear(h.data(), attn.data(), w.data(), T, H, H, dt, dt, blas, s); });
  time_us("bias+residual+layernorm", [&] {
    return launch_bias_residual_layer_norm(x.data(), h.data(), b, h.data(), b, b, T, H, 1e-5f, dt,
                                           s);
  });
  time_us("fc1 GEMM 577x4096x1024",
          [&] { return launch_linear(mid.data(), h.data(), w.data(), T, I, H, dt, dt, blas, s); });
  time_us("fc1 bias+quick_gelu", [&] {
    return launch_bias_act(mid.data(), mid.data(), b, nullptr, T, I, VisionActivation::kQuickGelu,
                           dt, s);
  });
  time_us("fc2 GEMM 577x1024x4096",
          [&] { return launch_linear(h.data(), mid.data(), w.data(), T, H, I, dt, dt, blas, s); });
  time_us("projector 576x4096x4096 f32", [&] {
    return launch_linear(out32.data(), mid.data(), w.data(), T - 1, I, I, dt, DType::kF32, blas, s);
  });
}

}  // namespace
}  // namespace litellama
