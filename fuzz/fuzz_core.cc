// libFuzzer target: arbitrary specs, calculators, tensors and states through the
// core (no RPC). A FuzzedDataProvider builds a QuantSpec (known names and random
// strings), a calculator, then a short program of operations on it: forwards of
// tensors (rank 1-4, small dims, raw bytes) and of range observations, granularity
// and export-mode changes, state export/restore (faithful and mutated), and the
// numerics' building blocks on their own.
//
// Checked besides crashes and sanitizer reports:
//   * ObserveRange equals a naive per-block min/max, on every kernel level the CPU
//     has, and fails exactly when the tensor holds a NaN or an infinity;
//   * a forward of a tensor and of its ObserveRange range give the same qparams, the
//     same state afterwards, or the same status code;
//   * the qparams of a successful forward have the block-count shape and sizes;
//   * ExportState -> CreateFromState -> ExportState gives the same state, for every
//     state a calculator reaches (a reachable state must be restorable);
//   * a failed forward changes nothing; SetGranularity/SetExportMode obey their rules.

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/calculator_state.h"
#include "core/dtype.h"
#include "core/granularity.h"
#include "core/observation.h"
#include "core/qparams.h"
#include "core/qparams_calculator.h"
#include "core/quant_spec.h"
#include "core/range.h"
#include "core/range_kernels.h"
#include "core/registry.h"
#include "core/tensor.h"

namespace qparams {
namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_core: invariant violated: %s\n", what.c_str());
  __builtin_trap();
}

void Check(bool ok, const std::string& what) {
  if (!ok) Fail(what);
}

// ---- Building values from fuzz data ----

constexpr const char* kDTypes[] = {
    "int8",  "uint8", "int4",          "uint4",       "int2",          "uint2",
    "int1",  "uint1", "int7",          "uint7",       "float8_e4m3fn", "float8_e5m2",
    "float4_e2m1fn_x2", "float8_e4m3", "float4_e2m1fn", "int9",        "int0",
    "float16"};
constexpr const char* kScaleDTypes[] = {"", "float8_e8m0fnu", "float8_e8m0", "float32"};
constexpr const char* kCalculators[] = {"static", "moving_average", "global_minmax",
                                        "dynamic", "default", "", "nope"};

double SpecialDouble(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange(0, 11)) {
    case 0: return 0.0;
    case 1: return -0.0;
    case 2: return std::numeric_limits<double>::quiet_NaN();
    case 3: return std::numeric_limits<double>::infinity();
    case 4: return -std::numeric_limits<double>::infinity();
    case 5: return std::numeric_limits<double>::max();
    case 6: return -std::numeric_limits<double>::max();
    case 7: return std::numeric_limits<double>::denorm_min();
    case 8: return 1e300 * (fdp.ConsumeBool() ? 1 : -1);
    case 9: return fdp.ConsumeFloatingPoint<double>();
    case 10: return fdp.ConsumeIntegralInRange<int>(-300, 300);
    default: return fdp.ConsumeFloatingPointInRange<double>(-8, 8);
  }
}

int64_t BlockSize(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange(0, 7)) {
    case 0: return -1;
    case 1: return 0;
    case 2: return fdp.ConsumeIntegral<int64_t>();
    default: return fdp.ConsumeIntegralInRange<int64_t>(1, 8);
  }
}

Granularity MakeGranularity(FuzzedDataProvider& fdp) {
  switch (fdp.ConsumeIntegralInRange(0, 4)) {
    case 0:
      return Granularity::PerTensor();
    case 1:
      return Granularity::PerChannel(fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange(-5, 5)
                                                       : fdp.ConsumeIntegral<int64_t>());
    case 2:
      return Granularity::PerBlock(fdp.ConsumeIntegralInRange<int64_t>(-5, 5), BlockSize(fdp));
    case 3: {
      std::vector<int64_t> sizes(fdp.ConsumeIntegralInRange(0, 5));
      for (int64_t& b : sizes) b = BlockSize(fdp);
      return Granularity::PerBlock(std::move(sizes));
    }
    default: {  // the wire form in general: an axis and any number of sizes
      std::optional<int64_t> axis;
      if (fdp.ConsumeBool()) axis = fdp.ConsumeIntegralInRange<int64_t>(-5, 5);
      std::vector<int64_t> sizes(fdp.ConsumeIntegralInRange(0, 3));
      for (int64_t& b : sizes) b = BlockSize(fdp);
      return Granularity::PerBlock(axis, std::move(sizes));
    }
  }
}

