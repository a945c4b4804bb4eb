// Scalar conversions between float32 and the 16-bit storage types: exact values, rounding to
// nearest even, and the special values.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "common/dtype.h"

namespace litellama {
namespace {

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway too: rounds up to the even neighbour.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST(DTypeTest, F16RoundTripAndLimits) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.103515625e-05f, 5.960464477539063e-08f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(v)), v) << v;
  }
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  // 1 + 2^-11 is halfway between 1 and the next f16: ties to even.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Every f16 bit pattern that is a number converts back to itself.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(DTypeTest, Names) {
  EXPECT_EQ(dtype_from_safetensors_name("BF16"), DType::kBF16);
  EXPECT_EQ(dtype_from_safetensors_name("F8_E4M3"), DType::kF8E4M3);  // quantized weights
  EXPECT_EQ(dtype_from_safetensors_name("I8"), DType::kI8);
  EXPECT_FALSE(dtype_from_safetensors_name("F8_E5M2").has_value());
  EXPECT_EQ(dtype_from_torch_name("float16"), DType::kF16);
  EXPECT_FALSE(dtype_from_torch_name("int4").has_value());
}

}  // namespace
}  // namespace litellama
