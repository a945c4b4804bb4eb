#include "services/vision/image_decode.h"

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>

namespace litellama::vision {

namespace {

Status too_large(int64_t width, int64_t height) {
  return make_error(StatusCode::kResourceExhausted,
                    "image is {}x{} ({} pixels), more than the {} pixels allowed", width, height,
                    width * height, kMaxImagePixels);
}

// ---- JPEG
// ---------------------------------------------------------------------------------------- libjpeg
// reports fatal errors through error_exit, which must not return: it longjmps back to
// decode_jpeg_into. Everything that outlives the jump lives in *JpegState (memory the jump does
// not unwind), and no C++ object with a destructor is created inside the setjmp frame.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

struct JpegState {
  jpeg_decompress_struct cinfo;
  JpegError error;
  RgbImage image;
  std::vector<uint8_t> row;
  Status status;
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are silent, as in Pillow, except the premature end of data, after which libjpeg
// would fill the rest of the image with grey: that is a truncated file.
void jpeg_emit_message(j_common_ptr cinfo, int msg_level) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  if (msg_level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    err->truncated = true;
    std::snprintf(err->message, sizeof err->message, "premature end of JPEG data");
    std::longjmp(err->jump, 1);
  }
}

// Pillow's CMYK -> RGB (Convert.c cmyk2rgb) on Adobe-inverted samples ("CMYK;I").
uint8_t cmyk_channel(int inverted_c, int inverted_k) {
  const int c = 255 - inverted_c;
  const int nk = inverted_k;  // 255 - k
  int tmp = c * nk + 128;
  tmp = ((tmp >> 8) + tmp) >> 8;
  const int v = nk - tmp;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

bool decode_jpeg_into(JpegState* s, std::span<const uint8_t> bytes) {
  s->cinfo.err = jpeg_std_error(&s->error.mgr);
  s->error.mgr.error_exit = jpeg_error_exit;
  s->error.mgr.emit_message = jpeg_emit_message;
  s->error.truncated = false;
  s->error.message[0] = '\0';
  if (setjmp(s->error.jump) != 0) {
    jpeg_destroy_decompress(&s->cinfo);
    return false;
  }
  jpeg_create_decompress(&s->cinfo);
  // Bounds what a hostile progressive file can make libjpeg allocate for its coefficients.
  s->cinfo.mem->max_memory_to_use = int64_t{1} << 30;
  jpeg_mem_src(&s->cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&s->cinfo, TRUE);
  const int64_t w = s->cinfo.image_width, h = s->cinfo.image_height;
  if (w * h > kMaxImagePixels) {
    s->status = too_large(w, h);
    jpeg_destroy_decompress(&s->cinfo);
    return false;
  }
  bool cmyk = false;
  switch (s->cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
      s->cinfo.out_color_space = JCS_GRAYSCALE;
      s->image.source_mode = SourceMode::kGray;
      break;
    case JCS_YCbCr:
    case JCS_RGB:
      s->cinfo.out_color_space = JCS_RGB;
      s->image.source_mode = SourceMode::kRgb;
      break;
    case JCS_CMYK:
    case JCS_YCCK:
      s->cinfo.out_color_space = JCS_CMYK;
      s->image.source_mode = SourceMode::kCmyk;
      cmyk = true;
      break;
    default:
      s->status = make_error(StatusCode::kUnsupported, "JPEG colour space {} is not supported",
                             static_cast<int>(s->cinfo.jpeg_color_space));
      jpeg_destroy_decompress(&s->cinfo);
      return false;
  }
  // Pillow's decoder settings: the accurate integer DCT and fancy upsampling (libjpeg's defaults).
  s->cinfo.dct_method = JDCT_ISLOW;
  s->cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&s->cinfo);
  const int channels = s->cinfo.output_components;
  s->image.width = static_cast<int32_t>(s->cinfo.output_width);
  s->image.height = static_cast<int32_t>(s->cinfo.output_height);
  s->image.pixels.resize(static_cast<size_t>(s->image.width) * s->image.height * 3);
  s->row.resize(static_cast<size_t>(s->image.width) * channels);
  while (s->cinfo.output_scanline < s->cinfo.output_height) {
    const size_t y = s->cinfo.output_scanline;
    JSAMPROW rows[1] = {s->row.data()};
    if (jpeg_read_scanlines(&s->cinfo, rows, 1) != 1) break;
    uint8_t* out = s->image.pixels.data() + y * s->image.width * 3;
    const uint8_t* in = s->row.data();
    for (int32_t x = 0; x < s->image.width; ++x, out += 3, in += channels) {
      if (channels == 1) {
        out[0] = out[1] = out[2] = in[0];
      } else if (cmyk) {
        out[0] = cmyk_channel(in[0], in[3]);
        out[1] = cmyk_channel(in[1], in[3]);
        out[2] = cmyk_channel(in[2], in[3]);
      } else {
        std::memcpy(out, in, 3);
      }
    }
  }
  jpeg_finish_decompress(&s->cinfo);
  jpeg_destroy_decompress(&s->cinfo);
  return true;
}

Result<RgbImage> decode_jpeg(std::span<const uint8_t> bytes) {
  auto state = std::make_unique<JpegState>();
  if (!decode_jpeg_into(state.get(), bytes)) {
    if (!state->status.is_ok()) return state->status;
    if (state->error.truncated) {
      return make_error(StatusCode::kDataLoss, "JPEG file is truncated");
    }
    return make_error(StatusCode::kDataLoss, "corrupt JPEG file: {}", state->error.message);
  }
  return std::move(state->image);
}

// ---- PNG
// ----------------------------------------------------------------------------------------- libpng
// reports errors through a longjmp to png_jmpbuf as well; the same rule as for JPEG holds.
struct PngReader {
  std::span<const uint8_t> bytes;
  size_t pos = 0;
  bool truncated = false;
};

struct PngState {
  png_structp png = nullptr;
  png_infop info = nullptr;
  PngReader reader;
  RgbImage image;
  std::vector<uint8_t> raw;  // the decoded rows before conversion to RGB
  std::vector<png_bytep> rows;
  char message[256];
  Status status;
};

void png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (r->bytes.size() - r->pos < n) {
    r->truncated = true;
    png_error(png, "PNG file is truncated");
  }
  std::memcpy(out, r->bytes.data() + r->pos, n);
  r->pos += n;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof s->message, "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}

bool decode_png_into(PngState* s) {
  s->message[0] = '\0';
  s->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, s, png_on_error, png_on_warning);
  if (s->png == nullptr) {
    s->status = make_error(StatusCode::kResourceExhausted, "cannot create a PNG decoder");
    return false;
  }
  s->info = png_create_info_struct(s->png);
  if (s->info == nullptr) {
    png_destroy_read_struct(&s->png, nullptr, nullptr);
    s->status = make_error(StatusCode::kResourceExhausted, "cannot create a PNG decoder");
    return false;
  }
  if (setjmp(png_jmpbuf(s->png)) != 0) {
    png_destroy_read_struct(&s->png, &s->info, nullptr);
    return false;
  }
  png_set_read_fn(s->png, &s->reader, png_read_bytes);
  // Sides up to 2^20 (libpng's default limit is 10^6); the pixel count is checked below.
  png_set_user_limits(s->png, 1u << 20, 1u << 20);
  png_set_chunk_malloc_max(s->png, 8u << 20);
  png_read_info(s->png, s->info);
  const png_uint_32 w = png_get_image_width(s->png, s->info);
  const png_uint_32 h = png_get_image_height(s->png, s->info);
  if (int64_t{w} * h > kMaxImagePixels) {
    s->status = too_large(w, h);
    png_destroy_read_struct(&s->png, &s->info, nullptr);
    return false;
  }
  const int color_type = png_get_color_type(s->png, s->info);
  const int bit_depth = png_get_bit_depth(s->png, s->info);
  // Deflate compresses at most 1032:1, so a file far smaller than its pixels is truncated; it is
  // refused before the rows are allocated.
  // (One sample of bit_depth bits per pixel is the least any colour type stores.)
  const int64_t min_raw_bytes = int64_t{w} * h * bit_depth / 8;
  if (min_raw_bytes > int64_t{1100} * static_cast<int64_t>(s->reader.bytes.size()) + 4096) {
    s->reader.truncated = true;
    png_destroy_read_struct(&s->png, &s->info, nullptr);
    return false;
  }
  switch (color_type) {
    case PNG_COLOR_TYPE_GRAY:
      s->image.source_mode = bit_depth == 16 ? SourceMode::kGray16 : SourceMode::kGray;
      if (bit_depth < 8) png_set_expand_gray_1_2_4_to_8(s->png);
      break;
    case PNG_COLOR_TYPE_GRAY_ALPHA:
      s->image.source_mode = SourceMode::kGrayAlpha;
      break;
    case PNG_COLOR_TYPE_PALETTE:
      s->image.source_mode = SourceMode::kPalette;
      png_set_palette_to_rgb(s->png);
      break;
    case PNG_COLOR_TYPE_RGB:
      s->image.source_mode = SourceMode::kRgb;
      break;
    case PNG_COLOR_TYPE_RGB_ALPHA:
      s->image.source_mode = SourceMode::kRgba;
      break;
    default:
      png_error(s->png, "unknown PNG colour type");
  }
  // 16-bit greyscale is clipped (Pillow's "I" -> "RGB"), so it is read at 16 bits; every other
  // 16-bit image keeps its high bytes, which is what png_set_strip_16 gives.
  const bool gray16 = s->image.source_mode == SourceMode::kGray16;
  if (bit_depth == 16 && !gray16) png_set_strip_16(s->png);
  png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  const int channels = png_get_channels(s->png, s->info);
  const size_t rowbytes = png_get_rowbytes(s->png, s->info);
  const size_t bytes_per_sample = gray16 ? 2 : 1;
  if (channels < 1 || channels > 4 || rowbytes != size_t{w} * channels * bytes_per_sample) {
    png_error(s->png, "unexpected PNG row layout");
  }
  s->raw.resize(rowbytes * h);
  s->rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) s->rows[y] = s->raw.data() + y * rowbytes;
  png_read_image(s->png, s->rows.data());
  png_read_end(s->png, nullptr);
  png_destroy_read_struct(&s->png, &s->info, nullptr);