QuantSpec MakeSpec(FuzzedDataProvider& fdp) {
  QuantSpec spec;
  spec.dtype = fdp.ConsumeIntegralInRange(0, 9) == 0 ? fdp.ConsumeRandomLengthString(20)
                                                      : fdp.PickValueInArray(kDTypes);
  spec.qscheme = fdp.PickValueInArray(
      {QScheme::kSymmetric, QScheme::kAsymmetric, QScheme::kSymmetricWithClipping});
  spec.granularity = MakeGranularity(fdp);
  spec.target = fdp.ConsumeBool() ? Target::kActivation : Target::kWeight;
  switch (fdp.ConsumeIntegralInRange(0, 5)) {
    case 0:  // small integers, often valid
      spec.quant_min = fdp.ConsumeIntegralInRange(-130, 10);
      spec.quant_max = fdp.ConsumeIntegralInRange(-10, 260);
      break;
    case 1:
      spec.quant_min = SpecialDouble(fdp);
      spec.quant_max = SpecialDouble(fdp);
      break;
    case 2:
      (fdp.ConsumeBool() ? spec.quant_min : spec.quant_max) = SpecialDouble(fdp);
      break;
    default:
      break;  // derived
  }
  if (fdp.ConsumeIntegralInRange(0, 2) == 0) spec.float_range.min = -std::fabs(SpecialDouble(fdp));
  if (fdp.ConsumeIntegralInRange(0, 2) == 0) spec.float_range.max = std::fabs(SpecialDouble(fdp));
  if (fdp.ConsumeIntegralInRange(0, 15) == 0) spec.float_range.min = SpecialDouble(fdp);
  spec.scale_dtype = fdp.ConsumeIntegralInRange(0, 15) == 0 ? fdp.ConsumeRandomLengthString(16)
                                                            : fdp.PickValueInArray(kScaleDTypes);
  switch (fdp.ConsumeIntegralInRange(0, 7)) {
    case 0: spec.range_calculator = "minmax"; break;
    case 1: spec.range_calculator = fdp.ConsumeRandomLengthString(8); break;
    default: break;
  }
  return spec;
}

DType MakeDType(FuzzedDataProvider& fdp) {
  return fdp.PickValueInArray({DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                               DType::kFloat64});
}

