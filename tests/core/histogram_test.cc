// The power-of-two histogram (histogram.md §2–§3): the canonical exponent, exact
// binning for every dtype and thread count, coarsening, merging in any order, and the
// validation rules of a received histogram.

#include "core/histogram.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/range.h"
#include "core/range_kernels.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

constexpr NonFinitePolicy kReject = NonFinitePolicy::kReject;
constexpr NonFinitePolicy kIgnore = NonFinitePolicy::kIgnore;
constexpr double kInf = std::numeric_limits<double>::infinity();

absl::StatusOr<Histogram> Bin(const Tensor& t, int num_bins = 256,
                              NonFinitePolicy policy = kReject) {
  return BinTensor(t.view(), num_bins, policy);
}

// The reference: floor(|x|·2^-e) in double (exact for every input dtype), one value
// at a time, with the exponent of the data's amax.
Histogram NaiveBin(const std::vector<double>& values, int num_bins, int exponent) {
  Histogram h = Histogram::Empty(num_bins);
  h.exponent = exponent;
  for (double v : values) {
    const size_t k = static_cast<size_t>(std::floor(std::ldexp(std::fabs(v), -exponent)));
    if (k >= h.counts.size()) h.counts.resize(k + 1, 0);
    ++h.counts[k];
  }
  return h;
}

// The largest value of `dtype` below the positive normal `v` (a value of `dtype`).
double Predecessor(DType dtype, double v) {
  switch (dtype) {
    case DType::kFloat16:
      return HalfToFloat(FloatToHalf(static_cast<float>(v)) - 1);
    case DType::kBFloat16:
      return BFloat16ToFloat(FloatToBFloat16(static_cast<float>(v)) - 1);
    case DType::kFloat32:
      return std::nextafter(static_cast<float>(v), 0.0f);
    case DType::kFloat64:
      break;
  }
  return std::nextafter(v, 0.0);
}

// Sets the range threads for one scope.
class ThreadsScope {
 public:
  explicit ThreadsScope(int threads) { SetRangeThreads(threads); }
  ~ThreadsScope() { SetRangeThreads(0); }
};

TEST(HistogramExponent, CanonicalExponentExamples) {
  EXPECT_EQ(CanonicalExponent(1.0, 4096), -11);
  EXPECT_EQ(OccupiedBins(1.0, 4096), 2049);
  const double below_one = std::nextafter(1.0, 0.0);
  EXPECT_EQ(CanonicalExponent(below_one, 4096), -12);
  EXPECT_EQ(OccupiedBins(below_one, 4096), 4096);
  EXPECT_EQ(CanonicalExponent(0.0, 256), -126);
  EXPECT_EQ(OccupiedBins(0.0, 256), 1);
  EXPECT_EQ(CanonicalExponent(0x1.0p-130, 256), -126);  // clamped: tiny data
  EXPECT_EQ(OccupiedBins(0x1.0p-130, 256), 1);
  EXPECT_EQ(CanonicalExponent(7.300000190734863, 256), -5);
  EXPECT_EQ(CanonicalExponent(std::nextafter(0x1.0p128, 0.0), 256), 120);
}

// amax < N·2^e always, and e is the smallest such exponent >= -126.
TEST(HistogramExponent, SmallestExponentHoldingAmax) {
  for (int num_bins : {256, 4096, 65536}) {
    for (double amax : {1e-40, 1e-30, 0.1, 1.0, 3.0, 1024.0, 1e30, 3e38}) {
      const int e = CanonicalExponent(amax, num_bins);
      EXPECT_LT(amax, std::ldexp(num_bins, e)) << amax;
      if (e > -126) {
        EXPECT_GE(amax, std::ldexp(num_bins, e - 1)) << amax;
      }
      EXPECT_LE(OccupiedBins(amax, num_bins), num_bins);
    }
  }
}

// histogram.md §12: the worked example.
TEST(HistogramBinning, WorkedExample) {
  ASSERT_OK_AND_ASSIGN(Histogram h, Bin(Vec({-3.0, 0.5, 1.0, 2.0, 2.5, 7.3})));
  EXPECT_EQ(h.exponent, -5);
  ASSERT_EQ(h.counts.size(), 234u);
  for (int k : {96, 16, 32, 64, 80, 233}) EXPECT_EQ(h.counts[k], 1u) << k;
  EXPECT_EQ(h.total(), 6u);
  EXPECT_EQ(h.negative_count, 1u);
  EXPECT_EQ(h.zero_count, 0u);
  EXPECT_EQ(*h.min, -3.0);
  EXPECT_EQ(*h.max, static_cast<double>(7.3f));
  EXPECT_OK(ValidateHistogramState(h, 256, kReject));
}

