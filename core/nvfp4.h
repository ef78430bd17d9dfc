// The NVFP4 two-level scales (nvfp4.md §3): one float32 global scale per tensor and a
// float8_e4m3fn scale per block, computed from a block range (lo, hi) in working
// precision P as compressed-tensors or ModelOpt compute them. The one place of this
// arithmetic: the calculators (through QParamsFromRange) and, later, the scale
// groups (§4) call it.

#ifndef QPARAMS_CORE_NVFP4_H_
#define QPARAMS_CORE_NVFP4_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace qparams {

// The checkpoint format whose arithmetic the scales follow.
enum class Nvfp4Convention { kCompressedTensors, kModelOpt };

// "compressed_tensors" or "modelopt": the spec's spelling.
absl::string_view Nvfp4ConventionName(Nvfp4Convention convention);

// Parses a spec's convention: "" (the default, compressed_tensors),
// "compressed_tensors" or "modelopt", spelled exactly so. INVALID_ARGUMENT naming
// spec.convention and the allowed spellings otherwise.
absl::StatusOr<Nvfp4Convention> ParseNvfp4Convention(absl::string_view name);

// The block amax max(|min(lo, 0)|, |max(hi, 0)|) (§3.1): exact in any precision.
double Nvfp4BlockAmax(double lo, double hi);

// The global scale of a tensor whose amax is `amax` (exact in `precision`): gs of
// §3.2 (compressed-tensors generate_gparam: reciprocal, then times 2688, in P; 1.0
// when that is not finite) or scale_2 of §3.3 (ModelOpt: f32(max(amax, 2^-126) /
// 2688)). Thread-safe.
float Nvfp4GlobalScale(double amax, DType precision, Nvfp4Convention convention);

// The e4m3 code of a block whose amax is `block_amax` (exact in `precision`), given
// the tensor's `global_scale` from Nvfp4GlobalScale (§3.2 / §3.3 block steps,
// including each convention's rule for zero and underflowed blocks). Thread-safe.
uint8_t Nvfp4BlockScaleCode(double block_amax, float global_scale, DType precision,
                            Nvfp4Convention convention);

struct Nvfp4Scales {
  std::vector<uint8_t> e4m3;  // one code per block
  float global_scale = 1.0f;  // gs (compressed_tensors) or scale_2 (modelopt)
  float amax = 0.0f;          // A, widened to float32, before ModelOpt's floor
};

// The scales of the blocks whose ranges are lo[i], hi[i] (equal lengths, at least one
// block, every value exact in `precision`): A is the largest block amax. Thread-safe.
Nvfp4Scales ComputeNvfp4Scales(const std::vector<double>& lo, const std::vector<double>& hi,
                               DType precision, Nvfp4Convention convention);

// The same scales for a whole tensor `x` in blocks of `block` (the block-size vector
// of its granularity), P = x's dtype: bit for bit what ComputeNvfp4Scales gives on the
// range ObserveRange and GetRange (no float_range) make of x, in one pass over x and
// one over the block amax, on the range pass's threads (RangeThreadsFor). Only for
// blocks of consecutive elements along the last axis (every other entry of `block`
// 1); unset for any other block shape, and for an x holding a non-finite value, whose
// error the range pass reports. Thread-safe.
std::optional<Nvfp4Scales> ComputeNvfp4ScalesOfTensor(const TensorView& x, const Shape& block,
                                                      Nvfp4Convention convention);

// ---- §5: quantize, dequantize and pack (for clients and tests; no calculator
// calls these) ----

// Elements per block along the last axis in §5 and in the checkpoints.
inline constexpr int64_t kNvfp4BlockSize = 16;

// The block codes of a dynamic quantization: each block of 16 consecutive elements
// along the last axis gets the code of its own amax (in x's dtype) with the fixed
// `global_scale` (§5, dynamic activations; the 448 clamps apply). INVALID_ARGUMENT
// for a scalar, a last dim that is not a multiple of 16, or a non-finite element.
// Thread-safe.
absl::StatusOr<std::vector<uint8_t>> Nvfp4DynamicBlockCodes(const TensorView& x, float global_scale,
                                                            Nvfp4Convention convention);

struct Nvfp4QuantizedTensor {
  // Two e2m1 nibbles a byte along the last axis, element 2i low: shape [..., n/2].
  std::vector<uint8_t> packed;
  std::vector<float> dequantized;  // x's shape, float32
};

// x quantized to e2m1 with the block codes `block_codes` (one a block of 16 along
// the last axis, in x's element order) and `global_scale`, packed, and dequantized
// again, as the convention's quantize/dequantize do (§5: its dequantization scale,
// clamp, sign of zero and nibbles of code-0x00 blocks). INVALID_ARGUMENT as for
// Nvfp4DynamicBlockCodes, or when block_codes has not one code a block.
// Thread-safe.
absl::StatusOr<Nvfp4QuantizedTensor> Nvfp4QuantizeDequantize(
    const TensorView& x, const std::vector<uint8_t>& block_codes, float global_scale,
    Nvfp4Convention convention);

}  // namespace qparams

#endif  // QPARAMS_CORE_NVFP4_H_
