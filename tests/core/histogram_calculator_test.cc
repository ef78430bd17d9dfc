// The percentile, entropy and mse calculators (histogram.md §4–§9): parameters and
// construction rules, each method on small hand cases, qparams from amax, the lazy
// search, the observation kinds and policies, the 2^62 limit, granularity, export
// mode and state round trips.

#include "core/histogram_calculator.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/calibration.h"
#include "core/range.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using QS = QScheme;
constexpr double kInf = std::numeric_limits<double>::infinity();

absl::StatusOr<std::unique_ptr<HistogramQParamsCalculator>> Make(
    absl::string_view key, const QuantSpec& spec, HistogramParams params = {}) {
  CalculatorOptions options;
  options.histogram = params;
  absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> c =
      QParamsCalculatorRegistry::Global().CreateStateful(key, spec, options);
  if (!c.ok()) return c.status();
  return std::unique_ptr<HistogramQParamsCalculator>(
      dynamic_cast<HistogramQParamsCalculator*>(c->release()));
}

HistogramParams Bins(int num_bins) {
  HistogramParams p;
  p.num_bins = num_bins;
  return p;
}

HistogramParams Percentile(double p, int num_bins = 256) {
  HistogramParams params = Bins(num_bins);
  params.percentile = p;
  return params;
}

const std::vector<double> kWorked = {-3.0, 0.5, 1.0, 2.0, 2.5, 7.3};  // histogram.md §12

// ---- Parameters and construction ----

TEST(HistogramParams, ResolveFillsTheDefaultsOfEachCalculator) {
  ASSERT_OK_AND_ASSIGN(HistogramParams p, HistogramParams().Resolve("percentile"));
  EXPECT_EQ(p.num_bins, 4096);
  EXPECT_EQ(p.percentile, 99.99);
  EXPECT_FALSE(p.start_bin.has_value());
  EXPECT_FALSE(p.stride.has_value());
  EXPECT_EQ(p.nonfinite, NonFinitePolicy::kReject);
  EXPECT_EQ(*p.Resolve("percentile"), p);  // idempotent
  for (const char* key : {"entropy", "mse"}) {
    ASSERT_OK_AND_ASSIGN(HistogramParams r, HistogramParams().Resolve(key));
    EXPECT_EQ(r.start_bin, 128);
    EXPECT_EQ(r.stride, 1);
    EXPECT_FALSE(r.percentile.has_value());
  }
}

TEST(HistogramParams, RejectsOutOfRangeAndForeignParameters) {
  auto bad = [](absl::string_view key, auto set, const char* field) {
    HistogramParams p;
    set(p);
    const absl::Status s = p.Resolve(key).status();
    EXPECT_CODE(s, kInvalid) << key << " " << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  };
  for (int n : {0, 128, 3000, 131072, -256}) {
    bad("mse", [n](HistogramParams& p) { p.num_bins = n; }, "num_bins");
  }
  for (double v : {0.0, -1.0, 100.00000000000001, kInf, std::nan("")}) {
    bad("percentile", [v](HistogramParams& p) { p.percentile = v; }, "percentile");
  }
  bad("entropy", [](HistogramParams& p) { p.start_bin = 0; }, "start_bin");
  bad("entropy", [](HistogramParams& p) { p.start_bin = 4097; }, "start_bin");
  bad("mse", [](HistogramParams& p) { p.stride = 0; }, "stride");
  bad("entropy", [](HistogramParams& p) { p.percentile = 99.9; }, "percentile");
  bad("percentile", [](HistogramParams& p) { p.stride = 2; }, "stride");
  bad("percentile", [](HistogramParams& p) { p.start_bin = 2; }, "start_bin");
  bad("static", [](HistogramParams&) {}, "percentile, entropy and mse");
  EXPECT_OK(Percentile(1e-300).Resolve("percentile").status());
  EXPECT_CODE(ParseNonFinitePolicy("drop"), kInvalid);
}