// Values at a bin edge and one ulp below it land in adjacent bins, for every dtype.
TEST(HistogramBinning, EdgesAreExactForEveryDType) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    // amax 2.0 with 256 bins: e = 2 - 8 = -6, edges k/64.
    std::vector<double> values = {2.0, 1.0, 0.5, 0.25, 1.5, -0.75};
    std::vector<double> below;
    for (double v : values) below.push_back(std::copysign(Predecessor(dtype, std::fabs(v)), v));
    values.insert(values.end(), below.begin(), below.end());
    ASSERT_OK_AND_ASSIGN(Histogram h, Bin(MakeTensor(dtype, {12}, values)));
    EXPECT_EQ(h.exponent, -6) << DTypeName(dtype);
    EXPECT_EQ(h.counts, NaiveBin(values, 256, -6).counts) << DTypeName(dtype);
    EXPECT_EQ(h.counts[128], 1u);  // 2.0
    EXPECT_EQ(h.counts[127], 1u);  // just below 2.0
    EXPECT_EQ(h.counts[64], 1u);   // 1.0
    EXPECT_EQ(h.counts[63], 1u);
  }
}

// Random data of every dtype, subnormals and zeros included, against the reference.
TEST(HistogramBinning, MatchesTheReferenceForEveryDType) {
  std::vector<double> data = RandN(5000, 7, 3.0);
  data.push_back(0.0);
  data.push_back(-0.0);
  data.push_back(1e-41);   // float32 subnormal
  data.push_back(-3e-8);   // float16 subnormal
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    const Tensor t = MakeTensor(dtype, {static_cast<int64_t>(data.size())}, data);
    const std::vector<double> exact = Values(t.view());
    for (int num_bins : {256, 4096, 65536}) {
      ASSERT_OK_AND_ASSIGN(Histogram h, Bin(t, num_bins));
      double amax = 0;
      for (double v : exact) amax = std::max(amax, std::fabs(v));
      const Histogram want = NaiveBin(exact, num_bins, CanonicalExponent(amax, num_bins));
      EXPECT_EQ(h.exponent, want.exponent);
      EXPECT_EQ(h.counts, want.counts) << DTypeName(dtype) << " " << num_bins;
      EXPECT_EQ(h.zero_count, static_cast<uint64_t>(std::count(exact.begin(), exact.end(), 0.0)));
      EXPECT_OK(ValidateHistogramState(h, num_bins, kReject));
    }
  }
}

// The float32 bin loop exists portable and for AVX2, and a large pass spreads its
// increments over four sets of counters: every version counts exactly.
TEST(HistogramBinning, EveryKernelLevelAndCounterSetCountsExactly) {
  std::vector<double> data = RandN(200003, 5, 2.0);
  for (int i = 0; i < 1000; ++i) data[i * 97] = i % 2 ? 0.0 : -0.0;
  data[11] = 1e-41;  // subnormal
  data[12] = -40.0;  // an outlier
  const Tensor t = MakeTensor(DType::kFloat32, {static_cast<int64_t>(data.size())}, data);
  const std::vector<double> exact = Values(t.view());
  const int64_t negatives =
      std::count_if(exact.begin(), exact.end(), [](double v) { return v < 0; });
  using range_internal::KernelLevel;
  for (KernelLevel level : {KernelLevel::kPortable, KernelLevel::kAvx2}) {
    const KernelLevel saved = range_internal::kernel_level_cap.exchange(level);
    for (int num_bins : {256, 4096, 65536}) {  // four sets of counters, then one
      for (int threads : {1, 2}) {
        ThreadsScope scope(threads);
        ASSERT_OK_AND_ASSIGN(Histogram h, Bin(t, num_bins));
        const Histogram want = NaiveBin(exact, num_bins, CanonicalExponent(40.0, num_bins));
        EXPECT_EQ(h.counts, want.counts) << num_bins << " bins, " << threads << " threads";
        EXPECT_EQ(h.zero_count, 1000u);
        EXPECT_EQ(h.negative_count, static_cast<uint64_t>(negatives));
      }
    }
    range_internal::kernel_level_cap = saved;
  }
}

