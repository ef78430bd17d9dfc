// The minmax range pass (semantics.md §2.2, vectors §9.4) checked against a naive
// per-element reference over every layout and dtype, on one thread and on the
// OpenMP paths; plus the non-finite and zero-size rejections (Policies 1 and 4) and
// range observations.

#include "core/range.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/granularity.h"
#include "core/observation.h"
#include "core/range_kernels.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

constexpr DType kAllDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                DType::kFloat64};

// Sets the OpenMP thread count for one scope (ObserveRange uses omp_get_max_threads).
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// Every version of the range pass's inner loops this CPU can run.
std::vector<range_internal::KernelLevel> KernelLevels() {
  std::vector<range_internal::KernelLevel> levels;
  for (int l = 0; l <= static_cast<int>(range_internal::DetectedKernelLevel()); ++l) {
    levels.push_back(static_cast<range_internal::KernelLevel>(l));
  }
  return levels;
}

// Caps the kernel level for one scope.
class ScopedKernelLevel {
 public:
  explicit ScopedKernelLevel(range_internal::KernelLevel level)
      : saved_(range_internal::kernel_level_cap.exchange(level)) {}
  ~ScopedKernelLevel() { range_internal::kernel_level_cap = saved_; }

 private:
  range_internal::KernelLevel saved_;
};

uint64_t ExponentMask(DType d) {
  switch (d) {
    case DType::kFloat32:
      return 0x7f800000u;
    case DType::kFloat16:
      return 0x7c00u;
    case DType::kBFloat16:
      return 0x7f80u;
    case DType::kFloat64:
      return 0x7ff0000000000000ull;
  }
  return 0;
}

