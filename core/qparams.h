// The numerics of a forward once the block range is known: float_range handling
// (semantics.md §2.1), the running-range updates (§1.5), and qparams from a range —
// torchao's choose_qparams_affine_with_min_max, minval and the e8m0 path (§5–§7) —
// each elementwise op rounded to the working precision as PyTorch's CPU kernels do.

#ifndef QPARAMS_CORE_QPARAMS_H_
#define QPARAMS_CORE_QPARAMS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "core/dtype.h"
#include "core/nvfp4.h"
#include "core/quant_spec.h"
#include "core/range.h"
#include "core/tensor.h"

namespace qparams {

// Scale, zero point and minval of N blocks: a forward's result or a calculator's
// buffers. Empty buffers (before the first computing forward) have shape [0].
// An NVFP4 spec (scale_dtype float8_e4m3fn) fills scale_e4m3, global_scale and amax
// instead of zero point and minval (nvfp4.md §3.5), and leaves `scale` empty: the
// block scales' values are those of the e4m3 codes, decoded where a float is needed
// (ScaleValues; the wire's QParams.scale carries them). A forward over a large weight
// then writes one byte a block instead of five.
struct QParams {
  Shape shape = {0};
  std::vector<float> scale;
  std::vector<uint8_t> scale_e4m3;    // NVFP4: each block scale's float8_e4m3fn code
  std::optional<float> global_scale;  // NVFP4: gs (compressed_tensors) or scale_2 (modelopt)
  std::optional<float> amax;          // NVFP4: the tensor amax A, widened from P
  std::vector<int32_t> zero_point;    // empty unless has_zero_point
  std::vector<float> minval;          // empty unless has_minval
  bool has_zero_point = false;        // false for floating-point dtypes and e8m0 scales
  bool has_minval = false;
  std::optional<DType> precision;  // the working precision P; unset while empty

  // Empty buffers for a calculator whose spec gives has_zero_point/has_minval.
  static QParams Empty(bool has_zero_point, bool has_minval);

  friend bool operator==(const QParams& a, const QParams& b);
};

// The scales as floats: `scale`, or for NVFP4 block scales the values of the
// scale_e4m3 codes (Float8E4M3FnToFloat). Thread-safe.
std::vector<float> ScaleValues(const QParams& q);

// The number of scales (blocks): scale_e4m3's size for NVFP4 block scales, else
// scale's. Thread-safe.
size_t ScaleCount(const QParams& q);

// A range in working precision P, shape N. Every value is exactly representable in
// P; double holds all four precisions exactly.
struct WorkingRange {
  DType precision = DType::kFloat32;
  Shape shape;
  std::vector<double> lo;
  std::vector<double> hi;
};

// A WorkingRange kept for a long time (a calculator's running range) in four bytes a
// value when float holds every value exactly, as it does for float32, float16 and
// bfloat16 precisions, and in eight otherwise: a session's running range then costs
// what coreai_opt's two float32 buffers do.
class StoredRange {
 public:
  StoredRange() = default;
  explicit StoredRange(const WorkingRange& range) { Assign(range); }

  // Replaces the stored range, reusing the storage when the size is unchanged.
  void Assign(const WorkingRange& range);

  // The range, exactly as stored.
  WorkingRange Get() const;

 private:
  DType precision_ = DType::kFloat32;
  Shape shape_;
  std::vector<float> lo32_, hi32_;   // when every value fits a float exactly
  std::vector<double> lo64_, hi64_;  // otherwise
};

// The constants qparams_from_range needs, taken from a resolved spec.
struct QParamsRecipe {
  bool symmetric = true;  // SYMMETRIC and SYMMETRIC_WITH_CLIPPING
  double quant_min = -128;
  double quant_max = 127;
  bool has_zero_point = true;            // integer dtypes; false for FP dtypes (their minval too)
  std::optional<int> e8m0_target;        // the e8m0 path's target exponent t (§7)
  std::optional<Nvfp4Convention> nvfp4;  // scale_dtype float8_e4m3fn: the NVFP4 path

  // `resolved_spec` must come from QuantSpec::Resolve().
  static QParamsRecipe FromSpec(const QuantSpec& resolved_spec);
};

// float32 machine epsilon, the scale floor coreai_opt passes to torchao.
inline constexpr double kScaleEps = 1.1920928955078125e-07;

// get_range after the range calculator (§2.1): the observed block range clamped to
// include 0, with a set float_range bound replacing the observed one. Both bounds set
// gives float32 fills of shape `counts` and ignores `observed` (which may be null).
WorkingRange GetRange(const BlockRange* observed, const Shape& counts, const FloatRange& bounds);

// moving_average: running := P(P(c·range) + P((1−c)·running)), elementwise, with
// c and 1−c (computed in double) entering as float32 (as double for float64).
WorkingRange MovingAverageUpdate(double averaging_constant, const WorkingRange& range,
                                 const WorkingRange& running);

// global_minmax: running := (min(running.lo, range.lo), max(running.hi, range.hi)).
WorkingRange GlobalMinMaxUpdate(const WorkingRange& range, const WorkingRange& running);

// qparams_from_range: scale, zero point and minval of every block (§5–§7), or the
// NVFP4 scales (nvfp4.md §3) when the recipe says so.
QParams QParamsFromRange(const QParamsRecipe& recipe, const WorkingRange& range);

// The NVFP4 qparams of a whole tensor `x` in blocks of `block`, as QParamsFromRange
// gives them on GetRange(ObserveRange(x, block)) without float_range, bit for bit, in
// one fused pass (ComputeNvfp4ScalesOfTensor); unset where that is (a block shape
// other than runs along the last axis, a non-finite value).
std::optional<QParams> Nvfp4QParamsFromTensor(Nvfp4Convention convention, const TensorView& x,
                                              const Shape& block);

}  // namespace qparams

#endif  // QPARAMS_CORE_QPARAMS_H_
