#include "services/vision/clip_preprocess.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numbers>

#include <nlohmann/json.hpp>

namespace litellama::vision {

namespace {

using nlohmann::json;

// ---- Pillow's resampling (libImaging/Resample.c)
// -------------------------------------------------

struct Filter {
  double (*weight)(double x);
  double support;
};

double box_weight(double x) {
  return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0;
}

double bilinear_weight(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

double hamming_weight(double x) {
  x = std::fabs(x);
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x *= std::numbers::pi;
  // Pillow writes the window's constants as float literals; the product is formed in double.
  return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));
}

// Keys' cubic convolution with a = -0.5.
double bicubic_weight(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= std::numbers::pi;
  return std::sin(x) / x;
}

double lanczos_weight(double x) {
  return (-3.0 <= x && x < 3.0) ? sinc(x) * sinc(x / 3) : 0.0;
}

// Fixed point of the coefficients: 8 bits of result, 2 of headroom for the filter's overshoot.
constexpr int kPrecisionBits = kResamplePrecisionBits;
using Coefficients = ResampleCoefficients;

// precompute_coeffs + normalize_coeffs_8bpc over the whole input [0, in_size).
Coefficients make_coefficients(int32_t in_size, int32_t out_size, const Filter& filter) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;  // antialiasing when downscaling
  const double support = filter.support * filterscale;
  Coefficients c;
  c.ksize = static_cast<int32_t>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(static_cast<size_t>(c.ksize));
  for (int32_t xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // Pillow rounds by truncation after adding 0.5 (toward zero for the negative xmin).
    int32_t xmin = static_cast<int32_t>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int32_t xmax = static_cast<int32_t>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int32_t x = 0; x < xmax; ++x) {
      const double w = filter.weight((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int32_t x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[x] / ww : k[x];
      const double scaled = v * (1 << kPrecisionBits);
      c.weights[static_cast<size_t>(xx) * c.ksize + x] =
          static_cast<int32_t>(v < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

uint8_t clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;  // arithmetic shift: floor
  return static_cast<uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

// One pass over RGB rows: horizontal (along x) or vertical (along y). `offset` is the first input
// row the horizontal pass reads (Pillow skips rows the vertical pass never uses).
RgbImage resample_horizontal(const RgbImage& in, int32_t out_width, int32_t row_offset,
                             int32_t n_rows, const Coefficients& c) {
  RgbImage out;
  out.width = out_width;
  out.height = n_rows;
  out.source_mode = in.source_mode;
  out.pixels.resize(static_cast<size_t>(out_width) * n_rows * 3);
  for (int32_t y = 0; y < n_rows; ++y) {
    const uint8_t* row = in.pixels.data() + static_cast<size_t>(y + row_offset) * in.width * 3;
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(y) * out_width * 3;
    for (int32_t xx = 0; xx < out_width; ++xx) {
      const int32_t* k = c.weights.data() + static_cast<size_t>(xx) * c.ksize;
      const uint8_t* src = row + static_cast<size_t>(c.first[xx]) * 3;
      int32_t s0 = 1 << (kPrecisionBits - 1), s1 = s0, s2 = s0;
      for (int32_t x = 0; x < c.count[xx]; ++x) {
        s0 += src[x * 3 + 0] * k[x];
        s1 += src[x * 3 + 1] * k[x];
        s2 += src[x * 3 + 2] * k[x];
      }
      dst[xx * 3 + 0] = clip8(s0);
      dst[xx * 3 + 1] = clip8(s1);
      dst[xx * 3 + 2] = clip8(s2);
    }
  }
  return out;
}

RgbImage resample_vertical(const RgbImage& in, int32_t out_height, int32_t row_shift,
                           const Coefficients& c) {
  RgbImage out;
  out.width = in.width;
  out.height = out_height;
  out.source_mode = in.source_mode;
  out.pixels.resize(static_cast<size_t>(in.width) * out_height * 3);
  const size_t stride = static_cast<size_t>(in.width) * 3;
  for (int32_t yy = 0; yy < out_height; ++yy) {
    const int32_t* k = c.weights.data() + static_cast<size_t>(yy) * c.ksize;
    const uint8_t* base = in.pixels.data() + static_cast<size_t>(c.first[yy] - row_shift) * stride;
    uint8_t* dst = out.pixels.data() + static_cast<size_t>(yy) * stride;
    for (size_t i = 0; i < stride; ++i) {
      int32_t s = 1 << (kPrecisionBits - 1);
      for (int32_t y = 0; y < c.count[yy]; ++y) s += base[y * stride + i] * k[y];
      dst[i] = clip8(s);
    }
  }
  return out;
}

// ---- preprocessor_config.json
// --------------------------------------------------------------------

Status read_bool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  if (!it->is_boolean()) {
    return make_error(StatusCode::kInvalidArgument,
                      "preprocessor_config.json: '{}' must be true or false", key);
  }
  *out = it->get<bool>();
  return Status::ok();
}

Status read_positive(const json& v, const std::string& what, int32_t* out) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > 65536) {
    return make_error(StatusCode::kInvalidArgument,
                      "preprocessor_config.json: '{}' must be an integer in [1, 65536]", what);
  }
  *out = v.get<int32_t>();
  return Status::ok();
}

Status read_channels(const json& j, const char* key, std::vector<double>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return Status::ok();
  std::vector<double> v;
  if (it->is_number()) {
    v.assign(3, it->get<double>());
  } else if (it->is_array() && it->size() == 3) {
    for (const auto& x : *it) {
      if (!x.is_number()) break;
      v.push_back(x.get<double>());
    }
  }
  if (v.size() != 3) {
    return make_error(StatusCode::kInvalidArgument,
                      "preprocessor_config.json: '{}' must be a number or a list of 3 numbers",
                      key);
  }
  *out = std::move(v);
  return Status::ok();
}

}  // namespace

Result<ClipPreprocessConfig> parse_clip_preprocess_config(const json& j) {
  if (!j.is_object()) {
    return make_error(StatusCode::kInvalidArgument,
                      "preprocessor_config.json: top level must be an object");
  }
  ClipPreprocessConfig c;
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, "do_resize", &c.do_resize));
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, "do_center_crop", &c.do_center_crop));
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, "do_rescale", &c.do_rescale));
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, "do_normalize", &c.do_normalize));
  LITELLAMA_RETURN_IF_ERROR(read_bool(j, "do_convert_rgb", &c.do_convert_rgb));
  // size: an int or {"shortest_edge": N} (get_size_dict with default_to_square=False), or
  // {"height": H, "width": W}.
  if (auto s = j.find("size"); s != j.end() && !s->is_null()) {
    if (s->is_number_integer()) {
      LITELLAMA_RETURN_IF_ERROR(read_positive(*s, "size", &c.shortest_edge));
    } else if (s->is_object() && s->contains("shortest_edge")) {
      LITELLAMA_RETURN_IF_ERROR(
          read_positive((*s)["shortest_edge"], "size.shortest_edge", &c.shortest_edge));
    } else if (s->is_object() && s->contains("height") && s->contains("width")) {
      LITELLAMA_RETURN_IF_ERROR(read_positive((*s)["height"], "size.height", &c.resize_height));
      LITELLAMA_RETURN_IF_ERROR(read_positive((*s)["width"], "size.width", &c.resize_width));
    } else {
      return make_error(StatusCode::kInvalidArgument,
                        "preprocessor_config.json: 'size' must be an integer, {{\"shortest_edge\": "
                        "N}} or {{\"height\": H, \"width\": W}}");
    }
  }
  // crop_size: an int (a square) or {"height": H, "width": W}.
  if (auto s = j.find("crop_size"); s != j.end() && !s->is_null()) {
    if (s->is_number_integer()) {
      LITELLAMA_RETURN_IF_ERROR(read_positive(*s, "crop_size", &c.crop_height));
      c.crop_width = c.crop_height;
    } else if (s->is_object() && s->contains("height") && s->contains("width")) {
      LITELLAMA_RETURN_IF_ERROR(read_positive((*s)["height"], "crop_size.height", &c.crop_height));
      LITELLAMA_RETURN_IF_ERROR(read_positive((*s)["width"], "crop_size.width", &c.crop_width));
    } else {
      return make_error(StatusCode::kInvalidArgument,
                        "preprocessor_config.json: 'crop_size' must be an integer or "
                        "{{\"height\": H, \"width\": W}}");
    }
  }
  if (auto r = j.find("resample"); r != j.end() && !r->is_null()) {
    if (!r->is_number_integer() || r->get<int64_t>() < 0 || r->get<int64_t>() > 5) {
      return make_error(StatusCode::kInvalidArgument,
                        "preprocessor_config.json: 'resample' must be a PIL filter number 0..5");
    }
    c.resample = static_cast<Resample>(r->get<int32_t>());
  }
  if (auto r = j.find("rescale_factor"); r != j.end() && !r->is_null()) {
    if (!r->is_number()) {
      return make_error(StatusCode::kInvalidArgument,
                        "preprocessor_config.json: 'rescale_factor' must be a number");
    }
    c.rescale_factor = r->get<double>();
  }
  LITELLAMA_RETURN_IF_ERROR(read_channels(j, "image_mean", &c.image_mean));
  LITELLAMA_RETURN_IF_ERROR(read_channels(j, "image_std", &c.image_std));
  for (double s : c.image_std) {
    if (!(s != 0.0) || !std::isfinite(s)) {
      return make_error(StatusCode::kInvalidArgument,
                        "preprocessor_config.json: 'image_std' must be finite and non-zero");
    }
  }
  return c;
}

