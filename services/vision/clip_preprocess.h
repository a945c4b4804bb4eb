// CLIPImageProcessor's preprocessing, as transformers' slow (Pillow-based, use_fast=False)
// processor does it: convert to RGB, resize the shortest edge (Pillow's antialiased resampling),
// center crop, rescale, normalize; the result is pixel_values [3, crop_height, crop_width] in
// float32, channel-major. The original LLaVA's "pad to square with the mean colour" runs first
// when asked for.
//
// Pillow's resize (libImaging/Resample.c, ImagingResample) is re-implemented here because no
// Debian C++ library reproduces it: a separable convolution, horizontal pass first, whose filter
// support grows with the downscale factor (antialiasing), with fixed-point coefficients of 22
// fractional bits and the intermediate image rounded and clipped to 8 bits between the passes.
// Pixel values therefore match the processor's exactly, not only within a tolerance.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"
#include "services/vision/image_decode.h"

namespace litellama::vision {

// Pillow's resampling filters, numbered as PIL.Image.Resampling.
enum class Resample : int32_t {
  kNearest = 0,
  kLanczos = 1,
  kBilinear = 2,
  kBicubic = 3,
  kBox = 4,
  kHamming = 5,
};

// preprocessor_config.json of a CLIP image processor. Defaults are CLIPImageProcessor's.
struct ClipPreprocessConfig {
  bool do_resize = true;
  // size: {"shortest_edge": N} resizes the shorter side to N keeping the aspect ratio;
  // {"height": H, "width": W} resizes to exactly H x W.
  int32_t shortest_edge = 224;
  int32_t resize_height = 0;  // > 0 with resize_width: exact size instead of shortest_edge
  int32_t resize_width = 0;
  Resample resample = Resample::kBicubic;
  bool do_center_crop = true;
  int32_t crop_height = 224;
  int32_t crop_width = 224;
  bool do_rescale = true;
  double rescale_factor = 1.0 / 255.0;
  bool do_normalize = true;
  std::vector<double> image_mean = {0.48145466, 0.4578275, 0.40821073};
  std::vector<double> image_std = {0.26862954, 0.26130258, 0.27577711};
  bool do_convert_rgb = true;
  // The original LLaVA's expand2square: pad the shorter side to a square of colour
  // int(mean * 255) per channel before everything else. Not a processor field.
  bool pad_to_square = false;
};

// Parses preprocessor_config.json text (keys absent keep CLIPImageProcessor's defaults). Errors
// name the key.
Result<ClipPreprocessConfig> parse_clip_preprocess_config(const std::string& json_text);
Result<ClipPreprocessConfig> parse_clip_preprocess_config(const nlohmann::json& json);
// <dir>/preprocessor_config.json.
Result<ClipPreprocessConfig> load_clip_preprocess_config(const std::string& dir);

// Pillow's Image.resize(size, resample) of an RGB image (reducing_gap None, the whole image).
// kUnsupported for kNearest; kInvalidArgument for sizes below 1.
Result<RgbImage> pillow_resize(const RgbImage& image, int32_t width, int32_t height,
                               Resample resample);

// transformers' get_resize_output_image_size for a shortest-edge size: (height, width).
std::pair<int32_t, int32_t> shortest_edge_output_size(int32_t height, int32_t width,
                                                      int32_t shortest_edge);

// transformers' center_crop: the centred crop_height x crop_width window, zero-padded where the
// image is smaller.
RgbImage center_crop(const RgbImage& image, int32_t crop_height, int32_t crop_width);

// LLaVA's expand2square with background int(mean[c] * 255). kResourceExhausted when the square
// would exceed kMaxImagePixels (a thin sliver squares into a huge image).
Result<RgbImage> expand_to_square(const RgbImage& image, const std::vector<double>& image_mean);

struct PixelValues {
  int32_t height = 0;
  int32_t width = 0;
  std::vector<float> data;  // [3, height, width]
};

// Fractional bits of Pillow's fixed-point resampling weights for 8-bit images (PRECISION_BITS).
inline constexpr int kResamplePrecisionBits = 32 - 8 - 2;

// Pillow's resampling coefficients of one axis (precompute_coeffs + normalize_coeffs_8bpc over
// the whole input): per output pixel, the first input pixel, how many it reads and their weights
// in fixed point of kResamplePrecisionBits fractional bits.
struct ResampleCoefficients {
  int32_t ksize = 0;
  std::vector<int32_t> first, count;
  std::vector<int32_t> weights;  // [out_size, ksize]
};

// What clip_preprocess does to one image, decided on the host: everything that involves floating
// point or rounding. Applying it is integer arithmetic and table lookups, which the device
// preprocessing (services/vision/cuda/) does bit for bit as apply_clip_preprocess does.
struct ClipPreprocessPlan {
  // pad_to_square's padded image; width 0 when the input goes on as it is.
  RgbImage squared;
  // The resize: the passes Pillow runs (none when the size does not change). The horizontal pass
  // produces input rows [first_row, first_row + n_rows) only (the rows the vertical pass reads);
  // the vertical pass then reads its rows shifted by first_row.
  bool horizontal = false, vertical = false;
  int32_t resized_width = 0, resized_height = 0;  // the input's size when there is no resize
  ResampleCoefficients horiz, vert;
  int32_t first_row = 0, n_rows = 0;
  // The output: out_height x out_width pixels of the resized image from (top, left); positions
  // outside it read byte 0 (transformers pads a crop larger than the image with zeros).
  int32_t top = 0, left = 0, out_height = 0, out_width = 0;
  // value[c][byte]: the pixel value of `byte` in channel c after rescale and normalize, computed
  // as transformers does (rescale in float64 then float32, normalize in float32).
  std::array<std::array<float, 256>, 3> value{};
};

// Checks the image and the configuration and plans the preprocessing (pad_to_square runs here,
// into plan.squared).
Result<ClipPreprocessPlan> plan_clip_preprocess(const RgbImage& image,
                                                const ClipPreprocessConfig& config);
// Runs a plan of `image` on the host.
PixelValues apply_clip_preprocess(const RgbImage& image, const ClipPreprocessPlan& plan);

// The whole preprocessing of one decoded image: plan_clip_preprocess, then apply.
Result<PixelValues> clip_preprocess(const RgbImage& image, const ClipPreprocessConfig& config);

}  // namespace litellama::vision
