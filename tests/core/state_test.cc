// Persistence: ExportState -> CreateFromState gives a calculator whose every further
// step is bit-identical to the original's; inconsistent states are rejected.

#include <memory>
#include <string>
#include <vector>

#include "core/calculator_state.h"
#include "core/registry.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using QS = QScheme;
using Calc = std::unique_ptr<QParamsCalculatorBase>;

// One step of a sequence: a forward, or an export-mode toggle.
struct Step {
  std::optional<Tensor> x;
  bool export_mode = false;
};

Step Forward(Tensor x) { return Step{std::move(x), false}; }
Step Export(bool on) { return Step{std::nullopt, on}; }

// Runs `step`; returns the forward's result or the status (an export toggle gives the
// empty result).
absl::StatusOr<QParams> Run(QParamsCalculatorBase& calc, const Step& step) {
  if (step.x.has_value()) return Fwd(calc, *step.x);
  if (absl::Status s = calc.SetExportMode(step.export_mode); !s.ok()) return s;
  return QParams();
}

bool SameOutcome(const absl::StatusOr<QParams>& a, const absl::StatusOr<QParams>& b) {
  if (a.ok() != b.ok()) return false;
  return a.ok() ? *a == *b : a.status().code() == b.status().code();
}

// For every split point k: run steps [0, k) on a calculator, export and restore it,
// then run steps [k, n) on both and expect identical outcomes and final states.
void ExpectRestoreContinuesIdentically(const std::string& key, const QuantSpec& spec,
                                       CalculatorOptions options, const std::vector<Step>& steps) {
  for (size_t k = 0; k <= steps.size(); ++k) {
    SCOPED_TRACE(absl::StrCat("restored after ", k, " steps"));
    ASSERT_OK_AND_ASSIGN(Calc original, Create(key, spec, options));
    for (size_t i = 0; i < k; ++i) (void)Run(*original, steps[i]);
    const CalculatorState state = original->ExportState();
    ASSERT_OK_AND_ASSIGN(Calc restored, CreateFromState(state));
    EXPECT_EQ(restored->key(), original->key());
    ASSERT_TRUE(SameState(state, restored->ExportState()));
    // A clone continues alike too, and independently (shared storage would take
    // every step twice).
    std::unique_ptr<QParamsCalculatorBase> clone;
    if (auto* s = AsStateful(original.get())) clone = s->Clone();
    for (size_t i = k; i < steps.size(); ++i) {
      const absl::StatusOr<QParams> a = Run(*original, steps[i]);
      const absl::StatusOr<QParams> b = Run(*restored, steps[i]);
      ASSERT_TRUE(SameOutcome(a, b)) << "step " << i << ": " << a.status() << " vs " << b.status();
      if (clone != nullptr) {
        const absl::StatusOr<QParams> c = Run(*clone, steps[i]);
        ASSERT_TRUE(SameOutcome(a, c)) << "clone, step " << i;
      }
    }
    EXPECT_TRUE(SameState(original->ExportState(), restored->ExportState()));
    if (clone != nullptr) {
      EXPECT_TRUE(SameState(original->ExportState(), clone->ExportState()));
    }
    if (auto* s = AsStateful(original.get())) {
      EXPECT_EQ(s->GetQParams(), AsStateful(restored.get())->GetQParams());
    }
  }
}

// A sequence of forwards in `dtype` with varying magnitudes, an export-mode stretch,
// and two failing forwards (a NaN, and another dtype) that must fail alike.
std::vector<Step> Sequence(DType dtype, const Shape& shape, uint32_t seed) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<Step> steps;
  for (int i = 0; i < 4; ++i) {
    steps.push_back(Forward(MakeTensor(dtype, shape, RandN(n, seed + i, 1 + 3 * (i % 3)))));
  }
  steps.push_back(Export(true));
  steps.push_back(Forward(MakeTensor(dtype, shape, RandN(n, seed + 10, 50))));
  steps.push_back(Export(false));
  std::vector<double> with_nan = RandN(n, seed + 11);
  with_nan[n / 2] = NAN;
  steps.push_back(Forward(MakeTensor(dtype, shape, with_nan)));
  const DType other = dtype == DType::kFloat32 ? DType::kBFloat16 : DType::kFloat32;
  steps.push_back(Forward(MakeTensor(other, shape, RandN(n, seed + 12))));
  for (int i = 0; i < 3; ++i) {
    steps.push_back(Forward(MakeTensor(dtype, shape, RandN(n, seed + 20 + i, 0.5 + i))));
  }
  return steps;
}