// Clears the top exponent bit of a NaN/Inf encoding, leaving a finite value.
void MakeFinite(DType dtype, char* p) {
  switch (dtype) {
    case DType::kFloat32: {
      uint32_t u;
      std::memcpy(&u, p, 4);
      if ((u & 0x7f800000u) == 0x7f800000u) u &= ~0x40000000u;
      std::memcpy(p, &u, 4);
      break;
    }
    case DType::kFloat16: {
      uint16_t u;
      std::memcpy(&u, p, 2);
      if ((u & 0x7c00u) == 0x7c00u) u &= ~0x4000u;
      std::memcpy(p, &u, 2);
      break;
    }
    case DType::kBFloat16: {
      uint16_t u;
      std::memcpy(&u, p, 2);
      if ((u & 0x7f80u) == 0x7f80u) u &= ~0x4000u;
      std::memcpy(p, &u, 2);
      break;
    }
    case DType::kFloat64: {
      uint64_t u;
      std::memcpy(&u, p, 8);
      if ((u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull) u &= ~0x4000000000000000ull;
      std::memcpy(p, &u, 8);
      break;
    }
  }
}

// A tensor: dtype, shape and bytes (owned; views point into it).
struct OwnedTensor {
  DType dtype = DType::kFloat32;
  Shape shape;
  std::string data;
  int64_t elements = 0;

  TensorView view() const { return *TensorView::Create(dtype, shape, data); }
};

// Small tensors (at most 4096 elements) mostly; now and then (1 in 64) one above the
// parallel threshold of the range pass (2^16 elements), its bytes the fuzz bytes
// repeated.
OwnedTensor MakeTensor(FuzzedDataProvider& fdp, std::optional<DType> dtype = std::nullopt) {
  OwnedTensor t;
  t.dtype = dtype.value_or(MakeDType(fdp));
  const bool large = fdp.ConsumeIntegralInRange(0, 63) == 0;
  const int rank = fdp.ConsumeIntegralInRange(1, 4);
  t.shape.resize(rank);
  for (int64_t& d : t.shape) {
    d = fdp.ConsumeIntegralInRange(0, 15) == 0 ? fdp.ConsumeIntegralInRange(0, 40)
                                               : fdp.ConsumeIntegralInRange(1, 6);
  }
  // Small: at most 4096 elements (a rank-4 tensor of dims up to 40 would be millions).
  auto count = [&t] {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= std::max<int64_t>(d, 1);
    return n;
  };
  while (count() > 4096) {
    int64_t& largest = *std::max_element(t.shape.begin(), t.shape.end());
    largest = (largest + 1) / 2;
  }
  if (large) {
    int64_t rest = 1;
    for (int d = 1; d < rank; ++d) rest *= std::max<int64_t>(t.shape[d], 1);
    t.shape[0] = (int64_t{1} << 16) / rest + 1 + fdp.ConsumeIntegralInRange(0, 64);
  }
  t.elements = 1;
  for (int64_t d : t.shape) t.elements *= d;
  const size_t bytes = static_cast<size_t>(t.elements) * ItemSize(t.dtype);
  const bool finite = fdp.ConsumeIntegralInRange(0, 7) != 0;
  const std::string raw = fdp.ConsumeBytesAsString(std::min<size_t>(bytes, 4096));
  t.data.resize(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    t.data[i] = raw.empty() ? static_cast<char>(i * 37) : raw[i % raw.size()];
  }
  if (finite) {
    for (size_t i = 0; i < bytes; i += ItemSize(t.dtype)) MakeFinite(t.dtype, &t.data[i]);
  }
  return t;
}

// ---- Reference range ----

uint64_t Bits(const TensorView& t, int64_t i) {
  const int size = ItemSize(t.dtype());
  uint64_t u = 0;
  std::memcpy(&u, t.data() + i * size, size);
  return u;
}

// a < b in the order the range pass uses: by value, -0 before +0.
bool Before(double a, double b) {
  return a < b || (a == b && std::signbit(a) && !std::signbit(b));
}

// Naive per-block minima and maxima (bit patterns), or nullopt if x holds a NaN/Inf.
std::optional<std::pair<std::vector<uint64_t>, std::vector<uint64_t>>> ReferenceRange(
    const TensorView& x, const Shape& block) {
  const Shape counts = BlockCounts(x.shape(), block);
  int64_t blocks = 1;
  for (int64_t c : counts) blocks *= c;
  std::vector<int64_t> lo(blocks, -1), hi(blocks, -1);
  const size_t rank = x.shape().size();
  std::vector<int64_t> index(rank, 0);
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    const double v = x.ValueAt(i);
    if (!std::isfinite(v)) return std::nullopt;
    int64_t b = 0;
    for (size_t d = 0; d < rank; ++d) b = b * counts[d] + index[d] / block[d];
    if (lo[b] < 0 || Before(v, x.ValueAt(lo[b]))) lo[b] = i;
    if (hi[b] < 0 || Before(x.ValueAt(hi[b]), v)) hi[b] = i;
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < x.shape()[d]) break;
      index[d] = 0;
    }
  }
  std::pair<std::vector<uint64_t>, std::vector<uint64_t>> out;
  for (int64_t b = 0; b < blocks; ++b) {
    out.first.push_back(Bits(x, lo[b]));
    out.second.push_back(Bits(x, hi[b]));
  }
  return out;
}