int64_t Count(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Random finite raw bit patterns: every sign and magnitude, subnormals and zeros.
Tensor RandomBits(DType dtype, Shape shape, uint32_t seed) {
  const int64_t n = Count(shape);
  const int size = ItemSize(dtype);
  const uint64_t mask = ExponentMask(dtype);
  std::mt19937_64 gen(seed);
  std::string data(n * size, '\0');
  for (int64_t i = 0; i < n; ++i) {
    uint64_t bits;
    do {
      bits = gen();
      if (size < 8) bits &= (uint64_t{1} << (8 * size)) - 1;
    } while ((bits & mask) == mask);
    std::memcpy(data.data() + i * size, &bits, size);  // little-endian low bytes
  }
  return Tensor{dtype, std::move(shape), std::move(data)};
}

// Normal data, as a typical activation.
Tensor RandomNormal(DType dtype, Shape shape, uint32_t seed) {
  const int64_t n = Count(shape);
  return MakeTensor(dtype, std::move(shape), RandN(n, seed, 10.0));
}

// ObserveRange equals the naive reference by value (a block holding both +0.0 and -0.0
// may report either) and carries the input dtype and the block-count shape.
void ExpectMatchesNaive(const Tensor& t, const Shape& block, const NaiveRange& ref) {
  ASSERT_OK_AND_ASSIGN(BlockRange got, ObserveRange(t.view(), block));
  for (const Tensor* out : {&got.min, &got.max}) {
    EXPECT_EQ(out->dtype, t.dtype);
    EXPECT_EQ(out->shape, ref.counts);
    ASSERT_EQ(out->data.size(), ref.lo.size() * ItemSize(t.dtype));
  }
  const std::vector<double> lo = Values(got.min.view()), hi = Values(got.max.view());
  for (size_t b = 0; b < ref.lo.size(); ++b) {
    ASSERT_EQ(lo[b], ref.lo[b]) << "min of block " << b;
    ASSERT_EQ(hi[b], ref.hi[b]) << "max of block " << b;
  }
}

struct Layout {
  Shape shape;
  Granularity granularity;
  Target target = Target::kWeight;
};

std::string Name(const Layout& l) {
  return absl::StrCat(l.granularity.ToString(), " ", TargetName(l.target), " on ",
                      ShapeString(l.shape));
}

// Each layout in every dtype, with raw-bit data and normal data (or, with
// `one_dataset`, one of the two by turns to keep large cases quick).
void CheckLayouts(const std::vector<Layout>& layouts, const std::vector<int>& thread_counts,
                  bool one_dataset = false) {
  uint32_t seed = 1;
  int turn = 0;
  for (const Layout& l : layouts) {
    ASSERT_OK_AND_ASSIGN(Shape block, l.granularity.BlockShape(l.shape, l.target));
    ++turn;  // alternate the starting dataset per layout too
    for (DType dtype : kAllDTypes) {
      ++turn;
      for (bool raw_bits : {true, false}) {
        if (one_dataset && raw_bits != (turn % 2 == 0)) continue;
        const Tensor t =
            raw_bits ? RandomBits(dtype, l.shape, seed) : RandomNormal(dtype, l.shape, seed);
        ++seed;
        const NaiveRange ref = NaiveBlockRange(t.view(), block);
        for (int threads : thread_counts) {
          for (range_internal::KernelLevel level : KernelLevels()) {
            SCOPED_TRACE(absl::StrCat(Name(l), ", ", DTypeName(dtype),
                                      raw_bits ? " raw bits" : " normal", ", ", threads,
                                      " threads, kernel level ", static_cast<int>(level)));
            ScopedThreads scoped(threads);
            ScopedKernelLevel scoped_level(level);
            ExpectMatchesNaive(t, block, ref);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// Every layout of §2.2 on small tensors (single-threaded path).
TEST(ObserveRange, SmallLayoutsMatchNaiveReference) {
  const std::vector<Layout> layouts = {
      {{6, 10}, Granularity::PerTensor()},
      {{6, 10}, Granularity::PerChannel(0)},
      {{6, 10}, Granularity::PerChannel(-1)},  // last axis: strided blocks
      {{6, 10}, Granularity::PerBlock(1, 5)},
      {{6, 10}, Granularity::PerBlock(0, 2)},
      {{4, 6, 10}, Granularity::PerBlock(1, 3), Target::kWeight},      // B = (1, 3, 10)
      {{4, 6, 10}, Granularity::PerBlock(1, 3), Target::kActivation},  // B = (1, 3, 1)
      {{4, 6, 10}, Granularity::PerBlock(0, 2), Target::kActivation},  // B = (2, 1, 1)
      {{4, 6, 10}, Granularity::PerBlock(-1, 5)},
      {{4, 6, 10}, Granularity::PerBlock(std::vector<int64_t>{2, -1, 5})},
      {{4, 6, 10}, Granularity::PerBlock(std::vector<int64_t>{-1, 3, -1})},
      {{4, 6, 10}, Granularity::PerChannel(1)},  // middle axis of rank 3
      {{1, 18, 4}, Granularity::PerBlock(1, 3)},
      {{2, 1}, Granularity::PerChannel(0)},  // §9.4: no reduction at all
      {{2, 1}, Granularity::PerBlock(std::vector<int64_t>{1, 1})},
      {{5}, Granularity::PerTensor()},
      {{7}, Granularity::PerChannel(0)},
      {{3, 1, 5, 1}, Granularity::PerChannel(2)},
      {{3, 4, 5, 6}, Granularity::PerBlock(std::vector<int64_t>{-1, 2, 1, 3})},
      // Short rows in batches (the transposing kernels) plus leftover rows.
      {{20, 32}, Granularity::PerBlock(1, 32)},
      {{37, 64}, Granularity::PerBlock(1, 16)},
      {{19, 128}, Granularity::PerBlock(-1, 128)},
      {{40, 64}, Granularity::PerBlock(1, 8)},
  };
  CheckLayouts(layouts, {1, 4});
}

// Row lengths 1..70 in each dtype: every tail length of a vectorized inner loop, for
// rows reduced whole (per_channel(0)) and combined elementwise (per_channel(-1)), the
// latter both in fewer rows than a batch and in whole batches plus a partial one.
TEST(ObserveRange, EveryShortRowLength) {
  std::vector<Layout> layouts;
  for (int64_t n = 1; n <= 70; ++n) {
    layouts.push_back({{3, n}, Granularity::PerChannel(0)});
    layouts.push_back({{3, n}, Granularity::PerChannel(-1)});
    layouts.push_back({{19, n}, Granularity::PerChannel(-1)});
  }
  CheckLayouts(layouts, {1});
}

// Passes large enough to write their output with non-temporal stores: short rows in
// transposing batches, on one thread and on three (whose chunks start at rows off the
// 16-byte boundary of the output).
TEST(ObserveRange, LargeShortRowPassesMatchNaiveReference) {
  const std::vector<Layout> layouts = {
      {{3200, 1024}, Granularity::PerBlock(-1, 32)},
      {{1543, 2048}, Granularity::PerBlock(-1, 64)},
  };
  CheckLayouts(layouts, {1, 3}, /*one_dataset=*/true);
}

// Tensors above the 65536-element threshold, on several thread counts so that each
// OpenMP strategy (row-per-block, disjoint slices, private partials) is taken.
TEST(ObserveRange, LargeLayoutsMatchNaiveReferenceOnEveryThreadCount) {
  const std::vector<Layout> layouts = {
      {{300, 700}, Granularity::PerTensor()},
      {{300, 700}, Granularity::PerChannel(0)},
      {{300, 700}, Granularity::PerChannel(-1)},
      {{300, 700}, Granularity::PerBlock(1, 70)},
      {{300, 700}, Granularity::PerBlock(0, 30)},
      {{6, 100, 350}, Granularity::PerChannel(1)},  // strided middle axis
      {{6, 100, 350}, Granularity::PerChannel(0)},
      {{6, 100, 350}, Granularity::PerBlock(1, 10), Target::kWeight},
      {{6, 100, 350}, Granularity::PerBlock(1, 10), Target::kActivation},
      {{6, 100, 350}, Granularity::PerBlock(std::vector<int64_t>{2, -1, 50})},
      {{3, 70000}, Granularity::PerChannel(0)},  // fewer rows than threads
      {{70000}, Granularity::PerBlock(0, 7)},
      {{67, 1024}, Granularity::PerBlock(-1, 32)},  // transposing kernels, odd batches
      {{65, 1088}, Granularity::PerBlock(-1, 64)},
  };
  CheckLayouts(layouts, {1, 2, 3, 4}, /*one_dataset=*/true);
}

// Spans of 64 KiB and more drop the signed minimum once they have shown both signs
// (ReduceRow in range_kernels_avx2.cc). Spans whose signs mix late, never, or only in
// the tail, with their extremes placed before, at and after the switch; as one
// per_tensor span and as the two rows of per_channel(0).
TEST(ObserveRange, LongSpansWhoseSignsMixLateOrNever) {
  struct Case {
    const char* name;
    std::vector<std::pair<int64_t, double>> writes;  // (index, value) over a base fill
    double fill;
  };
  constexpr int64_t kN = 80000;  // rows of 40000: 80 KB in 16-bit formats
  auto spread = [](double base) {  // distinct values of one sign, both extremes mid-row
    std::vector<std::pair<int64_t, double>> w;
    for (int64_t i = 7; i < kN; i += 7) w.push_back({i, base + 1 + (i % 97) / 8.0});
    w.push_back({20001, base});
    w.push_back({50001, base + 20});
    return w;
  };
  // Index 20001 and 50001 are mid-row in both layouts, past the first sign check.
  std::vector<Case> cases = {
      {"all positive, smallest mid-row and last", {{20001, 0.5}, {50001, 0.25}, {kN - 1, 0.75}},
       3.0},
      {"all negative, extremes mid-row and last",
       {{20001, -0.5}, {50001, -0.25}, {20002, -90.0}, {50002, -96.0}, {kN - 1, -0.375}},
       -3.0},
      {"positive, negatives late", {{31000, -2.0}, {71000, -2.5}, {75000, 0.5}}, 3.0},
      {"negative, positives late", {{31000, 2.0}, {71000, 2.5}, {75000, -0.5}, {78000, -64.0}},
       -3.0},
      {"mixed early, extremes after the switch",
       {{1, -1.0}, {40001, -1.0}, {35000, -80.0}, {76000, 90.0}},
       3.0},
      {"signs mix only in the tails", {{39997, -5.0}, {kN - 3, -5.0}, {kN - 1, -0.0}}, 4.0},
      {"negative zero among positives mid-row", {{20001, -0.0}, {50001, -0.0}}, 1.5},
      {"varied positives", spread(1.0), 2.0},
      {"varied negatives", spread(-20.0), -2.0},
  };
  ScopedThreads threads(1);
  for (const Case& c : cases) {
    std::vector<double> values(kN, c.fill);
    for (const auto& [i, v] : c.writes) values[i] = v;
    for (DType dtype : kAllDTypes) {
      for (const auto& [shape, block] :
           {std::pair<Shape, Shape>{{kN}, {kN}}, std::pair<Shape, Shape>{{2, kN / 2}, {1, kN / 2}}}) {
        const Tensor t = MakeTensor(dtype, shape, values);
        const NaiveRange ref = NaiveBlockRange(t.view(), block);
        for (range_internal::KernelLevel level : KernelLevels()) {
          SCOPED_TRACE(absl::StrCat(c.name, ", ", DTypeName(dtype), " ", ShapeString(shape),
                                    ", kernel level ", static_cast<int>(level)));
          ScopedKernelLevel scoped_level(level);
          ExpectMatchesNaive(t, block, ref);
        }
      }
    }
  }
}

// Batches of short rows fold the extremes enough for the batch before (two, or all
// three after all-negative blocks), and the third where two are not (StoreRowsAvx2 in
// range_kernels_avx2.cc). Groups of 16 blocks of 32, each of one kind, in every
// ordered pair of kinds, so that each kind follows each other; a kind's odd block out
// sits in several lanes of the batch (a float32 batch is 8 rows).
TEST(ObserveRange, ShortRowBatchesWhoseBlocksChangeSign) {
  constexpr int64_t kBlock = 32, kGroup = 16;
  enum Block { kMixed, kPositive, kNegative, kZeros, kPositiveAndNegativeZero };
  struct Kind {
    Block all, odd;
    int odd_lane;  // -1: none
  };
  const std::vector<Kind> kinds = {
      {kMixed, kMixed, -1},
      {kPositive, kPositive, -1},
      {kNegative, kNegative, -1},
      {kZeros, kZeros, -1},
      {kMixed, kPositive, 0},
      {kMixed, kNegative, 15},
      {kMixed, kZeros, 8},
      {kPositive, kMixed, 7},
      {kPositive, kNegative, 15},
      {kPositive, kPositiveAndNegativeZero, 3},
      {kNegative, kPositive, 0},
      {kNegative, kMixed, 9},
      {kZeros, kPositiveAndNegativeZero, 12},
  };
  std::mt19937 gen(5);
  auto magnitude = [&gen] { return 0.25 + (gen() % 1000) / 128.0; };
  auto append_block = [&](Block b, std::vector<double>& values) {
    for (int64_t i = 0; i < kBlock; ++i) {
      double v = b == kZeros ? 0.0 : magnitude();
      if (b == kNegative || (b == kMixed && (i == 5 || gen() % 2 == 0))) v = -v;
      if (b == kMixed && i == 20) v = std::abs(v);
      if (b == kPositiveAndNegativeZero && i == 11) v = -0.0;
      values.push_back(v);
    }
  };
  std::vector<double> values;
  for (const Kind& a : kinds) {
    for (const Kind& b : kinds) {
      for (const Kind& k : {a, b}) {
        for (int lane = 0; lane < kGroup; ++lane) {
          append_block(lane == k.odd_lane ? k.odd : k.all, values);
        }
      }
    }
  }
  const int64_t blocks = static_cast<int64_t>(values.size()) / kBlock;
  const Shape shape = {blocks / 2, 2 * kBlock}, block = {1, kBlock};
  for (DType dtype : kAllDTypes) {
    const Tensor t = MakeTensor(dtype, shape, values);
    const NaiveRange ref = NaiveBlockRange(t.view(), block);
    for (int threads : {1, 3}) {
      for (range_internal::KernelLevel level : KernelLevels()) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dtype), ", ", threads, " threads, kernel level ",
                                  static_cast<int>(level)));
        ScopedThreads scoped(threads);
        ScopedKernelLevel scoped_level(level);
        ExpectMatchesNaive(t, block, ref);
      }
    }
  }
}

// Non-finite values in batches folded through two extremes: +Inf and NaN among
// non-negative blocks, -Inf and a negative NaN among mixed ones.
TEST(ObserveRange, RejectsNonFiniteValuesInBatchesOfOneSign) {
  constexpr int64_t kRows = 256, kBlock = 32;
  ScopedThreads threads(1);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const Tensor mixed = RandomNormal(dtype, {kRows, kBlock}, 3);
    std::vector<double> positive = Values(mixed.view());
    for (double& v : positive) v = std::abs(v);
    const Tensor non_negative = MakeTensor(dtype, {kRows, kBlock}, positive);
    const double inf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const std::pair<const Tensor*, double> cases[] = {
        {&non_negative, inf}, {&non_negative, nan}, {&mixed, -inf}, {&mixed, -nan}};
    for (const auto& [base, bad] : cases) {
      for (int64_t pos : {int64_t{0}, kRows * kBlock / 2 + 37, kRows * kBlock - 1}) {
        std::vector<double> v = Values(base->view());
        v[pos] = bad;
        const Tensor t = MakeTensor(dtype, {kRows, kBlock}, v);
        for (range_internal::KernelLevel level : KernelLevels()) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", bad, " at ", pos, ", kernel level ",
                                    static_cast<int>(level)));
          ScopedKernelLevel scoped_level(level);
          EXPECT_CODE(ObserveRange(t.view(), {1, kBlock}), kInvalid);
        }
      }
    }
  }
}

