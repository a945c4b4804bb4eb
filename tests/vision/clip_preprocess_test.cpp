// CLIP preprocessing against the references of tests/golden/make_image_golden.py: every
// preprocess_*.json under tests/golden/images (preprocess_pillow.json, made with Pillow and numpy
// following the slow CLIPImageProcessor's steps, is required; preprocess_transformers.json, from
// the real processor, is checked when present). Pixel values must agree within 1/255.
#include "services/vision/clip_preprocess.h"

#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/vision/vision_test_util.h"

namespace litellama::vision {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::images_dir;

constexpr double kTolerance = 1.0 / 255;

json load_json(const fs::path& path) {
  std::ifstream in(path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j;
}

// Checks one reference file; returns the largest difference seen.
double check_reference_file(const fs::path& path) {
  const json golden = load_json(path);
  EXPECT_FALSE(golden.is_discarded()) << path;
  EXPECT_TRUE(golden.contains("cases")) << path;
  if (golden.is_discarded() || !golden.contains("cases")) return INFINITY;
  EXPECT_GE(golden["cases"].size(), 20u) << path;
  double max_diff = 0;
  for (const json& c : golden["cases"]) {
    const std::string label = c["label"].get<std::string>() + " " + c["image"].get<std::string>();
    auto image = decode_image_file((images_dir() / c["image"].get<std::string>()).string());
    EXPECT_TRUE(image.is_ok()) << label << ": " << image.status().to_string();
    if (!image.is_ok()) continue;
    auto config = parse_clip_preprocess_config(c["config"]);
    EXPECT_TRUE(config.is_ok()) << label << ": " << config.status().to_string();
    if (!config.is_ok()) continue;
    config->pad_to_square = c["pad_to_square"].get<bool>();
    auto pv = clip_preprocess(*image, *config);
    EXPECT_TRUE(pv.is_ok()) << label << ": " << pv.status().to_string();
    if (!pv.is_ok()) continue;
    const auto shape = c["shape"].get<std::vector<int32_t>>();
    EXPECT_EQ(shape, (std::vector<int32_t>{3, pv->height, pv->width})) << label;
    if (shape != std::vector<int32_t>{3, pv->height, pv->width}) continue;
    const auto stride = c["value_stride"].get<size_t>();
    const auto values = c["values"].get<std::vector<double>>();
    EXPECT_EQ(values.size(), (pv->data.size() + stride - 1) / stride) << label;
    double case_max = 0, sum = 0;
    size_t n_over = 0;
    for (size_t i = 0; i < values.size() && i * stride < pv->data.size(); ++i) {
      const double d = std::fabs(pv->data[i * stride] - values[i]);
      case_max = std::max(case_max, d);
      n_over += d > kTolerance;
    }
    for (float v : pv->data) {
      EXPECT_TRUE(std::isfinite(v)) << label;
      sum += v;
    }
    EXPECT_EQ(n_over, 0u) << label << ": " << n_over << " values differ by more than 1/255 (max "
                          << case_max << ")";
    // The sum covers the values a strided reference leaves out.
    EXPECT_NEAR(sum, c["sum"].get<double>(), kTolerance * std::sqrt(double(pv->data.size())) + 1e-3)
        << label;
    max_diff = std::max(max_diff, case_max);
  }
  return max_diff;
}

TEST(ClipPreprocess, MatchesEveryReferenceFile) {
  const fs::path required = images_dir() / "preprocess_pillow.json";
  ASSERT_TRUE(fs::exists(required)) << "missing reference file " << required;
  int n_files = 0;
  for (const auto& entry : fs::directory_iterator(images_dir())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("preprocess_", 0) != 0 || entry.path().extension() != ".json") continue;
    const double max_diff = check_reference_file(entry.path());
    std::printf("%s: largest difference %.3g (tolerance %.3g)\n", name.c_str(), max_diff,
                kTolerance);
    ++n_files;
  }
  EXPECT_GE(n_files, 1);
}

TEST(ClipPreprocess, ParsesPublishedConfigs) {
  // llava-hf/llava-1.5-7b-hf's preprocessor_config.json.
  auto c = parse_clip_preprocess_config(std::string(R"({
    "crop_size": {"height": 336, "width": 336}, "do_center_crop": true,
    "do_convert_rgb": true, "do_normalize": true, "do_rescale": true, "do_resize": true,
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaProcessor",
    "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}})"));
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->shortest_edge, 336);
  EXPECT_EQ(c->crop_height, 336);
  EXPECT_EQ(c->crop_width, 336);
  EXPECT_EQ(c->resample, Resample::kBicubic);
  EXPECT_DOUBLE_EQ(c->image_std[2], 0.27577711);
  // The older integer forms (openai/clip-vit-large-patch14-336).
  auto old = parse_clip_preprocess_config(std::string(R"({"crop_size": 336, "size": 336})"));
  ASSERT_TRUE(old.is_ok()) << old.status().to_string();
  EXPECT_EQ(old->shortest_edge, 336);
  EXPECT_EQ(old->crop_width, 336);
  for (const char* bad : {R"([1])", R"({"size": {"longest_edge": 3}})", R"({"resample": 9})",
                          R"({"image_std": [1, 0, 1]})", R"({"image_mean": [1, 2]})",
                          R"({"crop_size": -4})", R"({"do_resize": "yes"})", "{"}) {
    auto r = parse_clip_preprocess_config(std::string(bad));
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ClipPreprocess, OutputSizesFollowTransformers) {
  EXPECT_EQ(shortest_edge_output_size(300, 400, 336), (std::pair{336, 448}));
  EXPECT_EQ(shortest_edge_output_size(45, 61, 336), (std::pair{336, 455}));  // int(455.46)
  EXPECT_EQ(shortest_edge_output_size(41, 19, 11), (std::pair{23, 11}));     // int(23.74)
  EXPECT_EQ(shortest_edge_output_size(336, 500, 336), (std::pair{336, 500}));
}

TEST(ClipPreprocess, RefusesWhatItCannotDo) {
  auto image = decode_image_file((images_dir() / "rgba_19x41.png").string());
  ASSERT_TRUE(image.is_ok());
  ClipPreprocessConfig config;
  config.do_convert_rgb = false;
  auto r = clip_preprocess(*image, config);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("RGBA"), std::string::npos) << r.status().message();
  config.do_convert_rgb = true;
  config.resample = Resample::kNearest;
  EXPECT_EQ(clip_preprocess(*image, config).status().code(), StatusCode::kUnsupported);
  // A 1-pixel-wide sliver whose long side would exceed the pixel limit after resizing.
  RgbImage sliver;
  sliver.width = 1;
  sliver.height = 4000;
  sliver.pixels.assign(4000 * 3, 7);
  config.resample = Resample::kBicubic;
  config.shortest_edge = 4000;
  EXPECT_EQ(clip_preprocess(sliver, config).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(clip_preprocess(RgbImage{}, config).status().code(), StatusCode::kInvalidArgument);
  // Padding a thin sliver to a square is bounded like decoding (a fuzzer's finding).
  RgbImage wide;
  wide.width = 9000;
  wide.height = 1;
  wide.pixels.assign(9000 * 3, 7);
  config.shortest_edge = 8;
  config.pad_to_square = true;
  auto padded = clip_preprocess(wide, config);
  ASSERT_FALSE(padded.is_ok());
  EXPECT_EQ(padded.status().code(), StatusCode::kResourceExhausted) << padded.status().message();
}

}  // namespace
}  // namespace litellama::vision