// ObserveRange against the reference, on every kernel level; returns the range.
absl::StatusOr<BlockRange> CheckedObserveRange(const TensorView& x, const Shape& block) {
  using range_internal::KernelLevel;
  const auto reference = ReferenceRange(x, block);
  std::optional<absl::StatusOr<BlockRange>> first;
  const int top = static_cast<int>(range_internal::DetectedKernelLevel());
  for (int level = 0; level <= top; ++level) {
    range_internal::kernel_level_cap = static_cast<KernelLevel>(level);
    absl::StatusOr<BlockRange> range = ObserveRange(x, block);
    range_internal::kernel_level_cap = KernelLevel::kAvx2;
    if (range.ok() != reference.has_value()) {
      Fail("ObserveRange " + std::string(range.ok() ? "accepted" : "refused") +
           " a tensor the reference " + (reference ? "accepts" : "refuses") + ": " +
           range.status().ToString());
    }
    if (range.ok()) {
      const TensorView lo = range->min.view(), hi = range->max.view();
      Check(lo.num_elements() == static_cast<int64_t>(reference->first.size()),
            "ObserveRange block count");
      for (int64_t b = 0; b < lo.num_elements(); ++b) {
        if (Bits(lo, b) != reference->first[b] || Bits(hi, b) != reference->second[b]) {
          Fail("ObserveRange differs from the reference at block " + std::to_string(b) +
               " on kernel level " + std::to_string(level) + " (shape " +
               ShapeString(x.shape()) + ", block " + ShapeString(block) + ", dtype " +
               std::string(DTypeName(x.dtype())) + ")");
        }
      }
    } else {
      Check(range.status().code() == absl::StatusCode::kInvalidArgument,
            "ObserveRange failed with another code than INVALID_ARGUMENT");
    }
    if (!first) first = std::move(range);
  }
  return *std::move(first);
}

// ---- States ----

