// float8_e4m3fn (1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits, no
// infinity, NaN 0x7F/0xFF, maximum 448), converted as torch's CPU
// `.to(torch.float8_e4m3fn)` does (nvfp4.md §3.4).

#ifndef QPARAMS_CORE_FLOAT8_H_
#define QPARAMS_CORE_FLOAT8_H_

#include <array>
#include <cstdint>
#include <limits>

namespace qparams {
namespace float8_internal {

// The 256 values, built at compile time from the encoding's definition: the block
// scale paths decode a code a block, millions a tensor, and a table is what keeps
// that off their profile. Exact: each value is a small integer times a power of two.
constexpr std::array<float, 256> E4M3Values() {
  std::array<float, 256> values{};
  for (int code = 0; code < 256; ++code) {
    const int exponent = (code >> 3) & 15;
    const int mantissa = code & 7;
    float magnitude = 0.0f;
    if (exponent == 15 && mantissa == 7) {
      magnitude = std::numeric_limits<float>::quiet_NaN();
    } else if (exponent == 0) {
      magnitude = static_cast<float>(mantissa) * 0x1p-9f;
    } else {
      magnitude = 1.0f + static_cast<float>(mantissa) / 8.0f;
      for (int e = exponent; e < 7; ++e) magnitude *= 0.5f;
      for (int e = 7; e < exponent; ++e) magnitude *= 2.0f;
    }
    values[code] = (code & 0x80) != 0 ? -magnitude : magnitude;
  }
  return values;
}

inline constexpr std::array<float, 256> kE4M3Values = E4M3Values();

}  // namespace float8_internal

// The value of byte `code`: NaN for 0x7F and 0xFF, ±m·2^-9 for the subnormals, and
// ±0.0 with the sign bit kept. Exact (every e4m3 value is a float32). Thread-safe.
inline float Float8E4M3FnToFloat(uint8_t code) { return float8_internal::kE4M3Values[code]; }

// The e4m3 code of `value`: round to nearest, ties to the even code
// (c10::detail::fp8e4m3fn_from_fp32_value). It does not saturate: |value| > 464,
// infinities and NaN give NaN (0x7F with the sign bit of `value`); 448 < |value| <=
// 464 gives 448. The sign of zero is kept. Thread-safe.
uint8_t FloatToFloat8E4M3Fn(float value);

}  // namespace qparams

#endif  // QPARAMS_CORE_FLOAT8_H_