Result<ClipPreprocessConfig> parse_clip_preprocess_config(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return make_error(StatusCode::kInvalidArgument, "preprocessor_config.json: not valid JSON");
  }
  return parse_clip_preprocess_config(j);
}

Result<ClipPreprocessConfig> load_clip_preprocess_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "preprocessor_config.json").string();
  std::ifstream in(path);
  if (!in) return make_error(StatusCode::kNotFound, "'{}' has no preprocessor_config.json", dir);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_clip_preprocess_config(text);
}

namespace {

// Image.resize's passes from in_width x in_height to width x height, into plan's resize fields.
Status plan_resize(int32_t in_width, int32_t in_height, int32_t width, int32_t height,
                   Resample resample, ClipPreprocessPlan* plan) {
  if (width < 1 || height < 1 || in_width < 1 || in_height < 1) {
    return make_error(StatusCode::kInvalidArgument, "cannot resize a {}x{} image to {}x{}",
                      in_width, in_height, width, height);
  }
  if (int64_t{width} * height > kMaxImagePixels) {
    return make_error(StatusCode::kResourceExhausted, "resize target {}x{} is too large", width,
                      height);
  }
  Filter filter{};
  switch (resample) {
    case Resample::kBox:
      filter = {box_weight, 0.5};
      break;
    case Resample::kBilinear:
      filter = {bilinear_weight, 1.0};
      break;
    case Resample::kHamming:
      filter = {hamming_weight, 1.0};
      break;
    case Resample::kBicubic:
      filter = {bicubic_weight, 2.0};
      break;
    case Resample::kLanczos:
      filter = {lanczos_weight, 3.0};
      break;
    case Resample::kNearest:
      return make_error(StatusCode::kUnsupported,
                        "resample 0 (nearest) is not supported (supported: 1 lanczos, 2 bilinear, "
                        "3 bicubic, 4 box, 5 hamming)");
  }
  plan->resized_width = width;
  plan->resized_height = height;
  // Image.resize returns a copy when the size is unchanged.
  plan->horizontal = width != in_width;
  plan->vertical = height != in_height;
  plan->first_row = 0;
  plan->n_rows = in_height;
  if (plan->vertical) {
    plan->vert = make_coefficients(in_height, height, filter);
    if (plan->horizontal) {
      // The horizontal pass only produces the rows the vertical pass reads.
      plan->first_row = plan->vert.first[0];
      plan->n_rows = plan->vert.first[height - 1] + plan->vert.count[height - 1] - plan->first_row;
    }
  }
  if (plan->horizontal) plan->horiz = make_coefficients(in_width, width, filter);
  return Status::ok();
}

// The resize fields of a plan applied to `image`.
RgbImage run_resize(const RgbImage& image, const ClipPreprocessPlan& plan) {
  if (!plan.horizontal && !plan.vertical) return image;
  if (!plan.horizontal) return resample_vertical(image, plan.resized_height, 0, plan.vert);
  RgbImage tmp =
      resample_horizontal(image, plan.resized_width, plan.first_row, plan.n_rows, plan.horiz);
  if (!plan.vertical) return tmp;
  return resample_vertical(tmp, plan.resized_height, plan.first_row, plan.vert);
}

}  // namespace