TEST(HistogramCalculators, ConstructionRules) {
  const QuantSpec int8 = MakeSpec("int8", QS::kSymmetric);
  for (const char* key : {"percentile", "entropy", "mse"}) {
    EXPECT_OK(Make(key, int8).status()) << key;
    EXPECT_CODE(Make(key, MakeSpec("int8", QS::kSymmetric, Granularity::PerChannel(0))), kInvalid);
    QuantSpec ranged = int8;
    ranged.float_range.max = 1.0;
    EXPECT_CODE(Make(key, ranged), kInvalid);
    EXPECT_CODE(Make(key, MakeSpec("int1", QS::kSymmetricWithClipping)), kInvalid);
    CalculatorOptions with_c;
    with_c.averaging_constant = 0.5;
    EXPECT_CODE(QParamsCalculatorRegistry::Global().Create(key, int8, with_c), kInvalid);
  }
  EXPECT_OK(Make("percentile", MakeSpec("float8_e4m3fn", QS::kSymmetric)).status());
  EXPECT_OK(Make("percentile", MakeSpec("float4_e2m1fn_x2", QS::kSymmetric)).status());
  EXPECT_CODE(Make("entropy", MakeSpec("float8_e4m3fn", QS::kSymmetric)), kInvalid);
  EXPECT_CODE(Make("mse", MakeSpec("float4_e2m1fn_x2", QS::kSymmetric)), kInvalid);
  for (const char* key : {"static", "moving_average", "global_minmax", "dynamic"}) {
    CalculatorOptions with_histogram;
    with_histogram.histogram = HistogramParams();
    EXPECT_CODE(QParamsCalculatorRegistry::Global().Create(key, int8, with_histogram), kInvalid)
        << key;
  }
}

// ---- The methods, on hand cases ----

TEST(HistogramPercentile, WorkedExamples) {
  const QuantSpec int8 = MakeSpec("int8", QS::kSymmetric);
  struct Case {
    double p;
    double amax;
    int64_t bin;
    uint32_t scale;
  };
  for (const Case& c : {Case{50, 2.0, 64, 0x3C808081}, Case{99.99, 7.28125, 233, 0x3D69E9EA},
                        Case{100, 7.300000190734863, 233, 0x3D6A841E}}) {
    ASSERT_OK_AND_ASSIGN(auto calc, Make("percentile", int8, Percentile(c.p)));
    ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, Vec(kWorked)));
    EXPECT_TRUE(QParamsAre(q, {1}, {c.scale}, std::vector<int32_t>{0},
                           std::vector<uint32_t>{FloatBits(static_cast<float>(-c.amax))}))
        << c.p;
    ASSERT_TRUE(calc->calibration().has_value());
    EXPECT_EQ(calc->calibration()->amax, c.amax);
    EXPECT_EQ(calc->calibration()->bin_index, c.bin);
    EXPECT_EQ(calc->calibration()->exponent, -5);
    EXPECT_EQ(calc->calibration()->total_count, 6u);
    EXPECT_FALSE(calc->calibration()->kl_margin.has_value());
  }
}

// An asymmetric grid is [0, amax] until a negative value arrives.
TEST(HistogramPercentile, AsymmetricOnNonNegativeData) {
  ASSERT_OK_AND_ASSIGN(auto calc,
                       Make("percentile", MakeSpec("uint8", QS::kAsymmetric), Percentile(100)));
  ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, Vec({0.5, 1.0, 2.0, 2.5, 7.3})));
  EXPECT_TRUE(QParamsAre(q, {1}, {0x3CEA841E}, std::vector<int32_t>{0},
                         std::vector<uint32_t>{0x00000000}));
  ASSERT_OK_AND_ASSIGN(q, Fwd(*calc, Vec({-1.0})));
  EXPECT_TRUE(QParamsAre(q, {1}, {0x3D6A841E}, std::vector<int32_t>{128},
                         std::vector<uint32_t>{FloatBits(-7.3f)}));
}