bool SameDoubles(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

bool SameState(const CalculatorState& a, const CalculatorState& b) {
  if (a.running.has_value() != b.running.has_value()) return false;
  if (a.running && (a.running->precision != b.running->precision ||
                    a.running->shape != b.running->shape ||
                    !SameDoubles(a.running->lo, b.running->lo) ||
                    !SameDoubles(a.running->hi, b.running->hi))) {
    return false;
  }
  return a.calculator == b.calculator && a.spec == b.spec &&
         a.averaging_constant == b.averaging_constant && a.initialized == b.initialized &&
         a.export_mode == b.export_mode &&
         a.compute_dtype_for_export == b.compute_dtype_for_export &&
         a.observation_count == b.observation_count && a.qparams == b.qparams;
}

std::string Describe(const CalculatorState& s) {
  std::string out = "calculator=" + s.calculator + " dtype=" + s.spec.dtype +
                    " qscheme=" + std::string(QSchemeName(s.spec.qscheme)) +
                    " granularity=" + s.spec.granularity.ToString() +
                    " initialized=" + std::to_string(s.initialized) +
                    " count=" + std::to_string(s.observation_count) +
                    " qparams.shape=" + ShapeString(s.qparams.shape);
  for (size_t i = 0; i < s.qparams.scale.size() && i < 4; ++i) {
    out += " scale[" + std::to_string(i) + "]=" + std::to_string(s.qparams.scale[i]);
    if (s.qparams.has_zero_point) out += " zp=" + std::to_string(s.qparams.zero_point[i]);
    if (s.qparams.has_minval) out += " minval=" + std::to_string(s.qparams.minval[i]);
  }
  if (s.running) {
    for (size_t i = 0; i < s.running->lo.size() && i < 4; ++i) {
      out += " running[" + std::to_string(i) + "]=[" + std::to_string(s.running->lo[i]) + ", " +
             std::to_string(s.running->hi[i]) + "]";
    }
  }
  if (s.spec.quant_min) out += " quant_min=" + std::to_string(*s.spec.quant_min);
  if (s.spec.quant_max) out += " quant_max=" + std::to_string(*s.spec.quant_max);
  if (s.spec.float_range.min) out += " float_range.min=" + std::to_string(*s.spec.float_range.min);
  if (s.spec.float_range.max) out += " float_range.max=" + std::to_string(*s.spec.float_range.max);
  return out;
}

std::unique_ptr<QParamsCalculatorBase> RoundTrip(const QParamsCalculatorBase& c) {
  const CalculatorState state = c.ExportState();
  absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> restored = CreateFromState(state);
  if (!restored.ok()) {
    Fail("CreateFromState refuses the state ExportState gave: " + restored.status().ToString() +
         "\n  state: " + Describe(state));
  }
  if (!SameState((*restored)->ExportState(), state)) {
    Fail("ExportState -> CreateFromState -> ExportState changed the state: " + Describe(state));
  }
  Check((*restored)->Description() == c.Description(), "a restored calculator describes itself "
                                                       "otherwise");
  return *std::move(restored);
}

// An exported state with one field changed, for CreateFromState's validation.
CalculatorState Mutate(FuzzedDataProvider& fdp, CalculatorState s) {
  switch (fdp.ConsumeIntegralInRange(0, 13)) {
    case 0: s.initialized = !s.initialized; break;
    case 1: s.observation_count = fdp.ConsumeIntegral<int64_t>(); break;
    case 2: s.export_mode = !s.export_mode; break;
    case 3: s.compute_dtype_for_export = MakeDType(fdp); break;
    case 4: s.calculator = fdp.PickValueInArray(kCalculators); break;
    case 5: s.spec.granularity = MakeGranularity(fdp); break;
    case 6: {
      s.qparams.shape.resize(fdp.ConsumeIntegralInRange(0, 4));
      for (int64_t& d : s.qparams.shape) d = fdp.ConsumeIntegralInRange<int64_t>(-1, 4);
      break;
    }
    case 7:
      if (!s.qparams.scale.empty()) {
        s.qparams.scale[fdp.ConsumeIntegralInRange<size_t>(0, s.qparams.scale.size() - 1)] =
            static_cast<float>(SpecialDouble(fdp));
      } else {
        s.qparams.scale.push_back(1.0f);
      }
      break;
    case 8:
      if (!s.qparams.zero_point.empty()) {
        s.qparams.zero_point[fdp.ConsumeIntegralInRange<size_t>(
            0, s.qparams.zero_point.size() - 1)] = fdp.ConsumeIntegral<int32_t>();
      } else {
        s.qparams.zero_point.push_back(0);
      }
      break;
    case 9: s.qparams.has_zero_point = !s.qparams.has_zero_point; break;
    case 10:
      s.qparams.precision =
          fdp.ConsumeBool() ? std::optional<DType>() : std::optional<DType>(MakeDType(fdp));
      break;
    case 11:
      if (s.running && !s.running->lo.empty()) {
        s.running->lo[fdp.ConsumeIntegralInRange<size_t>(0, s.running->lo.size() - 1)] =
            SpecialDouble(fdp);
      } else if (s.running) {
        s.running.reset();
      } else {
        s.running = WorkingRange{DType::kFloat32, s.qparams.shape,
                                 std::vector<double>(ScaleCount(s.qparams), -1),
                                 std::vector<double>(ScaleCount(s.qparams), 1)};
      }
      break;
    case 12:
      s.averaging_constant =
          fdp.ConsumeBool() ? std::optional<double>() : std::optional<double>(SpecialDouble(fdp));
      break;
    default:
      if (s.running) s.running->shape.push_back(1);
      s.qparams.shape.push_back(1);
      break;
  }
  return s;
}

// ---- Forwards ----

// The result of a successful forward. A cached forward returns the buffers as they
// were; a computing one has the block-count shape and the working precision.
void CheckForwardResult(const QParamsCalculatorBase& c, const QParams& q, const Observation& x,
                        const CalculatorState& before, bool cached) {
  int64_t n = 1;
  for (int64_t d : q.shape) n *= d;
  // NVFP4 buffers keep the codes only (ScaleCount, ScaleValues).
  Check(n >= 0 && static_cast<int64_t>(ScaleCount(q)) == n, "qparams.scale size");
  Check(q.zero_point.size() == (q.has_zero_point ? ScaleCount(q) : 0), "zero_point size");
  Check(q.minval.size() == (q.has_minval ? ScaleCount(q) : 0), "minval size");
  for (float s : q.scale) Check(!(s <= 0), "a scale <= 0");
  if (cached) {
    Check(q == before.qparams, "a cached forward did not return the buffers");
    return;
  }
  Check(n > 0, "a computing forward without blocks");
  const absl::StatusOr<Shape> block = c.spec().granularity.BlockShape(x.input_shape(),
                                                                      c.spec().target);
  Check(block.ok() && q.shape == BlockCounts(x.input_shape(), *block),
        "qparams.shape is not the block counts of the input");
  Check(q.precision == (c.spec().float_range.frozen() ? DType::kFloat32 : x.dtype()),
        "qparams.precision is not the working precision");
}

// A forward of x on c: checks the result and that a failure changes nothing.
absl::StatusOr<QParams> Forward(QParamsCalculatorBase& c, const Observation& x) {
  const CalculatorState before = c.ExportState();
  absl::StatusOr<QParams> q = c.Forward(x);
  if (!q.ok()) {
    Check(SameState(c.ExportState(), before), "a failed forward changed the state");
    const absl::StatusCode code = q.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kFailedPrecondition) {
      Fail("a forward failed with an undocumented code: " + q.status().ToString());
    }
    return q;
  }
  const bool cached = c.stateful() && (before.export_mode ||
                                       (before.initialized && c.spec().float_range.frozen()));
  CheckForwardResult(c, *q, x, before, cached);
  if (c.stateful()) {
    const auto& s = static_cast<const StatefulQParamsCalculatorBase&>(c);
    Check(s.GetQParams() == *q, "the buffers differ from the forward's result");
    Check(s.observation_count() == before.observation_count + (cached ? 0 : 1),
          "observation_count did not count exactly the computing forward");
  }
  return q;
}