// semantics.md §9.4: integer 10x10 inputs containing both ends of [low, high].
TEST(ObserveRange, OldRangeCalculatorVectors) {
  const std::pair<int, int> ranges[] = {{0, 10}, {-10, 0}, {-10, 10}, {-20, -10}, {10, 20}};
  std::mt19937 gen(7);
  for (auto [low, high] : ranges) {
    std::vector<double> v(100);
    for (double& x : v) x = low + static_cast<int>(gen() % (high - low + 1));
    v[13] = low;
    v[87] = high;
    const Tensor t = F32({10, 10}, v);
    SCOPED_TRACE(absl::StrCat("[", low, ", ", high, "]"));

    // per_tensor: raw values, no clamping to include 0 ((10, 20) gives min 10).
    ASSERT_OK_AND_ASSIGN(BlockRange whole, ObserveRange(t.view(), {10, 10}));
    EXPECT_EQ(whole.min.shape, (Shape{1, 1}));
    EXPECT_EQ(Values(whole.min.view()), std::vector<double>{double(low)});
    EXPECT_EQ(Values(whole.max.view()), std::vector<double>{double(high)});

    // per_channel(axis=1): column minima over dim 0, shape (1, 10).
    ASSERT_OK_AND_ASSIGN(BlockRange cols, ObserveRange(t.view(), {10, 1}));
    EXPECT_EQ(cols.min.shape, (Shape{1, 10}));
    for (int c = 0; c < 10; ++c) {
      double mn = 1e9, mx = -1e9;
      for (int r = 0; r < 10; ++r)
        mn = std::min(mn, v[r * 10 + c]), mx = std::max(mx, v[r * 10 + c]);
      EXPECT_EQ(cols.min.view().ValueAt(c), mn);
      EXPECT_EQ(cols.max.view().ValueAt(c), mx);
    }

    // per_block(axis=0, b): groups of b consecutive rows per column, shape (10/b, 10).
    for (int b : {5, 2}) {
      ASSERT_OK_AND_ASSIGN(BlockRange blocks, ObserveRange(t.view(), {b, 1}));
      EXPECT_EQ(blocks.min.shape, (Shape{10 / b, 10}));
      for (int g = 0; g < 10 / b; ++g) {
        for (int c = 0; c < 10; ++c) {
          double mn = 1e9;
          for (int r = g * b; r < (g + 1) * b; ++r) mn = std::min(mn, v[r * 10 + c]);
          EXPECT_EQ(blocks.min.view().ValueAt(g * 10 + c), mn);
        }
      }
    }
  }
}

