// float8_e4m3fn (1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits, no
// infinity, NaN 0x7F/0xFF, maximum 448), converted as torch's CPU
// `.to(torch.float8_e4m3fn)` does (nvfp4.md §3.4).

#ifndef QPARAMS_CORE_FLOAT8_H_
#define QPARAMS_CORE_FLOAT8_H_

#include <cstdint>

namespace qparams {

// The value of byte `code`: NaN for 0x7F and 0xFF, ±m·2^-9 for the subnormals, and
// ±0.0 with the sign bit kept. Exact (every e4m3 value is a float32). Thread-safe.
float Float8E4M3FnToFloat(uint8_t code);

// The e4m3 code of `value`: round to nearest, ties to the even code
// (c10::detail::fp8e4m3fn_from_fp32_value). It does not saturate: |value| > 464,
// infinities and NaN give NaN (0x7F with the sign bit of `value`); 448 < |value| <=
// 464 gives 448. The sign of zero is kept. Thread-safe.
uint8_t FloatToFloat8E4M3Fn(float value);

}  // namespace qparams

#endif  // QPARAMS_CORE_FLOAT8_H_