  s->image.width = static_cast<int32_t>(w);
  s->image.height = static_cast<int32_t>(h);
  s->image.pixels.resize(size_t{w} * h * 3);
  uint8_t* out = s->image.pixels.data();
  const uint8_t* in = s->raw.data();
  const size_t n = size_t{w} * h;
  for (size_t i = 0; i < n; ++i, out += 3) {
    if (gray16) {
      // Greyscale, maybe with a tRNS-expanded alpha sample after it (dropped).
      const int v = (in[0] << 8) | in[1];
      out[0] = out[1] = out[2] = static_cast<uint8_t>(v > 255 ? 255 : v);
      in += 2 * channels;
    } else if (channels <= 2) {
      out[0] = out[1] = out[2] = in[0];
      in += channels;
    } else {
      std::memcpy(out, in, 3);
      in += channels;
    }
  }
  return true;
}

Result<RgbImage> decode_png(std::span<const uint8_t> bytes) {
  auto state = std::make_unique<PngState>();
  state->reader.bytes = bytes;
  if (!decode_png_into(state.get())) {
    if (!state->status.is_ok()) return state->status;
    if (state->reader.truncated) return make_error(StatusCode::kDataLoss, "PNG file is truncated");
    return make_error(StatusCode::kDataLoss, "corrupt PNG file: {}", state->message);
  }
  return std::move(state->image);
}

}  // namespace