// §9.4: when nothing is reduced, min and max are the input itself, bit for bit.
TEST(ObserveRange, NoReductionReturnsTheInputBits) {
  const Tensor t = F32({2, 1}, {-0.0, 3.5});
  ASSERT_OK_AND_ASSIGN(BlockRange r, ObserveRange(t.view(), {1, 1}));
  EXPECT_EQ(r.min.data, t.data);
  EXPECT_EQ(r.max.data, t.data);
}

// Policy 1: NaN (any payload or sign), +Inf and -Inf are rejected wherever they sit.
TEST(ObserveRange, RejectsNonFiniteValuesInEveryDtype) {
  struct Bad {
    DType dtype;
    uint64_t bits;
  };
  const Bad bad[] = {
      {DType::kFloat32, 0x7fc00000u},
      {DType::kFloat32, 0xffc00001u},
      {DType::kFloat32, 0x7f800001u},
      {DType::kFloat32, 0x7f800000u},
      {DType::kFloat32, 0xff800000u},
      {DType::kFloat16, 0x7e00u},
      {DType::kFloat16, 0xfc01u},
      {DType::kFloat16, 0x7c00u},
      {DType::kFloat16, 0xfc00u},
      {DType::kBFloat16, 0x7fc0u},
      {DType::kBFloat16, 0xff81u},
      {DType::kBFloat16, 0x7f80u},
      {DType::kBFloat16, 0xff80u},
      {DType::kFloat64, 0x7ff8000000000000ull},
      {DType::kFloat64, 0xfff0000000000001ull},
      {DType::kFloat64, 0x7ff0000000000000ull},
      {DType::kFloat64, 0xfff0000000000000ull},
  };
  const std::pair<Shape, Shape> layouts[] = {
      {{6, 10}, {6, 10}},        // per_tensor, small
      {{6, 10}, {6, 1}},         // per_channel(-1), small
      {{3, 37}, {1, 37}},        // per_channel(0), odd row length
      {{300, 700}, {300, 700}},  // large: threads share the blocks
      {{300, 700}, {1, 700}},    // large: a row per block
      {{300, 700}, {300, 1}},    // large: strided
      {{64, 1024}, {1, 32}},     // large: short rows, batched
      {{64, 37}, {64, 1}},       // rows combined in batches, a partial last vector
  };
  ScopedThreads threads(4);
  for (const Bad& b : bad) {
    for (const auto& [shape, block] : layouts) {
      for (range_internal::KernelLevel level : KernelLevels()) {
        ScopedKernelLevel scoped_level(level);
        const Tensor base = RandomNormal(b.dtype, shape, 99);
        const int64_t n = Count(shape);
        for (int64_t pos : {int64_t{0}, n / 2 + 3, n - 1}) {
          Tensor t = base;
          std::memcpy(t.data.data() + pos * ItemSize(b.dtype), &b.bits, ItemSize(b.dtype));
          SCOPED_TRACE(absl::StrCat(DTypeName(b.dtype), " bits ", absl::Hex(b.bits), " at ", pos,
                                    " of ", ShapeString(shape)));
          EXPECT_EQ(FindNonFinite(t.view()), pos);
          EXPECT_CODE(ObserveRange(t.view(), block), kInvalid);
        }
      }
    }
  }
}

