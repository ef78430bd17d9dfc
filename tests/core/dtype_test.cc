// Tensor dtypes, quantized dtypes and the exact float32 <-> bfloat16 / half conversions.

#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

// ---- Tensor dtypes ----

TEST(DType, ItemSizes) {
  EXPECT_EQ(ItemSize(DType::kFloat32), 4);
  EXPECT_EQ(ItemSize(DType::kFloat16), 2);
  EXPECT_EQ(ItemSize(DType::kBFloat16), 2);
  EXPECT_EQ(ItemSize(DType::kFloat64), 8);
}

TEST(DType, NamesRoundTripThroughParse) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    ASSERT_OK_AND_ASSIGN(DType parsed, ParseDType(DTypeName(d)));
    EXPECT_EQ(parsed, d) << DTypeName(d);
  }
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bfloat16");
  EXPECT_EQ(DTypeName(DType::kFloat16), "float16");
}

TEST(DType, ParseRejectsUnknownNames) {
  for (const char* name : {"", "float", "half", "int8", "Float32", "torch.float32"}) {
    EXPECT_CODE(ParseDType(name), kInvalid) << name;
  }
}

TEST(DType, FloatBitsRoundTrip) {
  EXPECT_EQ(FloatBits(1.0f), 0x3F800000u);
  EXPECT_EQ(FloatBits(-0.0f), 0x80000000u);
  EXPECT_EQ(FloatFromBits(0x3CC0C0C1u), 3.0f / 127.5f);
}

// ---- 16-bit conversions ----

// IEEE half decoded in double straight from its fields.
double RefHalfToDouble(uint16_t h) {
  const int sign = h >> 15, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double v;
  if (exponent == 0) {
    v = std::ldexp(mantissa, -24);  // subnormal
  } else if (exponent == 31) {
    v = mantissa != 0 ? std::numeric_limits<double>::quiet_NaN()
                      : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -v : v;
}

// `f` rounded to nearest-even in a binary format with `mantissa_bits` stored bits,
// minimum normal exponent `emin` and largest finite value `max_finite`, computed in
// double (v / quantum is exact, nearbyint rounds half to even).
double RefRound(float f, int mantissa_bits, int emin, double max_finite) {
  const double v = f;
  if (v == 0 || std::isinf(v)) return v;
  const int e = std::max(std::ilogb(v), emin);
  const double quantum = std::ldexp(1.0, e - mantissa_bits);
  const double r = std::nearbyint(v / quantum) * quantum;
  if (std::fabs(r) > max_finite) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return std::copysign(r, v);  // keeps the sign of an underflow to zero
}
constexpr double kHalfMax = 65504.0;
const double kBFloat16Max = std::ldexp(255.0, 120);  // 0x7F7F
double RefHalf(float f) { return RefRound(f, 10, -14, kHalfMax); }
double RefBFloat16(float f) { return RefRound(f, 7, -126, kBFloat16Max); }

bool HalfIsNaN(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool BFloat16IsNaN(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// Same value and same sign bit (so -0.0 != +0.0).
bool SameDouble(double a, double b) { return a == b && std::signbit(a) == std::signbit(b); }

TEST(HalfConversion, WideningMatchesFieldDecodeForAll65536Patterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const double ref = RefHalfToDouble(static_cast<uint16_t>(h));
    if (std::isnan(ref)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
    } else {
      ASSERT_TRUE(SameDouble(f, ref)) << std::hex << h << ": " << f << " vs " << ref;
    }
  }
}

TEST(HalfConversion, RoundTripsAll65536PatternsAndNaNStaysNaN) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = FloatToHalf(HalfToFloat(static_cast<uint16_t>(h)));
    if (HalfIsNaN(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(HalfIsNaN(back)) << std::hex << h << " -> " << back;
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(BFloat16Conversion, WideningIsTheHighHalfForAll65536Patterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(FloatBits(f), b << 16) << std::hex << b;
  }
}

TEST(BFloat16Conversion, RoundTripsAll65536PatternsAndNaNStaysNaN) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t back = FloatToBFloat16(BFloat16ToFloat(static_cast<uint16_t>(b)));
    if (BFloat16IsNaN(static_cast<uint16_t>(b))) {
      EXPECT_TRUE(BFloat16IsNaN(back)) << std::hex << b << " -> " << back;
    } else {
      ASSERT_EQ(back, b) << std::hex << b;
    }
  }
}

// Every midpoint between two adjacent finite halves (exact in float32), and its float
// neighbours on either side: ties go to the even encoding, the rest to the nearest.
TEST(HalfConversion, RoundsHalfToEvenAtEveryMidpoint) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // h and h + 1 adjacent; 0x7bff + 1 is +Inf
    const double a = RefHalfToDouble(static_cast<uint16_t>(h));
    const double b = h + 1 == 0x7c00 ? 65536.0 : RefHalfToDouble(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((a + b) / 2);
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2) << "midpoint not exact in float32";
    const uint16_t even = (h & 1) == 0 ? h : h + 1;
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t sign_bit = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(FloatToHalf(sign * mid), even | sign_bit) << std::hex << h;
      ASSERT_EQ(FloatToHalf(sign * std::nextafter(mid, 0.0f)), h | sign_bit) << std::hex << h;
      ASSERT_EQ(FloatToHalf(sign * std::nextafter(mid, INFINITY)), (h + 1) | sign_bit)
          << std::hex << h;
      ASSERT_TRUE(SameDouble(RoundToHalf(sign * mid), RefHalf(sign * mid))) << std::hex << h;
    }
  }
}