const char* source_mode_name(SourceMode mode) {
  switch (mode) {
    case SourceMode::kGray:
      return "L";
    case SourceMode::kGray16:
      return "I";
    case SourceMode::kGrayAlpha:
      return "LA";
    case SourceMode::kRgb:
      return "RGB";
    case SourceMode::kRgba:
      return "RGBA";
    case SourceMode::kPalette:
      return "P";
    case SourceMode::kCmyk:
      return "CMYK";
  }
  return "?";
}

Result<ImageFormat> sniff_image_format(std::span<const uint8_t> bytes) {
  static constexpr uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPng, 8) == 0) return ImageFormat::kPng;
  if (bytes.size() >= 3 && bytes[0] == 0xff && bytes[1] == 0xd8 && bytes[2] == 0xff) {
    return ImageFormat::kJpeg;
  }
  return make_error(StatusCode::kInvalidArgument,
                    "not a JPEG or PNG image ({} bytes without either signature)", bytes.size());
}

Result<RgbImage> decode_image(std::span<const uint8_t> bytes) {
  LITELLAMA_ASSIGN_OR_RETURN(ImageFormat format, sniff_image_format(bytes));
  switch (format) {
    case ImageFormat::kJpeg:
      return decode_jpeg(bytes);
    case ImageFormat::kPng:
      return decode_png(bytes);
  }
  return make_error(StatusCode::kInternal, "unknown image format");
}

Result<RgbImage> decode_image_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "cannot read image '{}'", path);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  auto image = decode_image(bytes);
  if (!image.is_ok()) {
    return Status(image.status().code(), "'" + path + "': " + image.status().message());
  }
  return image;
}

}  // namespace litellama::vision
