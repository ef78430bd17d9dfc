#include "core/float8.h"

#include "core/dtype.h"

namespace qparams {

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