// The same in passes whose output is stored non-temporally.
TEST(ObserveRange, RejectsNonFiniteValuesInLargeShortRowPasses) {
  struct Case {
    DType dtype;
    Shape shape, block;
    uint64_t bits[2];
  };
  const Case cases[] = {
      {DType::kFloat32, {3200, 1024}, {1, 32}, {0x7fc00000u, 0xff800000u}},
      {DType::kBFloat16, {1543, 2048}, {1, 64}, {0xff81u, 0x7f80u}},
  };
  ScopedThreads threads(1);
  for (const Case& c : cases) {
    const Tensor base = RandomNormal(c.dtype, c.shape, 7);
    ASSERT_OK(ObserveRange(base.view(), c.block).status());
    const int64_t n = Count(c.shape);
    for (uint64_t bits : c.bits) {
      for (int64_t pos : {int64_t{0}, n / 2 + 5, n - 1}) {
        Tensor t = base;
        std::memcpy(t.data.data() + pos * ItemSize(c.dtype), &bits, ItemSize(c.dtype));
        SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), " bits ", absl::Hex(bits), " at ", pos));
        EXPECT_CODE(ObserveRange(t.view(), c.block), kInvalid);
      }
    }
  }
}

TEST(ObserveRange, FindNonFiniteReportsTheFirstOrMinusOne) {
  EXPECT_EQ(FindNonFinite(Vec({1, 2, INFINITY, NAN, 3}).view()), 2);
  EXPECT_EQ(FindNonFinite(Vec({1, 2, 3}).view()), -1);
  // The largest finite values are not flagged.
  EXPECT_EQ(FindNonFinite(Vec({std::numeric_limits<float>::max(), -65504.0}).view()), -1);
  EXPECT_EQ(FindNonFinite(FromBits16(DType::kFloat16, {2}, {0x7bff, 0xfbff}).view()), -1);
  EXPECT_EQ(FindNonFinite(FromBits16(DType::kBFloat16, {2}, {0x7f7f, 0xff7f}).view()), -1);
}