Result<RgbImage> pillow_resize(const RgbImage& image, int32_t width, int32_t height,
                               Resample resample) {
  ClipPreprocessPlan plan;
  LITELLAMA_RETURN_IF_ERROR(plan_resize(image.width, image.height, width, height, resample, &plan));
  return run_resize(image, plan);
}

std::pair<int32_t, int32_t> shortest_edge_output_size(int32_t height, int32_t width,
                                                      int32_t shortest_edge) {
  const bool portrait = width <= height;
  const int64_t short_side = portrait ? width : height, long_side = portrait ? height : width;
  if (short_side == shortest_edge) return {height, width};
  // Python's int(new_short * long / short): true division, then truncation.
  const auto new_long = static_cast<int32_t>(
      static_cast<double>(int64_t{shortest_edge} * long_side) / static_cast<double>(short_side));
  return portrait ? std::pair{new_long, shortest_edge} : std::pair{shortest_edge, new_long};
}

RgbImage center_crop(const RgbImage& image, int32_t crop_height, int32_t crop_width) {
  // Python's floor division: negative offsets where the crop is larger (zero padding).
  auto floor_half = [](int32_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };
  const int32_t top = floor_half(image.height - crop_height);
  const int32_t left = floor_half(image.width - crop_width);
  RgbImage out;
  out.width = crop_width;
  out.height = crop_height;
  out.source_mode = image.source_mode;
  out.pixels.assign(static_cast<size_t>(crop_width) * crop_height * 3, 0);
  for (int32_t y = 0; y < crop_height; ++y) {
    const int32_t sy = y + top;
    if (sy < 0 || sy >= image.height) continue;
    for (int32_t x = 0; x < crop_width; ++x) {
      const int32_t sx = x + left;
      if (sx < 0 || sx >= image.width) continue;
      for (int32_t ch = 0; ch < 3; ++ch) {
        out.pixels[(static_cast<size_t>(y) * crop_width + x) * 3 + ch] = image.at(sy, sx, ch);
      }
    }
  }
  return out;
}