struct SpecCase {
  const char* name;
  QuantSpec spec;
  Shape shape;
};

std::vector<SpecCase> SpecCases() {
  std::vector<SpecCase> cases;
  cases.push_back({"int8 sym per_channel",
                   MakeSpec("int8", QS::kSymmetric, Granularity::PerChannel(0)),
                   {4, 8}});
  cases.push_back({"uint4 asym per_block",
                   MakeSpec("uint4", QS::kAsymmetric, Granularity::PerBlock(1, 4)),
                   {4, 8}});
  cases.push_back({"e4m3 per_tensor", MakeSpec("float8_e4m3fn", QS::kSymmetric), {3, 5}});
  cases.push_back({"fp4 e8m0 multi-axis block",
                   MakeSpec("float4_e2m1fn_x2", QS::kSymmetric,
                            Granularity::PerBlock(std::vector<int64_t>{2, -1})),
                   {4, 8}});
  QuantSpec int8_e8m0 = MakeSpec("int8", QS::kSymmetric, Granularity::PerChannel(-1));
  int8_e8m0.scale_dtype = "float8_e8m0fnu";
  cases.push_back({"int8 e8m0", int8_e8m0, {4, 8}});
  QuantSpec one_sided = MakeSpec("int8", QS::kAsymmetric, Granularity::PerChannel(0));
  one_sided.float_range.max = 7.0;  // the EMA drift of §1.5 shows here
  cases.push_back({"one-sided float_range", one_sided, {4, 8}});
  QuantSpec frozen = MakeSpec("int8", QS::kSymmetric);
  frozen.float_range = {-5.0, 5.0};
  cases.push_back({"frozen float_range", frozen, {4, 8}});
  return cases;
}

// The main property, for static / moving_average / global_minmax with fp32, bf16 and
// fp16 inputs over several specs.
TEST(State, RestoredCalculatorContinuesBitIdentically) {
  struct Kind {
    const char* key;
    CalculatorOptions options;
  };
  const Kind kinds[] = {{"static", {}},
                        {"moving_average", {}},
                        {"moving_average", CalculatorOptions{0.3}},
                        {"global_minmax", {}}};
  uint32_t seed = 1000;
  for (const Kind& kind : kinds) {
    for (const SpecCase& c : SpecCases()) {
      for (DType p : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        SCOPED_TRACE(absl::StrCat(kind.key, " c=", kind.options.averaging_constant.value_or(0.01),
                                  ", ", c.name, ", ", DTypeName(p)));
        ExpectRestoreContinuesIdentically(kind.key, c.spec, kind.options,
                                          Sequence(p, c.shape, seed += 100));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// A finite range wider than the scale's float32 gives an infinite scale (and, in
// float64, an infinite minval): a reachable state, so it must restore.
TEST(State, InfiniteScalesRestore) {
  for (const char* key : {"static", "global_minmax", "moving_average"}) {
    ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, MakeSpec("int8", QS::kAsymmetric)));
    ASSERT_OK(calc->Forward(Obs(MakeTensor(DType::kFloat64, {2}, {-1e300, 1e300}))));
    const CalculatorState state = calc->ExportState();
    ASSERT_TRUE(std::isinf(state.qparams.scale[0])) << key;
    ASSERT_OK_AND_ASSIGN(Calc restored, CreateFromState(state));
    EXPECT_TRUE(SameState(restored->ExportState(), state)) << key;
  }
}

// A float_range bound beyond float32 becomes infinite in the running range.
TEST(State, InfiniteFloatRangeBoundsRestore) {
  for (const char* key : {"static", "global_minmax", "moving_average"}) {
    QuantSpec spec = MakeSpec("int8", QS::kAsymmetric);
    spec.float_range.max = 1e300;
    ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, spec));
    ASSERT_OK(calc->Forward(Obs(Vec({0.5, -0.5}))));
    const CalculatorState state = calc->ExportState();
    ASSERT_OK_AND_ASSIGN(Calc restored, CreateFromState(state));
    EXPECT_TRUE(SameState(restored->ExportState(), state)) << key;
  }
}