// Policy 4: zero-size tensors are rejected where values are read.
TEST(ObserveRange, RejectsZeroSize) {
  for (const Shape& shape : {Shape{0}, Shape{0, 5}, Shape{3, 0}, Shape{2, 0, 4}}) {
    ASSERT_OK_AND_ASSIGN(TensorView v, TensorView::Create(DType::kFloat32, shape, ""));
    EXPECT_CODE(ObserveRange(v, shape), kInvalid) << ShapeString(shape);
    EXPECT_EQ(FindNonFinite(v), -1);
  }
}

// ---- Range observations (observation.h) ----

TEST(Observation, RangeOfATensorAndOfItsReductionAreIdentical) {
  const Tensor t = RandomNormal(DType::kBFloat16, {4, 6, 10}, 5);
  const Shape block = {1, 3, 1};
  ASSERT_OK_AND_ASSIGN(BlockRange direct, Obs(t).Range(block));
  ASSERT_OK_AND_ASSIGN(BlockRange reduced, ObserveRange(t.view(), block));
  const Observation o = Observation::FromRange(t.shape, reduced.min.view(), reduced.max.view());
  EXPECT_TRUE(o.is_range());
  EXPECT_FALSE(Obs(t).is_range());
  EXPECT_EQ(o.dtype(), DType::kBFloat16);
  EXPECT_EQ(o.input_shape(), t.shape);
  ASSERT_OK_AND_ASSIGN(BlockRange via_range, o.Range(block));
  EXPECT_EQ(via_range.min.data, direct.min.data);
  EXPECT_EQ(via_range.max.data, direct.max.data);
  EXPECT_EQ(via_range.min.shape, direct.min.shape);
}