// Forward of a tensor on c and of its range on a copy of c: the same outcome.
void ForwardTensorAndRange(std::unique_ptr<QParamsCalculatorBase>& c, const OwnedTensor& t) {
  const TensorView x = t.view();
  std::unique_ptr<QParamsCalculatorBase> twin = RoundTrip(*c);
  const absl::StatusOr<Shape> block = c->spec().granularity.BlockShape(x.shape(), c->spec().target);

  absl::StatusOr<BlockRange> range = absl::InvalidArgumentError("no block shape");
  if (block.ok() && x.num_elements() > 0) range = CheckedObserveRange(x, *block);

  absl::StatusOr<QParams> from_tensor = Forward(*c, Observation::FromTensor(x));
  if (!range.ok()) return;  // no range to compare with (bad fit, empty, or NaN/Inf)
  const TensorView lo = range->min.view(), hi = range->max.view();
  absl::StatusOr<QParams> from_range = Forward(*twin, Observation::FromRange(x.shape(), lo, hi));
  if (from_tensor.status().code() != from_range.status().code()) {
    Fail("a tensor and its range give different status codes: " +
         from_tensor.status().ToString() + " vs " + from_range.status().ToString());
  }
  if (from_tensor.ok()) {
    Check(*from_tensor == *from_range, "a tensor and its range give different qparams");
  }
  Check(SameState(c->ExportState(), twin->ExportState()),
        "a tensor and its range leave different states");
}

// A range observation straight from fuzz data (mostly malformed).
void ForwardRawRange(QParamsCalculatorBase& c, FuzzedDataProvider& fdp) {
  Shape input_shape(fdp.ConsumeIntegralInRange(0, 4));
  for (int64_t& d : input_shape) {
    d = fdp.ConsumeBool() ? fdp.ConsumeIntegralInRange<int64_t>(0, 8)
                          : fdp.ConsumeIntegral<int64_t>();
  }
  const OwnedTensor lo = MakeTensor(fdp);
  const OwnedTensor hi = MakeTensor(fdp, fdp.ConsumeIntegralInRange(0, 7) ? lo.dtype : MakeDType(fdp));
  (void)Forward(c, Observation::FromRange(input_shape, lo.view(), hi.view()));
}

