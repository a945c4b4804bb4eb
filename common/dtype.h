// Element types of tensors as stored in checkpoints and device buffers, and the scalar
// conversions between them. bf16/fp16 conversions round to nearest even, as PyTorch does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace litellama {

enum class DType { kF32, kBF16, kF16, kI32, kI64, kU8 };

size_t dtype_size_bytes(DType dtype);
// Names as in safetensors headers ("F32", "BF16", ...).
const char* dtype_safetensors_name(DType dtype);
std::optional<DType> dtype_from_safetensors_name(std::string_view name);
// Names as on the command line and in config.json ("float32", "bfloat16", "float16").
const char* dtype_torch_name(DType dtype);
std::optional<DType> dtype_from_torch_name(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  }
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Converts n elements of `src` (of type `dtype`) to float32.
void convert_to_f32(float* dst, const void* src, DType dtype, size_t n);
// Converts n float32 elements to `dtype` (kF32, kBF16 or kF16).
void convert_from_f32(void* dst, DType dtype, const float* src, size_t n);

}  // namespace litellama
