#include "core/dtype.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace qparams {

int ItemSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat64:
      return 8;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat64:
      return "float64";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    if (name == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown tensor dtype \"", name, "\"; allowed: float32, float16, bfloat16, float64"));
}

// The two half conversions follow Marat Dukhan's FP16 library (MIT): float arithmetic
// does the rounding, so they are exact RNE without a table or a branch per case.
float HalfToFloat(uint16_t bits) {
  const uint32_t w = uint32_t{bits} << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normalized = FloatFromBits((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = FloatFromBits((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t magnitude = two_w < (1u << 27) ? FloatBits(denormalized) : FloatBits(normalized);
  return FloatFromBits(sign | magnitude);
}

uint16_t FloatToHalf(float value) {
  float base = (std::fabs(value) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t w = FloatBits(value);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = FloatFromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = FloatBits(base);
  const uint32_t exp_bits = (b >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = b & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

double QuantDType::min_value() const {
  switch (kind) {
    case Kind::kSignedInt:
      return -std::ldexp(1.0, bits - 1);
    case Kind::kUnsignedInt:
      return 0.0;
    case Kind::kFloat:
      return -max_value();
  }
  return 0.0;
}

double QuantDType::max_value() const {
  switch (kind) {
    case Kind::kSignedInt:
      return std::ldexp(1.0, bits - 1) - 1.0;
    case Kind::kUnsignedInt:
      return std::ldexp(1.0, bits) - 1.0;
    case Kind::kFloat:
      if (name == "float8_e4m3fn") return 448.0;
      if (name == "float8_e5m2") return 57344.0;
      return 6.0;  // float4_e2m1fn_x2
  }
  return 0.0;
}

std::string QuantDType::target_dtype() const {
  switch (kind) {
    case Kind::kSignedInt:
      return "int8";
    case Kind::kUnsignedInt:
      return "uint8";
    case Kind::kFloat:
      return name == "float4_e2m1fn_x2" ? "float8_e4m3fn" : name;
  }
  return name;
}

absl::StatusOr<QuantDType> ParseQuantDType(absl::string_view name) {
  if (name == "float8_e4m3fn" || name == "float8_e4m3") {
    return QuantDType{"float8_e4m3fn", QuantDType::Kind::kFloat, 8};
  }
  if (name == "float8_e5m2") return QuantDType{"float8_e5m2", QuantDType::Kind::kFloat, 8};
  if (name == "float4_e2m1fn_x2" || name == "float4_e2m1fn") {
    return QuantDType{"float4_e2m1fn_x2", QuantDType::Kind::kFloat, 4};
  }
  for (auto [prefix, kind] : {std::pair{absl::string_view("uint"), QuantDType::Kind::kUnsignedInt},
                              std::pair{absl::string_view("int"), QuantDType::Kind::kSignedInt}}) {
    absl::string_view width = name;
    int bits = 0;
    if (absl::ConsumePrefix(&width, prefix) && width.size() == 1 &&
        absl::SimpleAtoi(width, &bits) && bits >= 1 && bits <= 8) {
      return QuantDType{absl::StrCat(prefix, bits), kind, bits};
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.dtype: unsupported dtype \"", name,
      "\"; allowed: int1..int8, uint1..uint8, float8_e4m3fn (alias float8_e4m3), float8_e5m2, "
      "float4_e2m1fn_x2 (alias float4_e2m1fn)"));
}

}  // namespace qparams
