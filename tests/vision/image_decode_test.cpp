// Image decoding: every committed test image decodes to its size and Pillow's source mode; bad
// input (not an image, empty, truncated, corrupt, over the pixel limit) is a clear Status.
#include "services/vision/image_decode.h"

#include <gtest/gtest.h>

#include "tests/vision/vision_test_util.h"

namespace litellama::vision {
namespace {

using test::images_dir;
using test::read_bytes;

struct Expected {
  const char* file;
  int32_t width, height;
  SourceMode mode;
};

TEST(ImageDecode, CommittedImagesHaveTheirSizesAndModes) {
  const Expected kImages[] = {
      {"rgb_37x23.png", 37, 23, SourceMode::kRgb},
      {"rgb_400x300.jpg", 400, 300, SourceMode::kRgb},
      {"rgb_61x45.jpg", 61, 45, SourceMode::kRgb},
      {"rgba_19x41.png", 19, 41, SourceMode::kRgba},
      {"gray_50x31.png", 50, 31, SourceMode::kGray},
      {"gray_29x40.jpg", 29, 40, SourceMode::kGray},
      {"gray16_17x13.png", 17, 13, SourceMode::kGray16},
      {"la_23x29.png", 23, 29, SourceMode::kGrayAlpha},
      {"palette_33x21.png", 33, 21, SourceMode::kPalette},
      {"bilevel_13x9.png", 13, 9, SourceMode::kGray},
      {"cmyk_20x16.jpg", 20, 16, SourceMode::kCmyk},
  };
  for (const Expected& e : kImages) {
    auto image = decode_image_file((images_dir() / e.file).string());
    ASSERT_TRUE(image.is_ok()) << e.file << ": " << image.status().to_string();
    EXPECT_EQ(image->width, e.width) << e.file;
    EXPECT_EQ(image->height, e.height) << e.file;
    EXPECT_EQ(image->source_mode, e.mode) << e.file;
    EXPECT_EQ(image->pixels.size(), static_cast<size_t>(e.width) * e.height * 3) << e.file;
    if (e.mode == SourceMode::kGray || e.mode == SourceMode::kGray16 ||
        e.mode == SourceMode::kGrayAlpha) {
      for (int32_t y = 0; y < image->height; ++y) {
        for (int32_t x = 0; x < image->width; ++x) {
          ASSERT_EQ(image->at(y, x, 0), image->at(y, x, 1)) << e.file;
          ASSERT_EQ(image->at(y, x, 0), image->at(y, x, 2)) << e.file;
        }
      }
    }
  }
}

TEST(ImageDecode, BilevelAndSixteenBitGreyFollowPillow) {
  // Mode "1" converts to 0 or 255; 16-bit grey ("I") clips at 255, and the test image has values
  // past 255, so some pixels are 255 and others are not.
  auto bilevel = decode_image_file((images_dir() / "bilevel_13x9.png").string());
  ASSERT_TRUE(bilevel.is_ok()) << bilevel.status().to_string();
  for (uint8_t v : bilevel->pixels) EXPECT_TRUE(v == 0 || v == 255) << int{v};
  auto g16 = decode_image_file((images_dir() / "gray16_17x13.png").string());
  ASSERT_TRUE(g16.is_ok()) << g16.status().to_string();
  int n_clipped = 0, n_other = 0;
  for (uint8_t v : g16->pixels) (v == 255 ? n_clipped : n_other)++;
  EXPECT_GT(n_clipped, 0);
  EXPECT_GT(n_other, 0);
}

TEST(ImageDecode, NonImageBytesAreRefused) {
  for (const std::string& text : {std::string(), std::string("hello"), std::string(64, '\0'),
                                  std::string("GIF89a\x01\x00\x01\x00", 10)}) {
    std::vector<uint8_t> bytes(text.begin(), text.end());
    auto image = decode_image(bytes);
    ASSERT_FALSE(image.is_ok());
    EXPECT_EQ(image.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(image.status().message().find("not a JPEG or PNG"), std::string::npos)
        << image.status().message();
  }
  auto missing = decode_image_file((images_dir() / "no-such-image.png").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(ImageDecode, TruncatedFilesAreDataLoss) {
  for (const char* file : {"rgb_400x300.jpg", "rgb_61x45.jpg", "rgb_37x23.png", "la_23x29.png"}) {
    const std::vector<uint8_t> full = read_bytes(images_dir() / file);
    ASSERT_GT(full.size(), 100u) << file;
    // Cut inside the header, inside the pixel data, and just before the end.
    for (size_t keep : {size_t{20}, full.size() / 2, full.size() - 3}) {
      std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(keep));
      auto image = decode_image(cut);
      ASSERT_FALSE(image.is_ok()) << file << " cut at " << keep;
      EXPECT_EQ(image.status().code(), StatusCode::kDataLoss)
          << file << " cut at " << keep << ": " << image.status().message();
    }
  }
}

TEST(ImageDecode, CorruptDataIsAnErrorNotACrash) {
  std::vector<uint8_t> png = read_bytes(images_dir() / "rgb_37x23.png");
  ASSERT_GT(png.size(), 60u);
  for (size_t i = 33; i < png.size(); i += 7) png[i] ^= 0x5a;  // past the IHDR chunk
  auto image = decode_image(png);
  ASSERT_FALSE(image.is_ok());
  EXPECT_EQ(image.status().code(), StatusCode::kDataLoss) << image.status().message();
}

uint32_t crc32(const uint8_t* data, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= data[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

void put_be32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

TEST(ImageDecode, DecompressionBombsAreRefusedBeforeDecoding) {
  // PNG: the IHDR of a real file rewritten to 9000 x 8000 (72 M pixels) with a valid CRC.
  std::vector<uint8_t> png = read_bytes(images_dir() / "rgb_37x23.png");
  ASSERT_GT(png.size(), 33u);
  put_be32(&png[16], 9000);
  put_be32(&png[20], 8000);
  put_be32(&png[29], crc32(&png[12], 17));
  auto big_png = decode_image(png);
  ASSERT_FALSE(big_png.is_ok());
  EXPECT_EQ(big_png.status().code(), StatusCode::kResourceExhausted) << big_png.status().message();
  EXPECT_NE(big_png.status().message().find("9000x8000"), std::string::npos);

  // JPEG: the baseline frame header (SOF0) rewritten to 9000 x 8000.
  std::vector<uint8_t> jpg = read_bytes(images_dir() / "rgb_61x45.jpg");
  size_t sof = 0;
  for (size_t i = 2; i + 9 < jpg.size(); ++i) {
    if (jpg[i] == 0xff && jpg[i + 1] == 0xc0) {
      sof = i;
      break;
    }
  }
  ASSERT_GT(sof, 0u);
  jpg[sof + 5] = 8000 >> 8;
  jpg[sof + 6] = 8000 & 0xff;
  jpg[sof + 7] = 9000 >> 8;
  jpg[sof + 8] = 9000 & 0xff;
  auto big_jpg = decode_image(jpg);
  ASSERT_FALSE(big_jpg.is_ok());
  EXPECT_EQ(big_jpg.status().code(), StatusCode::kResourceExhausted) << big_jpg.status().message();

  // Just under the limit is accepted by the check (the file then fails as truncated, having
  // far fewer bytes than its pixels need, instead of as too large).
  put_be32(&png[16], 8192);
  put_be32(&png[20], 8192);
  put_be32(&png[29], crc32(&png[12], 17));
  auto at_limit = decode_image(png);
  ASSERT_FALSE(at_limit.is_ok());
  EXPECT_EQ(at_limit.status().code(), StatusCode::kDataLoss) << at_limit.status().message();
}

}  // namespace
}  // namespace litellama::vision