// The numerics' building blocks on arbitrary ranges.
void Numerics(const QParamsCalculatorBase& c, FuzzedDataProvider& fdp) {
  WorkingRange range;
  range.precision = MakeDType(fdp);
  range.shape = {fdp.ConsumeIntegralInRange<int64_t>(1, 8)};
  for (int64_t i = 0; i < range.shape[0]; ++i) {
    range.lo.push_back(std::fmin(SpecialDouble(fdp), 0.0));
    range.hi.push_back(std::fmax(SpecialDouble(fdp), 0.0));
  }
  const QParamsRecipe recipe = QParamsRecipe::FromSpec(c.spec());
  const QParams q = QParamsFromRange(recipe, range);
  Check(ScaleCount(q) == range.lo.size(), "QParamsFromRange size");
  const WorkingRange ma = MovingAverageUpdate(fdp.ConsumeFloatingPointInRange(0.0, 1.0), range, range);
  const WorkingRange gm = GlobalMinMaxUpdate(range, ma);
  QParamsFromRange(recipe, gm);

  const uint16_t h = fdp.ConsumeIntegral<uint16_t>();
  const float hf = HalfToFloat(h), bf = BFloat16ToFloat(h);
  if (!std::isnan(hf)) Check(FloatToHalf(hf) == h, "half -> float -> half is not exact");
  if (!std::isnan(bf)) Check(FloatToBFloat16(bf) == h, "bfloat16 -> float -> bfloat16 not exact");
  const float f = fdp.ConsumeFloatingPoint<float>();
  if (std::isfinite(f)) {
    Check(RoundToHalf(RoundToHalf(f)) == RoundToHalf(f) || std::isnan(RoundToHalf(f)),
          "RoundToHalf is not idempotent");
    Check(RoundToBFloat16(RoundToBFloat16(f)) == RoundToBFloat16(f),
          "RoundToBFloat16 is not idempotent");
  }
}

}  // namespace
}  // namespace qparams

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // OpenMP workers that spin between the (rare) parallel passes would take the CPU
  // from the fuzzer; set before libomp starts.
  setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace qparams;
  FuzzedDataProvider fdp(data, size);
  SetRangeThreads(fdp.ConsumeIntegralInRange(0, 2));

  const QuantSpec spec = MakeSpec(fdp);
  const std::string key = fdp.ConsumeIntegralInRange(0, 15) == 0
                              ? fdp.ConsumeRandomLengthString(16)
                              : fdp.PickValueInArray(kCalculators);
  CalculatorOptions options;
  if (fdp.ConsumeIntegralInRange(0, 3) == 0) {
    options.averaging_constant = fdp.ConsumeBool() ? fdp.ConsumeFloatingPointInRange(0.0, 1.0)
                                                   : SpecialDouble(fdp);
  }
  absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> created =
      QParamsCalculatorRegistry::Global().Create(key, spec, options);
  const absl::StatusOr<QuantSpec> resolved = spec.Resolve();
  if (!created.ok()) {
    Check(created.status().code() == absl::StatusCode::kInvalidArgument,
          "Create failed with another code than INVALID_ARGUMENT: " + created.status().ToString());
    return 0;
  }
  Check(resolved.ok(), "Create accepted a spec that Resolve refuses");
  Check(resolved->Resolve().ok() && *resolved->Resolve() == *resolved,
        "Resolve of a resolved spec changes it");
  std::unique_ptr<QParamsCalculatorBase> c = *std::move(created);
  Check(c->spec() == *resolved, "the calculator's spec is not the resolved one");

  for (int step = 0; step < 12 && fdp.remaining_bytes() > 0; ++step) {
    switch (fdp.ConsumeIntegralInRange(0, 9)) {
      case 0:
      case 1:
      case 2:
        ForwardTensorAndRange(c, MakeTensor(fdp));
        break;
      case 3:
        ForwardRawRange(*c, fdp);
        break;
      case 4: {
        const Granularity g = MakeGranularity(fdp);
        const bool was_initialized = c->initialized();
        const absl::Status s = c->SetGranularity(g);
        if (was_initialized) {
          Check(s.code() == absl::StatusCode::kFailedPrecondition,
                "SetGranularity on an initialized calculator: " + s.ToString());
        } else {
          Check(s.ok() == g.Validate().ok(), "SetGranularity differs from Validate");
          if (s.ok()) Check(c->spec().granularity == g, "SetGranularity did not set it");
        }
        break;
      }
      case 5: {
        const bool enabled = fdp.ConsumeBool();
        const absl::Status s = c->SetExportMode(enabled);
        Check(s.ok() == (c->stateful() || !enabled), "SetExportMode: " + s.ToString());
        break;
      }
      case 6:
        c = RoundTrip(*c);
        break;
      case 7: {
        const CalculatorState mutated = Mutate(fdp, c->ExportState());
        absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> restored = CreateFromState(mutated);
        if (restored.ok()) {
          (*restored)->Description();
          if (fdp.ConsumeBool()) c = *std::move(restored);  // go on with the accepted state
        } else {
          Check(restored.status().code() == absl::StatusCode::kInvalidArgument,
                "CreateFromState failed with another code than INVALID_ARGUMENT");
        }
        break;
      }
      case 8:
        Numerics(*c, fdp);
        break;
      default:
        c->Description();
        break;
    }
  }
  return 0;
}