// Per-thread partial histograms add exactly: any thread count gives the same bits.
// The largest team comes first: LLVM 14's libomp leaks a team's dispatch buffers
// when a team of more than one thread grows to 7 under a dynamic schedule (the range
// pass's), which LeakSanitizer reports at exit; a shrinking team frees them.
TEST(HistogramBinning, IndependentOfTheThreadCount) {
  const std::vector<double> data = RandN(300001, 11, 0.5);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat64}) {
    const Tensor t = MakeTensor(dtype, {static_cast<int64_t>(data.size())}, data);
    std::optional<Histogram> first;
    for (int threads : {7, 3, 2, 1}) {
      ThreadsScope scope(threads);
      ASSERT_OK_AND_ASSIGN(Histogram h, Bin(t, 4096));
      if (!first) first = h;
      EXPECT_EQ(h, *first) << DTypeName(dtype) << " threads " << threads;
    }
    EXPECT_EQ(first->total(), data.size());
  }
}

TEST(HistogramBinning, ZerosAndSigns) {
  ASSERT_OK_AND_ASSIGN(Histogram h, Bin(Vec({0.0, -0.0, 0.0})));
  EXPECT_EQ(h.exponent, -126);
  EXPECT_EQ(h.counts, (std::vector<uint64_t>{3}));
  EXPECT_EQ(h.zero_count, 3u);
  EXPECT_EQ(h.negative_count, 0u);  // -0 is not negative
  EXPECT_FALSE(std::signbit(*h.min));  // a zero extreme is +0.0
  EXPECT_FALSE(std::signbit(*h.max));
}

TEST(HistogramBinning, NonFiniteValues) {
  const Tensor t = Vec({std::nan(""), 1.0, -kInf, -2.0, kInf, std::nan("")});
  EXPECT_CODE(Bin(t), kInvalid);
  ASSERT_OK_AND_ASSIGN(Histogram h, Bin(t, 4096, kIgnore));
  ASSERT_OK_AND_ASSIGN(Histogram finite, Bin(Vec({1.0, -2.0}), 4096));
  EXPECT_EQ(h.nan_count, 2u);
  EXPECT_EQ(h.posinf_count, 1u);
  EXPECT_EQ(h.neginf_count, 1u);
  h.nan_count = h.posinf_count = h.neginf_count = 0;
  EXPECT_EQ(h, finite);  // nothing else changes

  ASSERT_OK_AND_ASSIGN(Histogram only, Bin(Vec({kInf}), 256, kIgnore));
  EXPECT_FALSE(only.has_finite());
  EXPECT_TRUE(only.counts.empty());
  EXPECT_EQ(only.exponent, -126);
}

TEST(HistogramBinning, RejectsEmptyTensorsAndHugeFloat64) {
  EXPECT_CODE(Bin(Vec({})), kInvalid);
  EXPECT_CODE(Bin(Vec({1.0, 0x1.0p128}, DType::kFloat64)), kInvalid);
  ASSERT_OK_AND_ASSIGN(Histogram h, Bin(Vec({std::nextafter(0x1.0p128, 0.0)}, DType::kFloat64)));
  EXPECT_EQ(h.exponent, 120);
  EXPECT_EQ(h.counts.size(), 256u);
  // A float32 tensor cannot hold 2^128; its largest value bins normally.
  EXPECT_OK(Bin(Vec({3.4028234663852886e38})).status());
}

// Coarsening by d equals binning at e + d directly (floor(floor(y)/2^d) = floor(y/2^d)).
TEST(HistogramCoarsen, EqualsDirectBinning) {
  const std::vector<double> data = RandN(4000, 3, 10.0);
  ASSERT_OK_AND_ASSIGN(Histogram h, Bin(Vec(data), 1024));
  const std::vector<double> exact = Values(Vec(data).view());
  for (int d : {0, 1, 3, 9, 10, 11, 40}) {
    const Histogram c = Coarsen(h, h.exponent + d);
    EXPECT_EQ(c.exponent, h.exponent + d);
    Histogram want = NaiveBin(exact, 1024, h.exponent + d);
    EXPECT_EQ(c.counts, want.counts) << d;
    EXPECT_EQ(c.total(), h.total());
  }
}