// need = ceil(P·T/100) in integers: 99.99 of 10000 values is the 9999th exactly.
TEST(HistogramPercentile, IntegerRanks) {
  std::vector<double> values;
  for (int i = 1; i <= 10000; ++i) values.push_back(i);
  const Histogram h = *BinTensor(Vec(values).view(), 65536, NonFinitePolicy::kReject);  // e = -2: bin 4·i
  EXPECT_EQ(PercentileCalibration(h, 99.99, false).bin_index, 4 * 9999);
  EXPECT_EQ(PercentileCalibration(h, 50, false).bin_index, 4 * 5000);
  EXPECT_EQ(PercentileCalibration(h, 0.01, false).bin_index, 4 * 1);
  EXPECT_EQ(PercentileCalibration(h, 1e-10, false).bin_index, 4 * 1);  // need = 1
  EXPECT_EQ(PercentileCalibration(h, 5e-324, false).bin_index, 4 * 1);
  EXPECT_EQ(PercentileCalibration(h, 33.333333333333336, false).bin_index, 4 * 3334);
  EXPECT_EQ(PercentileCalibration(h, 100, false).amax, 10000.0);
}

TEST(HistogramPercentile, SkipZerosAndTinyTotals) {
  ASSERT_OK_AND_ASSIGN(Histogram h, BinTensor(Vec({0.0, 0.0, 0.0, 1.0}).view(), 256,
                                              NonFinitePolicy::kReject));
  EXPECT_EQ(PercentileCalibration(h, 50, false).amax, 0.0);
  EXPECT_EQ(PercentileCalibration(h, 50, true).amax, 1.0);  // only 1.0 is left
  ASSERT_OK_AND_ASSIGN(Histogram zeros,
                       BinTensor(Vec({0.0, -0.0}).view(), 256, NonFinitePolicy::kReject));
  const CalibrationResult r = PercentileCalibration(zeros, 99, true);  // T = 0
  EXPECT_EQ(r.amax, 0.0);
  EXPECT_EQ(r.bin_index, 0);
}

// histogram.md §12: entropy and mse on a single value.
TEST(HistogramEntropyAndMse, SingleValue) {
  const QuantSpec int8 = MakeSpec("int8", QS::kSymmetric);
  ASSERT_OK_AND_ASSIGN(auto entropy, Make("entropy", int8, Bins(256)));
  ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*entropy, Vec({1.0})));
  EXPECT_EQ(Bits(q.scale), (std::vector<uint32_t>{0x3C018182}));
  EXPECT_EQ(entropy->calibration()->amax, 1.0078125);
  EXPECT_EQ(entropy->calibration()->bin_index, 129);
  EXPECT_EQ(entropy->calibration()->kl_margin, kInf);  // thr = 0

  ASSERT_OK_AND_ASSIGN(auto mse, Make("mse", int8, Bins(256)));
  ASSERT_OK(Fwd(*mse, Vec({1.0})).status());
  EXPECT_EQ(mse->calibration()->amax, 1.00390625);
  EXPECT_EQ(mse->calibration()->bin_index, 128);
}

// histogram.md §8: all-zero data, and skip_zeros leaving nothing.
TEST(HistogramEntropyAndMse, AllZeros) {
  const QuantSpec asym = MakeSpec("int8", QS::kAsymmetric);
  const std::vector<double> zeros = {0.0, -0.0, 0.0};
  for (auto [key, amax] : {std::pair{"percentile", 0.0}, std::pair{"entropy", 0x1.0p-126},
                           std::pair{"mse", 0x1.0p-127}}) {
    ASSERT_OK_AND_ASSIGN(auto calc, Make(key, asym));
    ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, Vec(zeros)));
    EXPECT_EQ(calc->calibration()->amax, amax) << key;
    EXPECT_TRUE(QParamsAre(q, {1}, {0x34000000}, std::vector<int32_t>{-128},
                           std::vector<uint32_t>{0}))
        << key;
    HistogramParams skip;
    skip.skip_zeros = true;
    ASSERT_OK_AND_ASSIGN(auto skipping, Make(key, asym, skip));
    ASSERT_OK(Fwd(*skipping, Vec(zeros)).status());
    EXPECT_EQ(skipping->calibration()->amax, 0.0) << key;
    EXPECT_EQ(skipping->calibration()->bin_index, 0) << key;
  }
}

