#include "core/float8.h"

#include <cmath>
#include <limits>

#include "core/dtype.h"

namespace qparams {

float Float8E4M3FnToFloat(uint8_t code) {
  const bool negative = (code & 0x80) != 0;
  const int exponent = (code >> 3) & 15;
  const int mantissa = code & 7;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  }
  return negative ? -magnitude : magnitude;
}

uint8_t FloatToFloat8E4M3Fn(float value) {
  uint32_t bits = FloatBits(value);
  const uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  uint8_t code;
  if (bits >= 0x43F00000u) {  // 480.0 and above, infinities and NaN
    code = 0x7F;
  } else if (bits < 0x3C800000u) {  // below 2^-6: the subnormals and zero
    // Adding 2^14 leaves the subnormal's code in the low mantissa bits, rounded by
    // the float addition itself (round to nearest even).
    code = static_cast<uint8_t>(FloatBits(FloatFromBits(bits) + 16384.0f) - 0x46800000u);
  } else {
    // Rebias the exponent from 127 to 7 and round the 20 dropped mantissa bits to
    // nearest even.
    const uint32_t mantissa_odd = (bits >> 20) & 1;
    code = static_cast<uint8_t>(((bits - (120u << 23) + 0x7FFFFu + mantissa_odd) >> 20) & 0xFF);
  }
  return static_cast<uint8_t>(code | (sign >> 24));
}

}  // namespace qparams