// Every order, partition and merge tree of a multiset gives the histogram of the
// whole, bit for bit, and the union of tensors equals the merge of their histograms.
TEST(HistogramMerge, AssociativeCommutativeAndEqualToTheWhole) {
  std::vector<std::vector<double>> parts = {RandN(1000, 1, 0.01), RandN(700, 2, 5.0),
                                            RandN(300, 3, 200.0), {0.0, -0.0, 1e-42},
                                            RandN(10, 4, 1e-20)};
  std::vector<double> all;
  std::vector<Histogram> binned;
  for (const auto& p : parts) {
    all.insert(all.end(), p.begin(), p.end());
    ASSERT_OK_AND_ASSIGN(Histogram h, Bin(Vec(p), 512));
    binned.push_back(h);
  }
  ASSERT_OK_AND_ASSIGN(const Histogram whole, Bin(Vec(all), 512));

  auto fold = [](const std::vector<Histogram>& hs, const std::vector<int>& order) {
    Histogram acc = Histogram::Empty(512);
    for (int i : order) acc = *Merge(acc, hs[i]);
    return acc;
  };
  EXPECT_EQ(fold(binned, {0, 1, 2, 3, 4}), whole);
  EXPECT_EQ(fold(binned, {4, 3, 2, 1, 0}), whole);
  EXPECT_EQ(fold(binned, {2, 0, 4, 1, 3}), whole);
  // A tree: (0+1) + ((2+3) + 4).
  ASSERT_OK_AND_ASSIGN(Histogram left, Merge(binned[0], binned[1]));
  ASSERT_OK_AND_ASSIGN(Histogram right23, Merge(binned[2], binned[3]));
  ASSERT_OK_AND_ASSIGN(Histogram right, Merge(right23, binned[4]));
  ASSERT_OK_AND_ASSIGN(Histogram tree, Merge(right, left));
  EXPECT_EQ(tree, whole);
  for (size_t i = 0; i < binned.size(); ++i) {
    for (size_t j = 0; j < binned.size(); ++j) {
      EXPECT_EQ(*Merge(binned[i], binned[j]), *Merge(binned[j], binned[i])) << i << " " << j;
    }
  }
  EXPECT_OK(ValidateHistogramState(whole, 512, kReject));
}

TEST(HistogramMerge, SideCountsExtremaAndErrors) {
  ASSERT_OK_AND_ASSIGN(Histogram a, Bin(Vec({-0.0, 1.0, kInf}), 256, kIgnore));
  ASSERT_OK_AND_ASSIGN(Histogram b, Bin(Vec({-4.0, std::nan("")}), 256, kIgnore));
  ASSERT_OK_AND_ASSIGN(Histogram m, Merge(a, b));
  EXPECT_EQ(m.nan_count, 1u);
  EXPECT_EQ(m.posinf_count, 1u);
  EXPECT_EQ(m.zero_count, 1u);
  EXPECT_EQ(m.negative_count, 1u);
  EXPECT_EQ(*m.min, -4.0);
  EXPECT_EQ(*m.max, 1.0);
  EXPECT_EQ(m.exponent, CanonicalExponent(4.0, 256));

  EXPECT_CODE(Merge(a, Histogram::Empty(512)), kInvalid);
  Histogram big = Histogram::Empty(256);
  big.exponent = CanonicalExponent(1.0, 256);
  big.counts.assign(129, 0);
  big.counts[128] = kHistogramValueLimit - 3;
  big.min = big.max = 1.0;
  ASSERT_OK(ValidateHistogram(big, 256, kReject));
  EXPECT_CODE(Merge(big, a), absl::StatusCode::kResourceExhausted);  // 2^62 - 3 + 3
  ASSERT_OK_AND_ASSIGN(Histogram fits, Bin(Vec({2.0, 3.0}), 256));
  EXPECT_OK(Merge(big, fits).status());  // 2^62 - 1
}

// A valid payload to break, one rule at a time.
Histogram ValidPayload() {
  Histogram h = *BinTensor(Vec({-3.0, 0.0, 0.5, 1.0, 2.0, 2.5, 7.3}).view(), 256, kReject);
  h.counts.resize(240, 0);  // trailing empty bins are allowed
  return h;
}