Result<RgbImage> expand_to_square(const RgbImage& image, const std::vector<double>& image_mean) {
  if (image.width == image.height) return image;
  const int32_t side = std::max(image.width, image.height);
  if (int64_t{side} * side > kMaxImagePixels) {
    return make_error(StatusCode::kResourceExhausted,
                      "padding a {}x{} image to a square of {} pixels exceeds the {} allowed",
                      image.width, image.height, int64_t{side} * side, kMaxImagePixels);
  }
  // expand2square pastes at ((side - w) // 2, (side - h) // 2).
  const int32_t left = (side - image.width) / 2, top = (side - image.height) / 2;
  RgbImage out;
  out.width = out.height = side;
  out.source_mode = image.source_mode;
  out.pixels.resize(static_cast<size_t>(side) * side * 3);
  uint8_t background[3];
  for (int ch = 0; ch < 3; ++ch) {
    const double v = image_mean[static_cast<size_t>(ch)] * 255;
    background[ch] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : static_cast<int>(v)));
  }
  for (size_t i = 0; i < out.pixels.size(); i += 3) std::copy_n(background, 3, &out.pixels[i]);
  for (int32_t y = 0; y < image.height; ++y) {
    std::copy_n(image.pixels.data() + static_cast<size_t>(y) * image.width * 3,
                static_cast<size_t>(image.width) * 3,
                out.pixels.data() + (static_cast<size_t>(y + top) * side + left) * 3);
  }
  return out;
}