// The e8m0 path ignores quant_min/quant_max (§7), so an int8 zero point of 0 restores
// even outside a custom quant range; any other zero point does not.
TEST(State, E8m0ZeroPointIgnoresTheQuantRange) {
  QuantSpec spec = MakeSpec("int8", QS::kSymmetric);
  spec.scale_dtype = "float8_e8m0fnu";
  spec.quant_min = 4;
  spec.quant_max = 84;
  for (const char* key : {"static", "global_minmax", "moving_average"}) {
    ASSERT_OK_AND_ASSIGN(Calc calc, Create(key, spec));
    ASSERT_OK(calc->Forward(Obs(Vec({-3, 25632}))));
    CalculatorState state = calc->ExportState();
    ASSERT_EQ(state.qparams.zero_point, std::vector<int32_t>{0}) << key;
    ASSERT_OK_AND_ASSIGN(Calc restored, CreateFromState(state));
    EXPECT_TRUE(SameState(restored->ExportState(), state)) << key;
    state.qparams.zero_point[0] = 44;
    EXPECT_CODE(CreateFromState(state), kInvalid) << key;
  }
}

TEST(State, ExportedFieldsOfARunningCalculator) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("moving_average", MakeSpec("int8", QS::kSymmetric),
                                         CalculatorOptions{0.5}));
  CalculatorState before = calc->ExportState();
  EXPECT_EQ(before.calculator, "moving_average");
  EXPECT_FALSE(before.initialized);
  EXPECT_FALSE(before.running.has_value());
  EXPECT_EQ(before.averaging_constant, 0.5);
  EXPECT_EQ(before.qparams.shape, (Shape{0}));

  ASSERT_OK(Fwd(*calc, Vec({-3, 1}, DType::kBFloat16)).status());
  ASSERT_OK(calc->SetExportMode(true));
  const CalculatorState s = calc->ExportState();
  EXPECT_TRUE(s.initialized);
  EXPECT_TRUE(s.export_mode);
  EXPECT_EQ(s.compute_dtype_for_export, DType::kBFloat16);
  EXPECT_EQ(s.observation_count, 1);
  ASSERT_TRUE(s.running.has_value());
  EXPECT_EQ(s.running->precision, DType::kBFloat16);
  EXPECT_EQ(s.running->lo, std::vector<double>{-3});
  EXPECT_EQ(s.spec, calc->spec());

  // Restored in export mode: it keeps returning the buffers.
  ASSERT_OK_AND_ASSIGN(Calc restored, CreateFromState(s));
  ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*restored, Vec({-100, 100}, DType::kBFloat16)));
  EXPECT_EQ(q, s.qparams);
}

// The granularity set before initialization travels in the state's spec.
TEST(State, GranularityChangeIsPersisted) {
  ASSERT_OK_AND_ASSIGN(Calc calc, Create("static", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK(calc->SetGranularity(Granularity::PerChannel(1)));
  ASSERT_OK_AND_ASSIGN(Calc restored, CreateFromState(calc->ExportState()));
  EXPECT_EQ(restored->spec().granularity, Granularity::PerChannel(1));
  ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*restored, F32({2, 3}, {1, 2, 3, 4, 5, 6})));
  EXPECT_EQ(q.shape, (Shape{1, 3}));
  ASSERT_OK_AND_ASSIGN(Calc initialized, CreateFromState(restored->ExportState()));
  EXPECT_CODE(initialized->SetGranularity(Granularity::PerTensor()), kPrecondition);
}

