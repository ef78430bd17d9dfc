#include "core/nvfp4.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/float8.h"

namespace qparams {
namespace {

// The e4m3 maximum times the e2m1 maximum, 448.0 * 6.0 in both libraries (exact).
constexpr double kE4M3TimesE2M1Max = 2688.0;
constexpr float kE4M3Max = 448.0f;
// compressed-tensors' _get_dtype_eps(float8_e4m3fn), the code of 0.125.
constexpr uint8_t kCompressedTensorsZeroBlockCode = 0x20;

// fl_P of a value computed in float (§1: a 16-bit op runs in float, then rounds).
float RoundTo(DType precision, float v) {
  switch (precision) {
    case DType::kBFloat16:
      return RoundToBFloat16(v);
    case DType::kFloat16:
      return RoundToHalf(v);
    default:
      return v;
  }
}

// torch.finfo(P).tiny.
double Tiny(DType precision) {
  switch (precision) {
    case DType::kFloat16:
      return 0x1.0p-14;
    case DType::kFloat64:
      return std::numeric_limits<double>::min();
    default:
      return 0x1.0p-126;
  }
}

// torch.max / torch.clamp keep NaN; std::max and std::min would drop it.
double NanMax(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN()
                                        : std::max(a, b);
}

// compressed-tensors generate_gparam: 448.0 * 6.0 / max(A, tiny) in P, which torch
// computes as a reciprocal and a product (Tensor.__rtruediv__), not a division.
float CompressedTensorsGlobalScale(double amax, DType precision) {
  const double a = NanMax(amax, Tiny(precision));
  double g;
  if (precision == DType::kFloat64) {
    g = (1.0 / a) * kE4M3TimesE2M1Max;
  } else {
    const float r = RoundTo(precision, 1.0f / static_cast<float>(a));
    g = RoundTo(precision, r * static_cast<float>(kE4M3TimesE2M1Max));
  }
  if (!std::isfinite(g)) g = 1.0;  // nan_to_num(nan=1.0, posinf=1.0, neginf=1.0)
  return static_cast<float>(g);
}

// ModelOpt get_weights_scaling_factor_2, in float32 after .float(), with the
// service's floor at 2^-126 (nvfp4.md §8 item 8).
float ModelOptGlobalScale(double amax) {
  const float a = std::max(static_cast<float>(amax), 0x1.0p-126f);
  return a / static_cast<float>(kE4M3TimesE2M1Max);
}

uint8_t CompressedTensorsBlockCode(double block_amax, float global_scale, DType precision) {
  double s;
  if (precision == DType::kFloat64) {
    // gs * t promotes to float64; the e4m3 cast then goes through float32.
    s = static_cast<double>(global_scale) * (block_amax / 6.0);
  } else {
    const float t = RoundTo(precision, static_cast<float>(block_amax) / 6.0f);
    s = global_scale * t;  // float32 by type promotion, whatever P is
  }
  s = std::isnan(s) ? s : std::clamp(s, -448.0, 448.0);
  uint8_t code = FloatToFloat8E4M3Fn(static_cast<float>(s));
  // torch.where(scales == 0, eps, scales): an all-zero block, or one whose scale
  // underflows e4m3.
  if (Float8E4M3FnToFloat(code) == 0.0f) code = kCompressedTensorsZeroBlockCode;
  return code;
}

uint8_t ModelOptBlockCode(double block_amax, float global_scale) {
  const float den = 6.0f * global_scale;
  float s = static_cast<float>(block_amax) / den;
  if (s == 0.0f) s = 1.0f;  // before the cast: an underflowed block keeps code 0x00
  if (!std::isnan(s)) s = std::min(s, kE4M3Max);
  return FloatToFloat8E4M3Fn(s);
}

}  // namespace

absl::string_view Nvfp4ConventionName(Nvfp4Convention convention) {
  return convention == Nvfp4Convention::kModelOpt ? "modelopt" : "compressed_tensors";
}

absl::StatusOr<Nvfp4Convention> ParseNvfp4Convention(absl::string_view name) {
  if (name.empty() || name == "compressed_tensors") return Nvfp4Convention::kCompressedTensors;
  if (name == "modelopt") return Nvfp4Convention::kModelOpt;
  return absl::InvalidArgumentError(absl::StrCat(
      "spec.convention is \"", name, "\"; it must be \"\", \"compressed_tensors\" or \"modelopt\""));
}

double Nvfp4BlockAmax(double lo, double hi) {
  return NanMax(std::fabs(std::min(lo, 0.0)), std::fabs(std::max(hi, 0.0)));
}

float Nvfp4GlobalScale(double amax, DType precision, Nvfp4Convention convention) {
  return convention == Nvfp4Convention::kModelOpt ? ModelOptGlobalScale(amax)
                                                  : CompressedTensorsGlobalScale(amax, precision);
}

uint8_t Nvfp4BlockScaleCode(double block_amax, float global_scale, DType precision,
                            Nvfp4Convention convention) {
  return convention == Nvfp4Convention::kModelOpt
             ? ModelOptBlockCode(block_amax, global_scale)
             : CompressedTensorsBlockCode(block_amax, global_scale, precision);
}

Nvfp4Scales ComputeNvfp4Scales(const std::vector<double>& lo, const std::vector<double>& hi,
                               DType precision, Nvfp4Convention convention) {
  std::vector<double> block_amax(lo.size());
  double amax = 0;
  for (size_t i = 0; i < lo.size(); ++i) {
    block_amax[i] = Nvfp4BlockAmax(lo[i], hi[i]);
    amax = NanMax(amax, block_amax[i]);
  }
  Nvfp4Scales scales;
  scales.amax = static_cast<float>(amax);
  scales.global_scale = Nvfp4GlobalScale(amax, precision, convention);
  scales.e4m3.resize(lo.size());
  for (size_t i = 0; i < lo.size(); ++i) {
    scales.e4m3[i] = Nvfp4BlockScaleCode(block_amax[i], scales.global_scale, precision, convention);
  }
  return scales;
}

}  // namespace qparams