Result<ClipPreprocessPlan> plan_clip_preprocess(const RgbImage& image,
                                                const ClipPreprocessConfig& config) {
  if (image.width < 1 || image.height < 1 ||
      image.pixels.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return make_error(StatusCode::kInvalidArgument, "empty or malformed image ({}x{})", image.width,
                      image.height);
  }
  if (!config.do_convert_rgb && image.source_mode != SourceMode::kRgb) {
    return make_error(StatusCode::kInvalidArgument,
                      "image is {} and do_convert_rgb is false: the vision tower takes RGB",
                      source_mode_name(image.source_mode));
  }
  ClipPreprocessPlan plan;
  int32_t width = image.width, height = image.height;
  if (config.pad_to_square) {
    LITELLAMA_ASSIGN_OR_RETURN(plan.squared, expand_to_square(image, config.image_mean));
    if (plan.squared.width == image.width && plan.squared.height == image.height) {
      plan.squared = RgbImage{};  // already square: the input goes on as it is
    } else {
      width = plan.squared.width;
      height = plan.squared.height;
    }
  }
  plan.resized_width = width;
  plan.resized_height = height;
  plan.n_rows = height;
  if (config.do_resize) {
    int32_t h = config.resize_height, w = config.resize_width;
    if (h <= 0 || w <= 0)
      std::tie(h, w) = shortest_edge_output_size(height, width, config.shortest_edge);
    if (h < 1 || w < 1) {
      return make_error(StatusCode::kInvalidArgument,
                        "image of {}x{} resizes to {}x{} (too thin for shortest edge {})", width,
                        height, w, h, config.shortest_edge);
    }
    LITELLAMA_RETURN_IF_ERROR(plan_resize(width, height, w, h, config.resample, &plan));
  }
  plan.out_height = plan.resized_height;
  plan.out_width = plan.resized_width;
  if (config.do_center_crop) {
    // Python's floor division: negative offsets where the crop is larger (zero padding).
    auto floor_half = [](int32_t v) { return v >= 0 ? v / 2 : -((-v + 1) / 2); };
    plan.top = floor_half(plan.resized_height - config.crop_height);
    plan.left = floor_half(plan.resized_width - config.crop_width);
    plan.out_height = config.crop_height;
    plan.out_width = config.crop_width;
  }
  for (int32_t ch = 0; ch < 3; ++ch) {
    // As transformers: rescale in float64 then float32, normalize in float32.
    const auto mean = static_cast<float>(config.image_mean[static_cast<size_t>(ch)]);
    const auto std_dev = static_cast<float>(config.image_std[static_cast<size_t>(ch)]);
    for (int32_t u = 0; u < 256; ++u) {
      float v =
          config.do_rescale ? static_cast<float>(u * config.rescale_factor) : static_cast<float>(u);
      if (config.do_normalize) v = (v - mean) / std_dev;
      plan.value[static_cast<size_t>(ch)][static_cast<size_t>(u)] = v;
    }
  }
  return plan;
}

PixelValues apply_clip_preprocess(const RgbImage& image, const ClipPreprocessPlan& plan) {
  const RgbImage& source = plan.squared.width > 0 ? plan.squared : image;
  const RgbImage resized = run_resize(source, plan);
  PixelValues out;
  out.height = plan.out_height;
  out.width = plan.out_width;
  const size_t plane = static_cast<size_t>(out.height) * out.width;
  out.data.resize(plane * 3);
  for (int32_t y = 0; y < out.height; ++y) {
    const int32_t sy = y + plan.top;
    const bool row_in = sy >= 0 && sy < resized.height;
    for (int32_t x = 0; x < out.width; ++x) {
      const int32_t sx = x + plan.left;
      const bool in = row_in && sx >= 0 && sx < resized.width;
      const size_t i = static_cast<size_t>(y) * out.width + x;
      for (int32_t ch = 0; ch < 3; ++ch) {
        const uint8_t u = in ? resized.at(sy, sx, ch) : 0;
        out.data[ch * plane + i] = plan.value[static_cast<size_t>(ch)][u];
      }
    }
  }
  return out;
}

Result<PixelValues> clip_preprocess(const RgbImage& image, const ClipPreprocessConfig& config) {
  LITELLAMA_ASSIGN_OR_RETURN(ClipPreprocessPlan plan, plan_clip_preprocess(image, config));
  return apply_clip_preprocess(image, plan);
}

}  // namespace litellama::vision