// The stateless kind persists its flags: initialized (which blocks set_granularity)
// and the first input dtype.
TEST(State, DynamicRoundTrip) {
  ASSERT_OK_AND_ASSIGN(
      Calc calc, Create("dynamic", MakeSpec("uint8", QS::kAsymmetric, Granularity::PerChannel(0))));
  ASSERT_OK_AND_ASSIGN(Calc fresh, CreateFromState(calc->ExportState()));
  EXPECT_FALSE(fresh->initialized());
  ASSERT_OK(Fwd(*calc, MakeTensor(DType::kFloat16, {2, 2}, {-1, 2, 3, 4})).status());
  const CalculatorState state = calc->ExportState();
  ASSERT_OK_AND_ASSIGN(Calc restored, CreateFromState(state));
  EXPECT_TRUE(SameState(state, restored->ExportState()));
  EXPECT_TRUE(restored->initialized());
  EXPECT_EQ(restored->compute_dtype_for_export(), DType::kFloat16);
  EXPECT_CODE(restored->SetGranularity(Granularity::PerTensor()), kPrecondition);
  for (const Tensor& x : {F32({3, 2}, {1, 2, -3, 4, 5, 6}), Vec({1, -1}, DType::kBFloat16)}) {
    ASSERT_OK_AND_ASSIGN(QParams a, Fwd(*calc, x));
    ASSERT_OK_AND_ASSIGN(QParams b, Fwd(*restored, x));
    EXPECT_EQ(a, b);
  }
}

// ---- Inconsistent states ----

// A valid initialized moving_average state to break.
CalculatorState RunningState() {
  auto calc =
      Create("moving_average", MakeSpec("int8", QS::kAsymmetric, Granularity::PerChannel(0)));
  EXPECT_TRUE(calc.ok());
  EXPECT_OK(Fwd(**calc, F32({2, 3}, {1, -2, 3, 4, 5, -6})).status());
  EXPECT_OK(Fwd(**calc, F32({2, 3}, {2, -1, 3, 7, 5, -6})).status());
  return (*calc)->ExportState();
}

TEST(State, RejectsInconsistentStates) {
  ASSERT_OK(CreateFromState(RunningState()).status());
  struct Breakage {
    const char* what;
    void (*apply)(CalculatorState&);
  };
  const Breakage breakages[] = {
      {"calculator default", [](CalculatorState& s) { s.calculator = "default"; }},
      {"unknown calculator", [](CalculatorState& s) { s.calculator = "minmax"; }},
      {"histogram parameters on a range kind",
       [](CalculatorState& s) { s.histogram_params = HistogramParams(); }},
      {"invalid spec", [](CalculatorState& s) { s.spec.dtype = "float8_e4m3fn"; }},  // + asymmetric
      {"unbuildable granularity",
       [](CalculatorState& s) { s.spec.granularity = Granularity::PerBlock(0, 0); }},
      {"averaging constant 0", [](CalculatorState& s) { s.averaging_constant = 0.0; }},
      {"averaging constant 2", [](CalculatorState& s) { s.averaging_constant = 2.0; }},
      {"initialized without buffers",
       [](CalculatorState& s) {
         s.qparams = QParams::Empty(true, true);
         s.running.reset();
       }},
      {"buffers without initialized",
       [](CalculatorState& s) {
         s.initialized = false;
         s.running.reset();
       }},
      {"scale size", [](CalculatorState& s) { s.qparams.scale.pop_back(); }},
      {"zero point size", [](CalculatorState& s) { s.qparams.zero_point.push_back(0); }},
      {"minval size", [](CalculatorState& s) { s.qparams.minval.clear(); }},
      {"has_zero_point vs dtype",
       [](CalculatorState& s) {
         s.qparams.has_zero_point = false;
         s.qparams.zero_point.clear();
       }},
      {"has_minval vs dtype",
       [](CalculatorState& s) {
         s.qparams.has_minval = false;
         s.qparams.minval.clear();
       }},
      {"negative dim",
       [](CalculatorState& s) {
         s.qparams.shape = {-2, -1};
       }},
      {"no running range", [](CalculatorState& s) { s.running.reset(); }},
      {"running shape",
       [](CalculatorState& s) {
         s.running->shape = {1, 2};
       }},
      {"running lo size", [](CalculatorState& s) { s.running->lo.push_back(0); }},
      {"running hi size", [](CalculatorState& s) { s.running->hi.pop_back(); }},
      {"negative observation count", [](CalculatorState& s) { s.observation_count = -1; }},
      {"initialized with no observation", [](CalculatorState& s) { s.observation_count = 0; }},
      {"initialized without precision", [](CalculatorState& s) { s.qparams.precision.reset(); }},
      {"running precision", [](CalculatorState& s) { s.running->precision = DType::kBFloat16; }},
      {"NaN scale", [](CalculatorState& s) { s.qparams.scale[0] = NAN; }},
      {"negative scale", [](CalculatorState& s) { s.qparams.scale[0] = -1.0f; }},
      {"NaN minval", [](CalculatorState& s) { s.qparams.minval[0] = NAN; }},
      {"zero point above quant_max", [](CalculatorState& s) { s.qparams.zero_point[0] = 128; }},
      {"NaN running min", [](CalculatorState& s) { s.running->lo[0] = NAN; }},
      {"observation count at the int64 limit",
       [](CalculatorState& s) { s.observation_count = INT64_MAX; }},
      {"positive running min", [](CalculatorState& s) { s.running->lo[0] = 1.0; }},
  };
  for (const Breakage& b : breakages) {
    CalculatorState state = RunningState();
    b.apply(state);
    EXPECT_CODE(CreateFromState(state), kInvalid) << b.what;
  }
}

