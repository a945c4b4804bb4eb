#include "common/dtype.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace litellama {

size_t dtype_size_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
    case DType::kI8:
    case DType::kF8E4M3:
      return 1;
  }
  return 0;
}

const char* dtype_safetensors_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kBF16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kI8:
      return "I8";
    case DType::kF8E4M3:
      return "F8_E4M3";
  }
  return "?";
}

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "BF16") return DType::kBF16;
  if (name == "F16") return DType::kF16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  if (name == "U8") return DType::kU8;
  if (name == "I8") return DType::kI8;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  return std::nullopt;
}

const char* dtype_torch_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kU8:
      return "uint8";
    case DType::kI8:
      return "int8";
    case DType::kF8E4M3:
      return "float8_e4m3fn";
  }
  return "?";
}

std::optional<DType> dtype_from_torch_name(std::string_view name) {
  if (name == "float32" || name == "fp32" || name == "float") return DType::kF32;
  if (name == "bfloat16" || name == "bf16") return DType::kBF16;
  if (name == "float16" || name == "fp16" || name == "half") return DType::kF16;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  float f;
  if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal
    if (sign) f = -f;
    return f;
  }
  uint32_t bits;
  if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: overflow to inf
  if (abs < 0x38800000u) {                        // below the smallest normal: subnormal or 0
    float a;
    std::memcpy(&a, &abs, sizeof a);
    // Subnormal step is 2^-24; nearbyint rounds half to even in the default mode.
    const float scaled = std::nearbyint(std::ldexp(a, 24));
    return sign | static_cast<uint16_t>(scaled);
  }
  // Normal: re-bias the exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t h = abs - (112u << 23);
  const uint32_t rounding = 0xfffu + ((h >> 13) & 1u);
  h += rounding;
  return sign | static_cast<uint16_t>(h >> 13);
}

float fp8e4m3_to_f32(uint8_t v) {
  const bool negative = (v & 0x80u) != 0;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t mant = v & 0x7u;
  float f;
  if (exp == 0xfu && mant == 0x7u) {
    f = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    f = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant * 2^-3 * 2^(1-7)
  } else {
    f = std::ldexp(static_cast<float>(8 + mant), static_cast<int>(exp) - 10);
  }
  return negative ? -f : f;
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80u : 0x00u;
  const float a = std::min(std::fabs(f), 448.0f);
  if (a < std::ldexp(1.0f, -6)) {
    // Subnormal range: a multiple of 2^-9; nearbyint rounds half to even. 8 * 2^-9 is the
    // smallest normal, whose encoding follows the subnormals'.
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
  }
  int e = 0;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // 4 significant bits: round m * 16 to an integer in [8, 16] (16 carries into the exponent).
  int q = static_cast<int>(std::nearbyint(m * 16.0f));
  int exp = e - 1 + 7;  // biased exponent of 1.xxx * 2^(e-1)
  if (q == 16) {
    q = 8;
    ++exp;
  }
  return sign | static_cast<uint8_t>((exp << 3) | (q - 8));
}

void convert_to_f32(float* dst, const void* src, DType dtype, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kI32: {
      const auto* s = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kI64: {
      const auto* s = static_cast<const int64_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kU8: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kI8: {
      const auto* s = static_cast<const int8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = fp8e4m3_to_f32(s[i]);
      return;
    }
  }
}

void convert_from_f32(void* dst, DType dtype, const float* src, size_t n) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_fp8e4m3(src[i]);
      return;
    }
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
    case DType::kI8:
      return;  // integer targets are never produced from float
  }
}

}  // namespace litellama