// No candidate: entropy keeps the whole range, mse takes the center of the last bin.
TEST(HistogramEntropyAndMse, NoCandidate) {
  ASSERT_OK_AND_ASSIGN(Histogram h, BinTensor(Vec({0.1, 1.0}).view(), 256,
                                              NonFinitePolicy::kReject));  // M = 129
  const CalibrationResult e = EntropyCalibration(h, {200, 1}, false, 128);
  EXPECT_EQ(e.bin_index, 129);
  EXPECT_EQ(e.amax, std::ldexp(129.0, h.exponent));
  const CalibrationResult m = MseCalibration(
      h, {129, 1}, false, QParamsRecipe::FromSpec(*MakeSpec("int8", QS::kSymmetric).Resolve()),
      false);
  EXPECT_EQ(m.bin_index, 128);
  EXPECT_EQ(m.amax, std::ldexp(257.0, h.exponent - 1));
}

// One value per bin: quantizing the whole range into 128 levels of 32 equal bins
// loses nothing (KL = 0 exactly), and every clipping loses something.
TEST(HistogramEntropyAndMse, UniformDataKeepsTheRange) {
  std::vector<double> values;
  for (int i = 0; i < 4096; ++i) values.push_back((i + 0.5) / 4096);
  ASSERT_OK_AND_ASSIGN(Histogram h,
                       BinTensor(Vec(values).view(), 4096, NonFinitePolicy::kReject));
  const int64_t m = h.occupied_bins();
  const CalibrationResult e = EntropyCalibration(h, {128, 1}, false, 128);
  EXPECT_EQ(m, 4096);
  EXPECT_EQ(e.bin_index, m);
  EXPECT_EQ(e.kl_margin, kInf);  // thr = 0
}

// The candidates run in parallel; each divergence and error is summed in order, so
// the thread count changes no bit.
TEST(HistogramEntropyAndMse, IndependentOfTheThreadCount) {
  const std::vector<double> data = RandN(200000, 5, 1.0);
  ASSERT_OK_AND_ASSIGN(Histogram h, BinTensor(Vec(data).view(), 2048, NonFinitePolicy::kReject));
  const QParamsRecipe recipe = QParamsRecipe::FromSpec(*MakeSpec("int4", QS::kSymmetric).Resolve());
  std::optional<CalibrationResult> entropy, mse;
  for (int threads : {1, 2, 3}) {
    SetRangeThreads(threads);
    const CalibrationResult e = EntropyCalibration(h, {64, 1}, false, 8);
    const CalibrationResult m = MseCalibration(h, {64, 3}, false, recipe, false);
    if (!entropy.has_value()) {
      entropy = e;
      mse = m;
    }
    EXPECT_EQ(e, *entropy) << threads;
    EXPECT_EQ(m, *mse) << threads;
  }
  SetRangeThreads(0);
}

// §7 and §8: an amax that is not a float32 value goes through float64.
TEST(HistogramQParamsFromAmax, Float32AndFloat64Paths) {
  const QParamsRecipe recipe = QParamsRecipe::FromSpec(*MakeSpec("int8", QS::kSymmetric).Resolve());
  const QParams q32 = QParamsFromAmax(recipe, 2.0, false);
  EXPECT_TRUE(QParamsAre(q32, {1}, {0x3C808081}, std::vector<int32_t>{0},
                         std::vector<uint32_t>{FloatBits(-2.0f)}));
  EXPECT_EQ(q32.precision, DType::kFloat32);
  const double amax = 1.0000000001;  // not a float32 value
  const QParams q64 = QParamsFromAmax(recipe, amax, false);
  EXPECT_EQ(q64.scale[0], static_cast<float>(amax / 127.5));
  EXPECT_EQ(q64.minval[0], static_cast<float>(-amax));
  EXPECT_EQ(q64.precision, DType::kFloat32);
  EXPECT_TRUE(std::isfinite(QParamsFromAmax(recipe, 0x1.0p128, false).scale[0]));
}

// ---- Observations ----

// A calculator that counts its searches.
class CountingCalculator final : public HistogramQParamsCalculator {
 public:
  explicit CountingCalculator(int* searches)
      : HistogramQParamsCalculator(*MakeSpec("int8", QS::kSymmetric).Resolve(),
                                   *Bins(256).Resolve("percentile")),
        searches_(searches) {}
  absl::string_view key() const override { return "percentile"; }
  std::unique_ptr<StatefulQParamsCalculatorBase> Clone() const override { return nullptr; }

 protected:
  CalibrationResult Calibrate(const Histogram& histogram) const override {
    ++*searches_;
    return PercentileCalibration(histogram, *params_.percentile, false);
  }

