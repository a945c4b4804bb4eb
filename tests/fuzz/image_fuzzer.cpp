// Fuzz target: image decoding and CLIP preprocessing (services/vision/) on arbitrary bytes. The
// first byte picks the preprocessing (target size, crop, filter, pad to square), the rest is the
// file. Properties: decoding returns an RGB image or an error, never crashes or reads out of
// bounds, and never accepts more than kMaxImagePixels pixels; a decoded image preprocesses to
// pixel_values of exactly [3, crop_h, crop_w], every value finite and within the range that
// rescaling and normalizing 8-bit samples can give.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "services/vision/clip_preprocess.h"
#include "services/vision/image_decode.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace litellama::vision;
  litellama::fuzz::Input input(data, size);
  const uint8_t choice = input.take_byte();
  const std::string_view rest = input.rest();
  auto image = decode_image(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(rest.data()), rest.size()));
  if (!image.is_ok()) {
    FUZZ_CHECK(!image.status().message().empty(), "an error without a message");
    return 0;
  }
  FUZZ_CHECK(image->width >= 1 && image->height >= 1, "empty image accepted");
  FUZZ_CHECK(int64_t{image->width} * image->height <= kMaxImagePixels, "bomb accepted");
  FUZZ_CHECK(image->pixels.size() == static_cast<size_t>(image->width) * image->height * 3,
             "pixel buffer does not match the size");
  // Preprocessing runs on images of up to 1 M pixels, padded to squares of up to 4 M: larger
  // resizes pass the per-input time limit under the sanitizers (decoding ran on them all the
  // same; ClipPreprocess.RefusesWhatItCannotDo covers squares past the pixel limit).
  const int64_t side = std::max(image->width, image->height);
  if (int64_t{image->width} * image->height > (int64_t{1} << 20)) return 0;
  ClipPreprocessConfig config;
  config.shortest_edge = 1 + (choice & 15);
  config.crop_height = 1 + ((choice >> 2) & 15);
  config.crop_width = 1 + ((choice >> 3) & 15);
  const Resample kFilters[] = {Resample::kBicubic, Resample::kBilinear, Resample::kLanczos,
                               Resample::kBox};
  config.resample = kFilters[(choice >> 4) & 3];
  config.pad_to_square = (choice & 0x40) != 0 && side * side <= (int64_t{1} << 22);
  config.do_center_crop = (choice & 0x80) == 0;
  auto pv = clip_preprocess(*image, config);
  if (!pv.is_ok()) {
    // Only a sliver too thin to resize may be refused.
    FUZZ_CHECK(pv.status().code() == litellama::StatusCode::kInvalidArgument ||
                   pv.status().code() == litellama::StatusCode::kResourceExhausted,
               pv.status().to_string());
    return 0;
  }
  if (config.do_center_crop) {
    FUZZ_CHECK(pv->height == config.crop_height && pv->width == config.crop_width,
               "output is not the crop size");
  }
  FUZZ_CHECK(pv->data.size() == static_cast<size_t>(pv->height) * pv->width * 3,
             "output size does not match its shape");
  for (size_t i = 0; i < pv->data.size(); ++i) {
    const size_t ch = i / (static_cast<size_t>(pv->height) * pv->width);
    const double lo = (0.0 - config.image_mean[ch]) / config.image_std[ch];
    const double hi = (1.0 - config.image_mean[ch]) / config.image_std[ch];
    FUZZ_CHECK(std::isfinite(pv->data[i]) && pv->data[i] >= lo - 1e-4 && pv->data[i] <= hi + 1e-4,
               "pixel value out of range");
  }
  return 0;
}
