// float8_e4m3fn decoding over every code and encoding at its rounding edges
// (nvfp4.md §3.4).

#include "core/float8.h"

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "gtest/gtest.h"

namespace qparams::testing {
namespace {

// The value of a code from its fields, written independently of the decoder.
double ReferenceValue(int code) {
  const int e = (code >> 3) & 15;
  const int m = code & 7;
  const double magnitude = e == 0 ? m * std::ldexp(1.0, -9) : (8 + m) * std::ldexp(1.0, e - 10);
  return (code & 0x80) ? -magnitude : magnitude;
}

TEST(Float8E4M3Fn, DecodesEveryCode) {
  for (int code = 0; code < 256; ++code) {
    const float v = Float8E4M3FnToFloat(static_cast<uint8_t>(code));
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << code;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), ReferenceValue(code)) << code;
    EXPECT_EQ(std::signbit(v), (code & 0x80) != 0) << code;
  }
  EXPECT_EQ(Float8E4M3FnToFloat(0x7E), 448.0f);
  EXPECT_EQ(Float8E4M3FnToFloat(0x08), 0x1.0p-6f);
  EXPECT_EQ(Float8E4M3FnToFloat(0x01), 0x1.0p-9f);
  EXPECT_EQ(Float8E4M3FnToFloat(0x07), 7 * 0x1.0p-9f);
  EXPECT_EQ(Float8E4M3FnToFloat(0x20), 0.125f);
  EXPECT_EQ(Float8E4M3FnToFloat(0x38), 1.0f);
}

TEST(Float8E4M3Fn, EveryFiniteCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    EXPECT_EQ(FloatToFloat8E4M3Fn(Float8E4M3FnToFloat(static_cast<uint8_t>(code))), code) << code;
  }
}

// Nearest value, ties to the even code, by scanning the 127 finite magnitudes.
uint8_t ReferenceEncode(float x) {
  const double a = std::fabs(static_cast<double>(x));
  int best = 0;
  for (int code = 1; code < 0x7F; ++code) {
    const double d = std::fabs(ReferenceValue(code) - a);
    const double best_d = std::fabs(ReferenceValue(best) - a);
    if (d < best_d || (d == best_d && code % 2 == 0)) best = code;
  }
  if (a > 464) best = 0x7F;
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

TEST(Float8E4M3Fn, EncodesMidpointsAndNeighboursLikeTheNearestEvenScan) {
  for (int code = 0; code < 0x7E; ++code) {
    const double lo = ReferenceValue(code), hi = ReferenceValue(code + 1);
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: a few bits more
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)}) {
      EXPECT_EQ(FloatToFloat8E4M3Fn(x), ReferenceEncode(x)) << x;
      EXPECT_EQ(FloatToFloat8E4M3Fn(-x), ReferenceEncode(-x)) << -x;
    }
  }
}

TEST(Float8E4M3Fn, RoundsTiesToTheEvenCode) {
  EXPECT_EQ(FloatToFloat8E4M3Fn(1.0625f), 0x38);  // between 1.0 (0x38) and 1.125 (0x39)
  EXPECT_EQ(FloatToFloat8E4M3Fn(1.1875f), 0x3A);  // between 1.125 and 1.25 (0x3A)
  EXPECT_EQ(FloatToFloat8E4M3Fn(std::nextafter(1.0625f, 2.0f)), 0x39);
  EXPECT_EQ(FloatToFloat8E4M3Fn(400.0f), 0x7C);  // between 384 (0x7C) and 416 (0x7D)
}

TEST(Float8E4M3Fn, DoesNotSaturateAbove464) {
  EXPECT_EQ(FloatToFloat8E4M3Fn(448.0f), 0x7E);
  EXPECT_EQ(FloatToFloat8E4M3Fn(456.0f), 0x7E);
  EXPECT_EQ(FloatToFloat8E4M3Fn(464.0f), 0x7E);  // the tie with 480 resolves to 448
  EXPECT_EQ(FloatToFloat8E4M3Fn(std::nextafter(464.0f, 500.0f)), 0x7F);
  EXPECT_EQ(FloatToFloat8E4M3Fn(480.0f), 0x7F);
  EXPECT_EQ(FloatToFloat8E4M3Fn(-480.0f), 0xFF);
  EXPECT_EQ(FloatToFloat8E4M3Fn(1e30f), 0x7F);
  EXPECT_EQ(FloatToFloat8E4M3Fn(INFINITY), 0x7F);
  EXPECT_EQ(FloatToFloat8E4M3Fn(-INFINITY), 0xFF);
  EXPECT_EQ(FloatToFloat8E4M3Fn(NAN) & 0x7F, 0x7F);
}

TEST(Float8E4M3Fn, RoundsSubnormalsAndKeepsTheSignOfZero) {
  EXPECT_EQ(FloatToFloat8E4M3Fn(0.0f), 0x00);
  EXPECT_EQ(FloatToFloat8E4M3Fn(-0.0f), 0x80);
  EXPECT_EQ(FloatToFloat8E4M3Fn(0x1.0p-10f), 0x00);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(FloatToFloat8E4M3Fn(std::nextafter(0x1.0p-10f, 1.0f)), 0x01);
  EXPECT_EQ(FloatToFloat8E4M3Fn(-0x1.0p-11f), 0x80);       // a negative that rounds to zero
  EXPECT_EQ(FloatToFloat8E4M3Fn(1.5f * 0x1.0p-9f), 0x02);  // tie between 1 and 2: even
  EXPECT_EQ(FloatToFloat8E4M3Fn(2.5f * 0x1.0p-9f), 0x02);  // tie between 2 and 3: even
  EXPECT_EQ(FloatToFloat8E4M3Fn(7.5f * 0x1.0p-9f), 0x08);  // tie to the smallest normal
  EXPECT_EQ(FloatToFloat8E4M3Fn(0x1.0p-6f), 0x08);
  EXPECT_EQ(FloatToFloat8E4M3Fn(0x1.0p-149f), 0x00);
}

TEST(Float8E4M3Fn, MatchesTheNearestEvenScanOnAGridOfFloats) {
  // Every 2^12-th float32 pattern up to 480, both signs.
  for (uint32_t bits = 0; bits <= 0x43F00000u; bits += 1u << 12) {
    const float x = FloatFromBits(bits);
    ASSERT_EQ(FloatToFloat8E4M3Fn(x), ReferenceEncode(x)) << x;
    ASSERT_EQ(FloatToFloat8E4M3Fn(-x), ReferenceEncode(-x)) << -x;
  }
}

}  // namespace
}  // namespace qparams::testing