TEST(BFloat16Conversion, RoundsHalfToEvenAtEveryMidpoint) {
  for (uint32_t b = 0; b < 0x7f80; ++b) {  // 0x7f7f + 1 is +Inf
    const double lo = BFloat16ToFloat(static_cast<uint16_t>(b));
    const double hi = b + 1 == 0x7f80 ? std::ldexp(1.0, 128) : BFloat16ToFloat(b + 1);
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (b & 1) == 0 ? b : b + 1;
    for (float sign : {1.0f, -1.0f}) {
      const uint16_t sign_bit = sign < 0 ? 0x8000 : 0;
      ASSERT_EQ(FloatToBFloat16(sign * mid), even | sign_bit) << std::hex << b;
      ASSERT_EQ(FloatToBFloat16(sign * std::nextafter(mid, 0.0f)), b | sign_bit) << std::hex << b;
      ASSERT_EQ(FloatToBFloat16(sign * std::nextafter(mid, INFINITY)), (b + 1) | sign_bit)
          << std::hex << b;
      ASSERT_TRUE(SameDouble(RoundToBFloat16(sign * mid), RefBFloat16(sign * mid)))
          << std::hex << b;
    }
  }
}

// Random float32 bit patterns over the whole range (subnormal, overflowing, both
// signs), narrowed and compared with the double reference.
TEST(SixteenBitConversion, RandomFloatsMatchDoubleReference) {
  std::mt19937 gen(1234);
  for (int i = 0; i < (1 << 18); ++i) {
    const uint32_t bits = gen();
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x7fffffu) != 0) continue;  // NaN
    const float f = FloatFromBits(bits);
    ASSERT_TRUE(SameDouble(RoundToHalf(f), RefHalf(f))) << std::hex << bits;
    ASSERT_TRUE(SameDouble(RoundToBFloat16(f), RefBFloat16(f))) << std::hex << bits;
  }
}

TEST(SixteenBitConversion, OverflowGivesInfAndNaNStaysNaN) {
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);  // below the midpoint to 2^16
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);   // tie: rounds to even = overflow
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(INFINITY), 0x7c00);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(-INFINITY), 0xff80);
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffffffffu, 0xff800001u, 0x7f80ffffu}) {
    EXPECT_TRUE(HalfIsNaN(FloatToHalf(FloatFromBits(nan)))) << std::hex << nan;
    EXPECT_TRUE(BFloat16IsNaN(FloatToBFloat16(FloatFromBits(nan)))) << std::hex << nan;
  }
}