TEST(HistogramValidation, EveryRule) {
  ASSERT_OK(ValidateHistogram(ValidPayload(), 256, kReject));
  struct Case {
    const char* rule;  // the message names it
    const char* field;
    std::function<void(Histogram&)> breakage;
    NonFinitePolicy policy = kReject;
  };
  const std::vector<Case> cases = {
      {"rule 1", "num_bins", [](Histogram& h) { h.num_bins = 512; }},
      {"rule 2", "counts", [](Histogram& h) { h.counts.resize(257, 0); }},
      {"rule 3", "values", [](Histogram& h) { h.counts[0] += kHistogramValueLimit; }},
      {"rule 3", "values",  // two counts of 2^63 wrap a 64-bit sum to 0
       [](Histogram& h) {
         h.counts[1] = uint64_t{1} << 63;
         h.counts[2] = uint64_t{1} << 63;
       }},
      {"rule 3", "values", [](Histogram& h) { h.nan_count = kHistogramValueLimit; }, kIgnore},
      {"rule 4", "nan_count", [](Histogram& h) { h.nan_count = 1; }},
      {"rule 4", "posinf_count", [](Histogram& h) { h.posinf_count = 1; }},
      {"rule 4", "neginf_count", [](Histogram& h) { h.neginf_count = 2; }},
      {"rule 5", "no value", [](Histogram& h) { h = Histogram::Empty(256); }},
      {"rule 6", "min", [](Histogram& h) { h.max.reset(); }},
      {"rule 6", "max", [](Histogram& h) { h.min.reset(); }},
      {"rule 7", "counts",
       [](Histogram& h) {
         h.min.reset();
         h.max.reset();
       }},
      {"rule 7", "exponent",
       [](Histogram& h) {
         h = Histogram::Empty(256);
         h.nan_count = 1;
         h.exponent = -5;
       },
       kIgnore},
      {"rule 8.1", "finite", [](Histogram& h) { h.max = kInf; }},
      {"rule 8.1", "finite", [](Histogram& h) { h.min = std::nan(""); }},
      {"rule 8.1", "exceeds", [](Histogram& h) { h.min = 8.0; }},
      {"rule 8.1", "2^128",
       [](Histogram& h) {
         h.min = -0x1.0p128;
       }},
      {"rule 8.2", "exponent", [](Histogram& h) { h.exponent = -6; }},
      {"rule 8.3", "counts[233]", [](Histogram& h) { h.counts[233] = 0; }},
      {"rule 8.3", "counts[233]", [](Histogram& h) { h.counts.resize(200); }},
      {"rule 8.3", "counts[235]", [](Histogram& h) { h.counts[235] = 1; }},
      {"rule 8.4", "zero_count", [](Histogram& h) { h.zero_count = 2; }},
      {"rule 8.4", "negative_count", [](Histogram& h) { h.negative_count = 8; }},
      {"rule 8.5", "negative_count", [](Histogram& h) { h.negative_count = 0; }},
      {"rule 8.5", "negative_count", [](Histogram& h) { h.min = 0.0; }},
  };
  for (const Case& c : cases) {
    Histogram h = ValidPayload();
    c.breakage(h);
    const absl::Status s = ValidateHistogram(h, 256, c.policy);
    EXPECT_CODE(s, kInvalid) << c.rule << " " << c.field;
    EXPECT_NE(s.message().find(c.rule), std::string::npos) << s;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s;
  }
}

TEST(HistogramValidation, AcceptsWhatTheRulesAllow) {
  Histogram h = ValidPayload();
  h.min = -3.0;
  EXPECT_OK(ValidateHistogram(h, 256, kReject));
  // A -0.0 extreme and an implausible zero count (zero_count > 0 with min > 0).
  ASSERT_OK_AND_ASSIGN(Histogram z, Bin(Vec({0.0, 0.5})));
  z.min = -0.0;
  EXPECT_OK(ValidateHistogram(z, 256, kReject));
  ASSERT_OK_AND_ASSIGN(Histogram p, Bin(Vec({0.0, 0.5})));
  p.min = 0.25;
  p.counts[0] = 1;
  EXPECT_OK(ValidateHistogram(p, 256, kReject));
  // Only non-finite values, under ignore.
  Histogram n = Histogram::Empty(256);
  n.posinf_count = 3;
  EXPECT_OK(ValidateHistogram(n, 256, kIgnore));
  EXPECT_CODE(ValidateHistogram(n, 256, kReject), kInvalid);
}

TEST(HistogramValidation, StateIsCanonical) {
  EXPECT_OK(ValidateHistogramState(Histogram::Empty(256), 256, kReject));
  EXPECT_CODE(ValidateHistogram(Histogram::Empty(256), 256, kReject), kInvalid);  // rule 5
  EXPECT_CODE(ValidateHistogramState(ValidPayload(), 256, kReject), kInvalid);  // trailing bins
  ASSERT_OK_AND_ASSIGN(Histogram z, Bin(Vec({0.0, 0.5})));
  EXPECT_OK(ValidateHistogramState(z, 256, kReject));
  z.min = -0.0;
  EXPECT_CODE(ValidateHistogramState(z, 256, kReject), kInvalid);
}

}  // namespace
}  // namespace qparams::testing
