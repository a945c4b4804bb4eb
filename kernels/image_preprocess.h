// CLIP image preprocessing on the device, bit for bit the host's
// (services/vision/clip_preprocess.h, which matches Pillow and transformers' CLIPImageProcessor):
// the host decides everything that involves floating point or rounding (Pillow's fixed-point
// resampling coefficients, the crop window, the value of each byte per channel), and these kernels
// only apply it with integer arithmetic and table lookups, so their results cannot differ from the
// host's.
//   - resample_horizontal / resample_vertical: Pillow's two separable passes over 8-bit RGB rows
//     (ImagingResampleHorizontal_8bpc / ImagingResampleVertical_8bpc): per output pixel, the
//     weighted sum of `count` input pixels from `first` in 22-bit fixed point, rounded by adding
//     half and shifting, clipped to [0, 255];
//   - crop_normalize_patches: the center crop (zeros outside the image, as transformers pads),
//     each byte replaced by its channel's value (rescale and normalize, a 256-entry table per
//     channel), written as the patch convolution's input rows [n_patches, 3 * p * p] in the
//     (channel, ky, kx) order of its weight, in `dtype`.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/status.h"
#include "kernels/kernel_stream.h"

namespace litellama {

// Fixed-point bits of the resampling weights (Pillow's PRECISION_BITS for 8-bit images).
inline constexpr int kImageResamplePrecisionBits = 32 - 8 - 2;

// One axis of a resize, in device memory: out_size entries of first and count, out_size * ksize
// weights.
struct ImageResampleAxis {
  const int32_t* first = nullptr;
  const int32_t* count = nullptr;
  const int32_t* weights = nullptr;
  int32_t ksize = 0;
};

// out [n_rows, out_width, 3] from rows row_offset .. row_offset + n_rows of in [*, in_width, 3].
Status launch_resample_horizontal(uint8_t* out, const uint8_t* in, int32_t in_width,
                                  int32_t row_offset, int32_t n_rows, int32_t out_width,
                                  const ImageResampleAxis& axis, KernelStream stream);

// out [out_height, width, 3]; output row yy reads rows first[yy] - row_shift .. of in.
Status launch_resample_vertical(uint8_t* out, const uint8_t* in, int32_t width, int32_t row_shift,
                                int32_t out_height, const ImageResampleAxis& axis,
                                KernelStream stream);

// patches [(side / p)^2, 3 p p] of dtype from the side x side window at (top, left) of image
// [height, width, 3] (positions outside it read byte 0); value[c * 256 + byte] is the pixel value.
Status launch_crop_normalize_patches(void* patches, const uint8_t* image, int32_t height,
                                     int32_t width, int32_t top, int32_t left, int32_t side,
                                     int32_t patch_size, const float* value, DType dtype,
                                     KernelStream stream);

bool image_preprocess_supports(DType dtype);

}  // namespace litellama