TEST(SixteenBitConversion, UnderflowAndSignedZero) {
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);   // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);   // tie to even: zero
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -26)), 0x8000);  // keeps the sign
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(FloatFromBits(0x00000001u)), 0x0000);  // float denormal
}

TEST(SixteenBitConversion, RoundHelpersWiden) {
  EXPECT_EQ(RoundToBFloat16(0.1f), 0.10009765625f);
  EXPECT_EQ(RoundToHalf(0.1f), 0.0999755859375f);
  // semantics.md §5.7(h): bf16(f32(3/127.5)) = 0.0235595703125 (bf16 0x3CC1).
  EXPECT_EQ(FloatToBFloat16(3.0f / 127.5f), 0x3CC1);
  EXPECT_EQ(RoundToBFloat16(3.0f / 127.5f), 0.0235595703125f);
}

// ---- Quantized dtypes (semantics.md §4.3, §4.4, §9.6) ----

struct QuantDTypeCase {
  const char* name;
  const char* canonical;
  int bits;
  bool floating;
  bool is_signed;
  double min;
  double max;
  const char* target;
};

TEST(QuantDType, ParsesEveryDtypeWithRangeBitsAndTarget) {
  const QuantDTypeCase cases[] = {
      {"int1", "int1", 1, false, true, -1, 0, "int8"},
      {"int2", "int2", 2, false, true, -2, 1, "int8"},
      {"int3", "int3", 3, false, true, -4, 3, "int8"},
      {"int4", "int4", 4, false, true, -8, 7, "int8"},
      {"int8", "int8", 8, false, true, -128, 127, "int8"},
      {"uint1", "uint1", 1, false, false, 0, 1, "uint8"},
      {"uint2", "uint2", 2, false, false, 0, 3, "uint8"},
      {"uint4", "uint4", 4, false, false, 0, 15, "uint8"},
      {"uint5", "uint5", 5, false, false, 0, 31, "uint8"},
      {"uint8", "uint8", 8, false, false, 0, 255, "uint8"},
      {"float8_e4m3fn", "float8_e4m3fn", 8, true, true, -448, 448, "float8_e4m3fn"},
      {"float8_e4m3", "float8_e4m3fn", 8, true, true, -448, 448, "float8_e4m3fn"},  // alias
      {"float8_e5m2", "float8_e5m2", 8, true, true, -57344, 57344, "float8_e5m2"},
      {"float4_e2m1fn_x2", "float4_e2m1fn_x2", 4, true, true, -6, 6, "float8_e4m3fn"},
      {"float4_e2m1fn", "float4_e2m1fn_x2", 4, true, true, -6, 6, "float8_e4m3fn"},  // alias
  };
  for (const QuantDTypeCase& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_OK_AND_ASSIGN(QuantDType d, ParseQuantDType(c.name));
    EXPECT_EQ(d.name, c.canonical);
    EXPECT_EQ(d.bits, c.bits);
    EXPECT_EQ(d.is_floating_point(), c.floating);
    EXPECT_EQ(d.is_signed(), c.is_signed);
    EXPECT_EQ(d.min_value(), c.min);
    EXPECT_EQ(d.max_value(), c.max);
    EXPECT_EQ(d.target_dtype(), c.target);
  }
}

TEST(QuantDType, RejectsUnsupportedNames) {
  // semantics.md §4.3: fp16/bf16/fp32 and the fnuz formats are not quantized dtypes.
  for (const char* name : {"int0", "int9", "uint9", "int16", "float16", "bfloat16", "float32",
                           "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "int", ""}) {
    EXPECT_CODE(ParseQuantDType(name), kInvalid) << name;
  }
}

}  // namespace
}  // namespace qparams::testing