TEST(Observation, MalformedRangeObservationsAreInvalidArgument) {
  const Shape input = {4, 6};
  const Shape block = {1, 6};  // per_channel(0): N = (4, 1)
  const Tensor lo = F32({4, 1}, {-1, -2, -3, -4});
  const Tensor hi = F32({4, 1}, {1, 2, 3, 4});
  EXPECT_OK(Observation::FromRange(input, lo.view(), hi.view()).Range(block).status());

  const Tensor wrong_shape = F32({1, 4}, {1, 2, 3, 4});
  EXPECT_CODE(Observation::FromRange(input, lo.view(), wrong_shape.view()).Range(block), kInvalid);
  const Tensor wrong_dtype = MakeTensor(DType::kFloat16, {4, 1}, {1, 2, 3, 4});
  EXPECT_CODE(Observation::FromRange(input, lo.view(), wrong_dtype.view()).Range(block), kInvalid);
  const Tensor with_nan = F32({4, 1}, {-1, NAN, -3, -4});
  EXPECT_CODE(Observation::FromRange(input, with_nan.view(), hi.view()).Range(block), kInvalid);
  const Tensor with_inf = F32({4, 1}, {1, 2, 3, INFINITY});
  EXPECT_CODE(Observation::FromRange(input, lo.view(), with_inf.view()).Range(block), kInvalid);
  const Tensor crossed = F32({4, 1}, {1, 2, -3.5, 4});  // min > max in block 2
  EXPECT_CODE(Observation::FromRange(input, lo.view(), crossed.view()).Range(block), kInvalid);
  // An input with no elements.
  const Tensor empty = F32({0, 1}, {});
  EXPECT_CODE(Observation::FromRange({0, 6}, empty.view(), empty.view()).Range({0, 6}), kInvalid);
}

