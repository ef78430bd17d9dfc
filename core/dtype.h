// Element types: the floating-point dtypes a tensor arrives in (and that qparams are
// computed in), the quantized dtypes a spec names, and exact conversions between
// float32 and the 16-bit formats.

#ifndef QPARAMS_CORE_DTYPE_H_
#define QPARAMS_CORE_DTYPE_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qparams {

// The dtype of an input tensor, which is also the working precision `P` of the
// range and of the computed qparams (semantics.md §2.3).
enum class DType { kFloat32, kFloat16, kBFloat16, kFloat64 };

// Bytes per element: 4, 2, 2 or 8.
int ItemSize(DType dtype);

// The PyTorch name: "float32", "float16", "bfloat16", "float64".
absl::string_view DTypeName(DType dtype);

// Parses a PyTorch name (as DTypeName prints it). INVALID_ARGUMENT otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Bit casts between float and its IEEE-754 encoding.
inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float FloatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// bfloat16 and IEEE half, widened exactly and narrowed with round-to-nearest-even
// (NaN stays NaN, overflow gives Inf), as PyTorch's CPU kernels do.
// (Inline: the NVFP4 block codes round to bfloat16 a block, a million times a weight.)
inline float BFloat16ToFloat(uint16_t bits) { return FloatFromBits(uint32_t{bits} << 16); }
inline uint16_t FloatToBFloat16(float value) {
  uint32_t u = FloatBits(value);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even; carries into the exponent on overflow
  return static_cast<uint16_t>(u >> 16);
}
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

// `value` rounded to the nearest bfloat16 / half, returned widened to float.
inline float RoundToBFloat16(float value) { return BFloat16ToFloat(FloatToBFloat16(value)); }
inline float RoundToHalf(float value) { return HalfToFloat(FloatToHalf(value)); }

// A quantized dtype of a spec: "int8", "uint4", "float8_e4m3fn", ... (semantics.md §4.3).
struct QuantDType {
  enum class Kind { kSignedInt, kUnsignedInt, kFloat };

  std::string name;  // canonical name, never an alias
  Kind kind = Kind::kSignedInt;
  int bits = 8;

  // True for the float8/float4 formats (PyTorch's `dtype.is_floating_point`).
  bool is_floating_point() const { return kind == Kind::kFloat; }
  bool is_signed() const { return kind != Kind::kUnsignedInt; }

  // The format's full range: (-2^(n-1), 2^(n-1)-1), (0, 2^n-1), or the float format's
  // (-max, max) (fp4: ±6).
  double min_value() const;
  double max_value() const;

  // torchao's target dtype (§4.4): int8/uint8 for integers of at most 8 bits,
  // float8_e4m3fn for float4_e2m1fn_x2, otherwise the dtype itself.
  std::string target_dtype() const;
};

// Parses a quantized dtype name: intN / uintN with 1 <= N <= 8, float8_e4m3fn,
// float8_e5m2, float4_e2m1fn_x2, and the aliases float8_e4m3 and float4_e2m1fn.
// INVALID_ARGUMENT listing the allowed names otherwise.
absl::StatusOr<QuantDType> ParseQuantDType(absl::string_view name);

}  // namespace qparams

#endif  // QPARAMS_CORE_DTYPE_H_
