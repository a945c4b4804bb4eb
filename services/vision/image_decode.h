// Image decoding: JPEG (libjpeg-turbo) and PNG (libpng) bytes to 8-bit RGB, as Pillow's
// Image.open(...).convert("RGB") gives them, so that the preprocessing after it sees the pixels
// the Hugging Face processors see.
//
// What must stay true: any byte string gives an image or a Status (never a crash, never an
// allocation beyond kMaxImagePixels); the colour conversion follows Pillow's, mode by mode:
// - greyscale (1, 2, 4, 8 bits) is replicated into R, G and B (low depths scaled to 0..255);
// - 16-bit greyscale is Pillow's mode "I", whose conversion to RGB clips values above 255 to 255;
// - 16-bit colour and 16-bit greyscale+alpha keep the high byte of each sample;
// - alpha (RGBA, greyscale+alpha, tRNS) is dropped, not composited;
// - palette images take their palette colours;
// - CMYK JPEGs (Adobe-inverted as Photoshop writes them) convert as Pillow's cmyk2rgb.
// EXIF orientation is not applied (the processors do not apply it either).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"

namespace litellama::vision {

// Images larger than this are refused before their pixels are allocated (decompression bombs).
inline constexpr int64_t kMaxImagePixels = int64_t{64} << 20;

enum class ImageFormat { kJpeg, kPng };

// The source's colour mode, as Pillow names it after opening the file.
enum class SourceMode { kGray, kGray16, kGrayAlpha, kRgb, kRgba, kPalette, kCmyk };

const char* source_mode_name(SourceMode mode);

struct RgbImage {
  int32_t width = 0;
  int32_t height = 0;
  std::vector<uint8_t> pixels;  // [height, width, 3], row-major
  SourceMode source_mode = SourceMode::kRgb;

  uint8_t at(int32_t y, int32_t x, int32_t c) const {
    return pixels[(static_cast<size_t>(y) * width + x) * 3 + c];
  }
};

// The format the leading bytes announce, or kInvalidArgument naming what they are not.
Result<ImageFormat> sniff_image_format(std::span<const uint8_t> bytes);

// Decodes a JPEG or PNG file's bytes. Errors: kInvalidArgument (not a JPEG or PNG),
// kDataLoss (truncated or corrupt), kResourceExhausted (more than kMaxImagePixels pixels),
// kUnsupported (a JPEG colour space other than greyscale, YCbCr/RGB or CMYK).
Result<RgbImage> decode_image(std::span<const uint8_t> bytes);

// Reads a file and decodes it; kNotFound when it cannot be read.
Result<RgbImage> decode_image_file(const std::string& path);

}  // namespace litellama::vision