// The merge of two block ranges is their concatenation's, exact in every dtype, and
// independent of their order, signed zeros included.
TEST(MergeBlockRanges, IsTheConcatenationsRangeInEitherOrder) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    const Tensor a = MakeTensor(dtype, {2, 3}, {-1, 0.0, 5, 2, -0.0, 1.5});
    const Tensor b = MakeTensor(dtype, {3, 3}, {-3, -0.0, 4, 7, 0.0, 1.25, 0, 0.5, -2});
    absl::StatusOr<BlockRange> ra = ObserveRange(a.view(), {2, 1});
    absl::StatusOr<BlockRange> rb = ObserveRange(b.view(), {3, 1});
    ASSERT_OK(ra);
    ASSERT_OK(rb);
    absl::StatusOr<BlockRange> ab = MergeBlockRanges(*ra, *rb);
    absl::StatusOr<BlockRange> ba = MergeBlockRanges(*rb, *ra);
    ASSERT_OK(ab);
    ASSERT_OK(ba);
    EXPECT_EQ(Values(ab->min.view()), std::vector<double>({-3, -0.0, -2}));
    EXPECT_EQ(Values(ab->max.view()), std::vector<double>({7, 0.5, 5}));
    EXPECT_TRUE(std::signbit(Values(ab->min.view())[1])) << "-0 is the smaller zero";
    EXPECT_EQ(ab->min.data.view(), ba->min.data.view());
    EXPECT_EQ(ab->max.data.view(), ba->max.data.view());
  }
  absl::StatusOr<BlockRange> f32 = ObserveRange(F32({1, 2}, {1, 2}).view(), {1, 1});
  absl::StatusOr<BlockRange> f16 =
      ObserveRange(MakeTensor(DType::kFloat16, {1, 2}, {1, 2}).view(), {1, 1});
  EXPECT_CODE(MergeBlockRanges(*f32, *f16), kInvalid);
}

}  // namespace
}  // namespace qparams::testing