 private:
  int* searches_;
};

// The performance rule: observing never searches; asking does, once per state.
TEST(HistogramCalculators, SearchRunsOnlyWhenAskedAndOncePerState) {
  int searches = 0;
  CountingCalculator calc(&searches);
  for (int i = 0; i < 3; ++i) ASSERT_OK(calc.Observe(Obs(Vec(RandN(1000, i)))));
  (void)calc.ExportState();
  (void)calc.Description();
  (void)calc.histogram();
  EXPECT_EQ(searches, 0);
  const QParams first = calc.GetQParams();
  EXPECT_EQ(searches, 1);
  EXPECT_EQ(calc.GetQParams(), first);
  ASSERT_TRUE(calc.calibration().has_value());
  EXPECT_EQ(searches, 1);
  ASSERT_OK(calc.Observe(Obs(Vec({0.5}))));
  EXPECT_EQ(searches, 1);
  ASSERT_OK(Fwd(calc, Vec({0.25})).status());  // Forward returns qparams: it searches
  EXPECT_EQ(searches, 2);
  ASSERT_OK(calc.SetExportMode(true));
  ASSERT_OK(Fwd(calc, Vec({100.0})).status());  // cached: the result stands
  EXPECT_EQ(searches, 2);
  EXPECT_EQ(calc.observation_count(), 5);
}

