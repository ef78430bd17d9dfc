#include "core/nvfp4.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/float8.h"
#include "core/status_macros.h"

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
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
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
  return absl::InvalidArgumentError(
      absl::StrCat("spec.convention is \"", name,
                   "\"; it must be \"\", \"compressed_tensors\" or \"modelopt\""));
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

namespace {

// The e2m1 magnitudes at nibble indices 0-7.
constexpr float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Round to nearest even among the e2m1 magnitudes, saturating at 6: the thresholds of
// compressed-tensors' cast_to_fp4, equal to ModelOpt's searchsorted with its +1 at
// 0.75, 1.75 and 3.5. NaN gives 7, as searchsorted sorts NaN last.
int E2M1Index(float magnitude) {
  if (magnitude <= 0.25f) return 0;
  if (magnitude < 0.75f) return 1;
  if (magnitude <= 1.25f) return 2;
  if (magnitude < 1.75f) return 3;
  if (magnitude <= 2.5f) return 4;
  if (magnitude < 3.5f) return 5;
  if (magnitude <= 5.0f) return 6;
  return 7;
}

absl::Status CheckQuantizable(const TensorView& x) {
  if (x.shape().empty() || x.shape().back() % kNvfp4BlockSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor.shape ", ShapeString(x.shape()),
        ": NVFP4 quantization needs a last dim that is a multiple of ", kNvfp4BlockSize));
  }
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    if (!std::isfinite(x.ValueAt(i))) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor[", i, "] is ", x.ValueAt(i), "; NVFP4 quantizes finite values"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> Nvfp4DynamicBlockCodes(const TensorView& x, float global_scale,
                                                            Nvfp4Convention convention) {
  QPARAMS_RETURN_IF_ERROR(CheckQuantizable(x));
  std::vector<uint8_t> codes(x.num_elements() / kNvfp4BlockSize);
  for (size_t b = 0; b < codes.size(); ++b) {
    double amax = 0;
    for (int64_t i = 0; i < kNvfp4BlockSize; ++i) {
      amax = std::max(amax, std::fabs(x.ValueAt(b * kNvfp4BlockSize + i)));
    }
    codes[b] = Nvfp4BlockScaleCode(amax, global_scale, x.dtype(), convention);
  }
  return codes;
}

absl::StatusOr<Nvfp4QuantizedTensor> Nvfp4QuantizeDequantize(
    const TensorView& x, const std::vector<uint8_t>& block_codes, float global_scale,
    Nvfp4Convention convention) {
  QPARAMS_RETURN_IF_ERROR(CheckQuantizable(x));
  const int64_t n = x.num_elements();
  if (static_cast<int64_t>(block_codes.size()) != n / kNvfp4BlockSize) {
    return absl::InvalidArgumentError(absl::StrCat("block_codes holds ", block_codes.size(),
                                                   " codes; the tensor has ", n / kNvfp4BlockSize,
                                                   " blocks of 16"));
  }
  const bool modelopt = convention == Nvfp4Convention::kModelOpt;
  Nvfp4QuantizedTensor out;
  out.packed.assign(n / 2, 0);
  out.dequantized.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const float code_value = Float8E4M3FnToFloat(block_codes[i / kNvfp4BlockSize]);
    const float d = modelopt ? code_value * global_scale : code_value / global_scale;
    float y = static_cast<float>(x.ValueAt(i)) / d;
    if (!modelopt) y = std::clamp(y, -6.0f, 6.0f);  // ModelOpt does not clamp
    const int index = E2M1Index(std::fabs(y));
    const bool negative = y < 0;  // -0.0 gives nibble 0x0, NaN 0x7
    const uint8_t nibble = static_cast<uint8_t>((negative ? 8 : 0) | index);
    out.packed[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? nibble : nibble << 4);
    // Nibble 0x8 is -0.0 in compressed-tensors and +0.0 in ModelOpt's e2m1_values.
    float v = negative ? -kE2M1Magnitudes[index] : kE2M1Magnitudes[index];
    if (nibble == 0x8 && modelopt) v = 0.0f;
    out.dequantized[i] = v * d;
  }
  return out;
}

}  // namespace qparams
