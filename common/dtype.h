// Element types of tensors as stored in checkpoints and device buffers, and the scalar
// conversions between them. bf16/fp16 conversions round to nearest even, as PyTorch does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace litellama {

// kI8 and kF8E4M3 occur only in quantized checkpoints (int8 and FP8 weights); no backend computes
// in them directly: they are dequantized or handed to kernels made for them.
enum class DType { kF32, kBF16, kF16, kI32, kI64, kU8, kI8, kF8E4M3 };

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
// FP8 E4M3 as in the OCP 8-bit floating point specification and PyTorch's float8_e4m3fn: bias 7,
// no infinities, 0x7f / 0xff NaN, largest finite 448. The narrowing rounds to nearest even and
// saturates to +-448 (as quantizers clamp before casting); NaN stays NaN.
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f);

// Converts n elements of `src` (of type `dtype`) to float32.
void convert_to_f32(float* dst, const void* src, DType dtype, size_t n);
// Converts n float32 elements to `dtype` (kF32, kBF16 or kF16).
void convert_from_f32(void* dst, DType dtype, const float* src, size_t n);

}  // namespace litellama