TEST(State, RejectsInconsistentStaticAndUninitializedStates) {
  ASSERT_OK_AND_ASSIGN(Calc fresh, Create("global_minmax", MakeSpec("int8", QS::kSymmetric)));
  CalculatorState running_too_early = fresh->ExportState();
  running_too_early.running = WorkingRange{DType::kFloat32, {1}, {-1}, {1}};
  EXPECT_CODE(CreateFromState(running_too_early), kInvalid);

  ASSERT_OK_AND_ASSIGN(Calc stat, Create("static", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK(Fwd(*stat, F32({3}, {-1, 0, 3})).status());
  CalculatorState static_running = stat->ExportState();
  static_running.running = WorkingRange{DType::kFloat32, {1}, {-1}, {3}};  // static keeps none
  EXPECT_CODE(CreateFromState(static_running), kInvalid);
  ASSERT_OK_AND_ASSIGN(stat, Create("static", MakeSpec("int8", QS::kSymmetric)));
  CalculatorState with_constant = stat->ExportState();
  with_constant.averaging_constant = 0.5;  // moving_average only
  EXPECT_CODE(CreateFromState(with_constant), kInvalid);

  CalculatorState count_too_early = stat->ExportState();
  count_too_early.observation_count = 3;
  EXPECT_CODE(CreateFromState(count_too_early), kInvalid);
  CalculatorState dtype_too_early = stat->ExportState();
  dtype_too_early.compute_dtype_for_export = DType::kBFloat16;
  EXPECT_CODE(CreateFromState(dtype_too_early), kInvalid);

  // Stateless: nothing but the initialized flag and the granularity is kept.
  ASSERT_OK_AND_ASSIGN(Calc dynamic, Create("dynamic", MakeSpec("int8", QS::kSymmetric)));
  CalculatorState dynamic_export = dynamic->ExportState();
  dynamic_export.export_mode = true;
  EXPECT_CODE(CreateFromState(dynamic_export), kInvalid);
  CalculatorState dynamic_count = dynamic->ExportState();
  dynamic_count.observation_count = 2;
  EXPECT_CODE(CreateFromState(dynamic_count), kInvalid);

  ASSERT_OK_AND_ASSIGN(Calc fp8, Create("static", MakeSpec("float8_e4m3fn", QS::kSymmetric)));
  CalculatorState fp8_with_zp = fp8->ExportState();
  fp8_with_zp.qparams = QParams::Empty(true, true);  // FP dtypes have no zp/minval buffers
  EXPECT_CODE(CreateFromState(fp8_with_zp), kInvalid);
}

}  // namespace
}  // namespace qparams::testing