TEST(HistogramCalculators, ObservationKinds) {
  ASSERT_OK_AND_ASSIGN(auto calc, Make("percentile", MakeSpec("int8", QS::kSymmetric)));
  const Tensor t = Vec({1.0, -2.0});
  ASSERT_OK_AND_ASSIGN(BlockRange r, ObserveRange(t.view(), {2}));
  const Observation range = Observation::FromRange({2}, r.min.view(), r.max.view());
  EXPECT_CODE(calc->Forward(range), kInvalid);
  ASSERT_OK(calc->SetExportMode(true));
  EXPECT_CODE(calc->Forward(range), kInvalid);  // a type error, even when cached
  ASSERT_OK(calc->SetExportMode(false));
  EXPECT_EQ(calc->observation_count(), 0);

  // A tensor and its histogram leave the same state.
  ASSERT_OK_AND_ASSIGN(auto other, Make("percentile", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK_AND_ASSIGN(Histogram h, BinTensor(t.view(), 4096, NonFinitePolicy::kReject));
  ASSERT_OK_AND_ASSIGN(QParams from_tensor, Fwd(*calc, t));
  ASSERT_OK_AND_ASSIGN(QParams from_histogram, other->Forward(Observation::FromHistogram(h)));
  EXPECT_EQ(from_tensor, from_histogram);
  EXPECT_EQ(calc->histogram(), other->histogram());

  // The other calculators refuse histograms, even when cached.
  for (const char* key : {"static", "moving_average", "global_minmax", "dynamic"}) {
    ASSERT_OK_AND_ASSIGN(auto c, Create(key, MakeSpec("int8", QS::kSymmetric)));
    EXPECT_CODE(c->Forward(Observation::FromHistogram(h)), kInvalid) << key;
    if (c->stateful()) {
      ASSERT_OK(c->SetExportMode(true));
      EXPECT_CODE(c->Forward(Observation::FromHistogram(h)), kInvalid) << key;
    }
  }
}

TEST(HistogramCalculators, DtypesMayChangeBetweenObservations) {
  ASSERT_OK_AND_ASSIGN(auto calc, Make("mse", MakeSpec("int4", QS::kSymmetric)));
  ASSERT_OK(Fwd(*calc, Vec({1.0, 2.0})).status());
  ASSERT_OK(Fwd(*calc, Vec({-1.5}, DType::kBFloat16)).status());
  ASSERT_OK(Fwd(*calc, Vec({0.5}, DType::kFloat64)).status());
  EXPECT_EQ(calc->histogram().total(), 4u);
  EXPECT_EQ(calc->GetQParams().precision, DType::kFloat32);
}

TEST(HistogramCalculators, FailedObservationsChangeNothing) {
  ASSERT_OK_AND_ASSIGN(auto calc, Make("entropy", MakeSpec("int8", QS::kSymmetric), Bins(256)));
  ASSERT_OK(Fwd(*calc, Vec({1.0, 2.0})).status());
  const CalculatorState before = calc->ExportState();
  EXPECT_CODE(Fwd(*calc, Vec({1.0, std::nan("")})), kInvalid);
  EXPECT_CODE(Fwd(*calc, Vec({})), kInvalid);
  EXPECT_CODE(Fwd(*calc, Vec({0x1.0p200}, DType::kFloat64)), kInvalid);
  Histogram bad = calc->histogram();
  bad.exponent += 1;
  EXPECT_CODE(calc->Forward(Observation::FromHistogram(bad)), kInvalid);
  EXPECT_TRUE(SameState(before, calc->ExportState()));
}

// §5.4: a valid observation that would reach 2^62 values is RESOURCE_EXHAUSTED.
TEST(HistogramCalculators, SessionLimit) {
  ASSERT_OK_AND_ASSIGN(auto calc, Make("percentile", MakeSpec("int8", QS::kSymmetric), Bins(256)));
  Histogram big = *BinTensor(Vec({1.0}).view(), 256, NonFinitePolicy::kReject);
  big.counts.back() = kHistogramValueLimit - 2;
  ASSERT_OK(calc->Forward(Observation::FromHistogram(big)).status());
  const CalculatorState before = calc->ExportState();
  EXPECT_CODE(Fwd(*calc, Vec({1.0, 2.0})), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(SameState(before, calc->ExportState()));
  ASSERT_OK(Fwd(*calc, Vec({3.0})).status());  // 2^62 - 1
  EXPECT_EQ(calc->histogram().total(), kHistogramValueLimit - 1);
  EXPECT_EQ(calc->calibration()->amax, 1.0);  // P = 99.99 of 2^62 - 1 values
}

TEST(HistogramCalculators, IgnoredNonFiniteValuesDoNotInitialize) {
  HistogramParams ignore;
  ignore.nonfinite = NonFinitePolicy::kIgnore;
  ASSERT_OK_AND_ASSIGN(auto calc, Make("percentile", MakeSpec("uint4", QS::kAsymmetric), ignore));
  ASSERT_OK_AND_ASSIGN(QParams q, Fwd(*calc, Vec({std::nan(""), kInf, -kInf})));
  EXPECT_EQ(q.shape, Shape{0});
  EXPECT_FALSE(calc->initialized());
  EXPECT_FALSE(calc->calibration().has_value());
  EXPECT_EQ(calc->observation_count(), 1);
  ASSERT_OK(calc->SetGranularity(Granularity::PerTensor()));
  ASSERT_OK(Fwd(*calc, Vec({std::nan(""), 1.0})).status());
  EXPECT_TRUE(calc->initialized());
  EXPECT_EQ(calc->histogram().nan_count, 2u);
}

TEST(HistogramCalculators, Granularity) {
  ASSERT_OK_AND_ASSIGN(auto calc, Make("mse", MakeSpec("int8", QS::kSymmetric)));
  EXPECT_OK(calc->SetGranularity(Granularity::PerTensor()));
  EXPECT_CODE(calc->SetGranularity(Granularity::PerChannel(0)), kInvalid);
  EXPECT_CODE(calc->SetGranularity(Granularity::PerBlock(0, 2)), kInvalid);
  ASSERT_OK(Fwd(*calc, Vec({1.0})).status());
  EXPECT_CODE(calc->SetGranularity(Granularity::PerTensor()), kPrecondition);
  EXPECT_CODE(calc->SetGranularity(Granularity::PerChannel(0)), kPrecondition);
}

TEST(HistogramCalculators, ExportModeFreezesTheState) {
  ASSERT_OK_AND_ASSIGN(auto calc, Make("entropy", MakeSpec("uint8", QS::kAsymmetric)));
  ASSERT_OK_AND_ASSIGN(QParams before, Fwd(*calc, Vec(RandN(3000, 9))));
  ASSERT_OK(calc->SetExportMode(true));
  Histogram invalid = Histogram::Empty(7);  // not inspected
  ASSERT_OK_AND_ASSIGN(QParams cached, calc->Forward(Observation::FromHistogram(invalid)));
  ASSERT_OK_AND_ASSIGN(QParams cached2, Fwd(*calc, Vec({std::nan("")})));
  EXPECT_EQ(cached, before);
  EXPECT_EQ(cached2, before);
  EXPECT_EQ(calc->observation_count(), 1);
  ASSERT_OK(calc->SetExportMode(false));
  EXPECT_CODE(calc->Forward(Observation::FromHistogram(invalid)), kInvalid);
}

// ---- State ----

TEST(HistogramState, RoundTripsBitExactly) {
  for (const char* key : {"percentile", "entropy", "mse"}) {
    HistogramParams params = Bins(1024);
    params.skip_zeros = true;
    ASSERT_OK_AND_ASSIGN(auto calc, Make(key, MakeSpec("int4", QS::kAsymmetric), params));
    ASSERT_OK(calc->Observe(Obs(Vec(RandN(5000, 1, 2.0)))));
    ASSERT_OK(calc->Observe(Obs(Vec({0.0, 0.0, 30.0}, DType::kFloat16))));
    ASSERT_OK(calc->SetExportMode(true));
    const CalculatorState state = calc->ExportState();
    EXPECT_EQ(state.qparams.shape, Shape{0});  // derived, not stored
    ASSERT_OK_AND_ASSIGN(auto restored, CreateStatefulFromState(state));
    EXPECT_TRUE(SameState(state, restored->ExportState())) << key;
    EXPECT_EQ(restored->GetQParams(), calc->GetQParams()) << key;
    auto* h = dynamic_cast<HistogramQParamsCalculator*>(restored.get());
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(*h->calibration(), *calc->calibration()) << key;
    EXPECT_EQ(h->params(), calc->params());
    EXPECT_TRUE(h->export_mode());
    // And the clone continues identically.
    std::unique_ptr<StatefulQParamsCalculatorBase> clone = calc->Clone();
    EXPECT_TRUE(SameState(state, clone->ExportState()));
    EXPECT_EQ(clone->GetQParams(), calc->GetQParams());
  }
  ASSERT_OK_AND_ASSIGN(auto empty, Make("mse", MakeSpec("int8", QS::kSymmetric)));
  ASSERT_OK_AND_ASSIGN(auto restored, CreateStatefulFromState(empty->ExportState()));
  EXPECT_TRUE(SameState(empty->ExportState(), restored->ExportState()));
}

TEST(HistogramState, RejectsInconsistentStates) {
  ASSERT_OK_AND_ASSIGN(auto calc, Make("percentile", MakeSpec("int8", QS::kSymmetric), Bins(256)));
  ASSERT_OK(Fwd(*calc, Vec(kWorked)).status());
  const CalculatorState good = calc->ExportState();
  ASSERT_OK(CreateStatefulFromState(good).status());
  const std::vector<std::pair<const char*, void (*)(CalculatorState&)>> breakages = {
      {"no histogram", [](CalculatorState& s) { s.histogram.reset(); }},
      {"no parameters", [](CalculatorState& s) { s.histogram_params.reset(); }},
      {"unresolved parameters", [](CalculatorState& s) { s.histogram_params->percentile.reset(); }},
      {"other num_bins", [](CalculatorState& s) { s.histogram_params->num_bins = 512; }},
      {"trailing bin", [](CalculatorState& s) { s.histogram->counts.push_back(0); }},
      {"-0.0 extreme", [](CalculatorState& s) { s.histogram->max = -0.0; }},
      {"bad exponent", [](CalculatorState& s) { s.histogram->exponent = -4; }},
      {"not initialized", [](CalculatorState& s) { s.initialized = false; }},
      {"zero observations", [](CalculatorState& s) { s.observation_count = 0; }},
      {"buffers", [](CalculatorState& s) { s.qparams = QParamsFromAmax({}, 1.0, false); }},
      {"running range", [](CalculatorState& s) { s.running = WorkingRange(); }},
      {"averaging constant", [](CalculatorState& s) { s.averaging_constant = 0.5; }},
      {"non-finite under reject", [](CalculatorState& s) { s.histogram->nan_count = 1; }},
  };
  for (const auto& [what, apply] : breakages) {
    CalculatorState s = good;
    apply(s);
    EXPECT_CODE(CreateStatefulFromState(s), kInvalid) << what;
  }
}

}  // namespace
}  // namespace qparams::testing
