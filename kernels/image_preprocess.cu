// CLIP preprocessing kernels (kernels/image_preprocess.h): one thread per output pixel (the
// resampling passes, all three channels) or per output value (the patches).
#include "kernels/image_preprocess.h"

#include <algorithm>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.cuh"
#include "kernels/launch.h"

namespace litellama {
namespace {

constexpr int kThreads = 256;
constexpr int32_t kMaxGridRows = 65535;

// Pillow's clip8: the sum already holds the rounding half; an arithmetic shift floors.
__device__ __forceinline__ uint8_t clip8(int32_t v) {
  const int32_t s = v >> kImageResamplePrecisionBits;
  return static_cast<uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

__global__ void resample_horizontal_kernel(uint8_t* __restrict__ out,
                                           const uint8_t* __restrict__ in, int in_width,
                                           int row_offset, int out_width, ImageResampleAxis axis) {
  pdl_wait();
  const int xx = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y;
  if (xx >= out_width) return;
  const uint8_t* src = in + (static_cast<int64_t>(y + row_offset) * in_width + axis.first[xx]) * 3;
  const int32_t* k = axis.weights + static_cast<int64_t>(xx) * axis.ksize;
  int32_t s0 = 1 << (kImageResamplePrecisionBits - 1), s1 = s0, s2 = s0;
  const int n = axis.count[xx];
  for (int x = 0; x < n; ++x) {
    s0 += src[x * 3 + 0] * k[x];
    s1 += src[x * 3 + 1] * k[x];
    s2 += src[x * 3 + 2] * k[x];
  }
  uint8_t* dst = out + (static_cast<int64_t>(y) * out_width + xx) * 3;
  dst[0] = clip8(s0);
  dst[1] = clip8(s1);
  dst[2] = clip8(s2);
}

__global__ void resample_vertical_kernel(uint8_t* __restrict__ out, const uint8_t* __restrict__ in,
                                         int stride, int row_shift, int first_out_row,
                                         ImageResampleAxis axis) {
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int yy = first_out_row + static_cast<int>(blockIdx.y);
  if (i >= stride) return;
  const int32_t* k = axis.weights + static_cast<int64_t>(yy) * axis.ksize;
  const uint8_t* base = in + static_cast<int64_t>(axis.first[yy] - row_shift) * stride + i;
  int32_t s = 1 << (kImageResamplePrecisionBits - 1);
  const int n = axis.count[yy];
  for (int y = 0; y < n; ++y) s += base[static_cast<int64_t>(y) * stride] * k[y];
  out[static_cast<int64_t>(yy) * stride + i] = clip8(s);
}

template <typename T>
__global__ void crop_normalize_patches_kernel(T* __restrict__ patches,
                                              const uint8_t* __restrict__ image, int height,
                                              int width, int top, int left, int side, int p,
                                              const float* __restrict__ value) {
  pdl_wait();
  const int patch_len = 3 * p * p;
  const int per_row = side / p;
  const int64_t total = static_cast<int64_t>(per_row) * per_row * patch_len;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int patch = static_cast<int>(idx / patch_len);
    const int r = static_cast<int>(idx % patch_len);
    const int c = r / (p * p), ky = (r / p) % p, kx = r % p;
    const int y = (patch / per_row) * p + ky + top;
    const int x = (patch % per_row) * p + kx + left;
    const int byte = (y >= 0 && y < height && x >= 0 && x < width)
                         ? image[(static_cast<int64_t>(y) * width + x) * 3 + c]
                         : 0;
    patches[idx] = from_float<T>(value[c * 256 + byte]);
  }
}

}  // namespace

bool image_preprocess_supports(DType dtype) {
  return is_float_compute_dtype(dtype);
}

Status launch_resample_horizontal(uint8_t* out, const uint8_t* in, int32_t in_width,
                                  int32_t row_offset, int32_t n_rows, int32_t out_width,
                                  const ImageResampleAxis& axis, KernelStream stream) {
  if (n_rows <= 0 || out_width <= 0) return Status::ok();
  // Rows go in launches of at most kMaxGridRows (the grid's y limit).
  for (int32_t y0 = 0; y0 < n_rows; y0 += kMaxGridRows) {
    const int32_t rows = std::min(kMaxGridRows, n_rows - y0);
    const dim3 grid(static_cast<unsigned>(ceil_div(out_width, kThreads)),
                    static_cast<unsigned>(rows));
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(resample_horizontal_kernel, grid, dim3(kThreads),
                                                 0, stream,
                                                 out + static_cast<int64_t>(y0) * out_width * 3, in,
                                                 in_width, row_offset + y0, out_width, axis));
  }
  return Status::ok();
}

Status launch_resample_vertical(uint8_t* out, const uint8_t* in, int32_t width, int32_t row_shift,
                                int32_t out_height, const ImageResampleAxis& axis,
                                KernelStream stream) {
  if (out_height <= 0 || width <= 0) return Status::ok();
  const int32_t stride = width * 3;
  for (int32_t y0 = 0; y0 < out_height; y0 += kMaxGridRows) {
    const int32_t rows = std::min(kMaxGridRows, out_height - y0);
    const dim3 grid(static_cast<unsigned>(ceil_div(stride, kThreads)), static_cast<unsigned>(rows));
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(resample_vertical_kernel, grid, dim3(kThreads), 0,
                                                 stream, out, in, stride, row_shift, y0, axis));
  }
  return Status::ok();
}

Status launch_crop_normalize_patches(void* patches, const uint8_t* image, int32_t height,
                                     int32_t width, int32_t top, int32_t left, int32_t side,
                                     int32_t patch_size, const float* value, DType dtype,
                                     KernelStream stream) {
  if (patch_size <= 0 || side <= 0 || side % patch_size != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "crop_normalize_patches: side {} is not a multiple of patch size {}", side,
                      patch_size);
  }
  const int64_t total = static_cast<int64_t>(side) * side * 3;
  return dispatch_float_dtype(dtype, "crop_normalize_patches", [&](auto type) -> Status {
    using T = typename decltype(type)::type;
    const auto blocks =
        static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(total, kThreads), 4096));
    LITELLAMA_CUDA_RETURN_IF_ERROR(launch_kernel(
        crop_normalize_patches_kernel<T>, dim3(blocks), dim3(kThreads), 0, stream,
        static_cast<T*>(patches), image, height, width, top, left, side, patch_size, value));
    return Status::ok();
  });
}

}  // namespace litellama
