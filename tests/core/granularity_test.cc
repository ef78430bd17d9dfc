// Granularities and the block shapes they give (semantics.md §3, vectors §9.5).

#include "core/granularity.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

struct BlockCase {
  Granularity granularity;
  Shape shape;
  Shape block;
};

// semantics.md §9.5, valid cases (default target WEIGHT).
TEST(Granularity, BlockShapesOfTheValidTable) {
  const BlockCase cases[] = {
      {Granularity::PerTensor(), {10, 20, 30}, {10, 20, 30}},
      {Granularity::PerTensor(), {5}, {5}},
      {Granularity::PerChannel(0), {10, 20, 30}, {1, 20, 30}},
      {Granularity::PerChannel(1), {10, 20, 30}, {10, 1, 30}},
      {Granularity::PerChannel(0), {5}, {1}},
      {Granularity::PerChannel(-1), {10, 20, 30}, {10, 20, 1}},
      {Granularity::PerChannel(-2), {10, 20, 30}, {10, 1, 30}},
      {Granularity::PerChannel(2), {10, 20, 30}, {10, 20, 1}},
      {Granularity::PerBlock(0, 5), {10, 20}, {5, 1}},
      {Granularity::PerBlock(1, 4), {10, 20}, {1, 4}},
      {Granularity::PerBlock(0, 2), {8, 16}, {2, 1}},
      {Granularity::PerBlock(1, 8), {4, 16}, {1, 8}},
      {Granularity::PerBlock(0, 1), {7, 3}, {1, 1}},
      {Granularity::PerBlock(1, 3), {7, 3}, {1, 3}},
      {Granularity::PerBlock(0, 4), {8, 16, 3}, {4, 1, 3}},
      {Granularity::PerBlock(1, 8), {7, 16, 3, 3}, {1, 8, 3, 3}},
      {Granularity::PerBlock(2, 16), {1, 10, 32}, {1, 1, 16}},
      {Granularity::PerBlock(-1, 16), {1, 10, 32}, {1, 1, 16}},
      {Granularity::PerBlock(-1, 4), {10, 20}, {1, 4}},
      {Granularity::PerBlock(-2, 5), {10, 20}, {5, 1}},
      {Granularity::PerBlock(std::vector<int64_t>{2}), {10}, {2}},
      {Granularity::PerBlock(std::vector<int64_t>{4, 2, -1, 1}), {8, 16, 3, 3}, {4, 2, 3, 1}},
  };
  for (const BlockCase& c : cases) {
    SCOPED_TRACE(c.granularity.ToString() + " on " + ShapeString(c.shape));
    ASSERT_OK_AND_ASSIGN(Shape block, c.granularity.BlockShape(c.shape));
    EXPECT_EQ(block, c.block);
  }
}

// semantics.md §9.5 "Weight vs activation": only the single-axis per_block depends on it.
TEST(Granularity, SingleAxisPerBlockWeightVersusActivation) {
  struct Case {
    int64_t axis, b;
    Shape shape, weight, activation;
  };
  const Case cases[] = {
      {1, 16, {1, 32, 10}, {1, 16, 10}, {1, 16, 1}},
      {-1, 16, {1, 10, 32}, {1, 1, 16}, {1, 1, 16}},
      {1, 16, {1, 32, 10, 64}, {1, 16, 10, 64}, {1, 16, 1, 1}},
      {0, 16, {32, 64, 3, 3}, {16, 1, 3, 3}, {16, 1, 1, 1}},
      {3, 16, {1, 32, 10, 64}, {1, 1, 10, 16}, {1, 1, 1, 16}},
      {-1, 16, {1, 32, 10, 64}, {1, 1, 10, 16}, {1, 1, 1, 16}},
  };
  for (const Case& c : cases) {
    const Granularity g = Granularity::PerBlock(c.axis, c.b);
    SCOPED_TRACE(g.ToString() + " on " + ShapeString(c.shape));
    ASSERT_OK_AND_ASSIGN(Shape weight, g.BlockShape(c.shape, Target::kWeight));
    ASSERT_OK_AND_ASSIGN(Shape activation, g.BlockShape(c.shape, Target::kActivation));
    ASSERT_OK_AND_ASSIGN(Shape by_default, g.BlockShape(c.shape));
    EXPECT_EQ(weight, c.weight);
    EXPECT_EQ(activation, c.activation);
    EXPECT_EQ(by_default, c.weight);  // omitting the target means WEIGHT
  }
}

TEST(Granularity, TargetIgnoredOutsideSingleAxisPerBlock) {
  const Shape shape = {4, 6, 8};
  for (const Granularity& g : {Granularity::PerTensor(), Granularity::PerChannel(1),
                               Granularity::PerBlock(std::vector<int64_t>{2, -1, 4})}) {
    ASSERT_OK_AND_ASSIGN(Shape weight, g.BlockShape(shape, Target::kWeight));
    ASSERT_OK_AND_ASSIGN(Shape activation, g.BlockShape(shape, Target::kActivation));
    EXPECT_EQ(weight, activation) << g.ToString();
  }
}

// semantics.md §9.5 "ValueError at block-size time" and "_BlockSizeMismatchError":
// all shape-dependent, so INVALID_ARGUMENT from BlockShape, not from Validate.
TEST(Granularity, ShapeDependentErrorsAreInvalidArgument) {
  const std::pair<Granularity, Shape> cases[] = {
      {Granularity::PerChannel(1), {5}},
      {Granularity::PerChannel(-2), {5}},
      {Granularity::PerChannel(-3), {5, 10}},
      {Granularity::PerBlock(1, 3), {5}},
      {Granularity::PerBlock(2, 5), {10, 20}},
      {Granularity::PerBlock(3, 5), {8, 16, 3}},
      {Granularity::PerBlock(-3, 4), {10, 20}},
      {Granularity::PerBlock(std::nullopt, {5}), {10, 20}},  // no axis, one size: rank 1
      {Granularity::PerBlock(std::vector<int64_t>{2, 4}), {10, 20, 30}},
      {Granularity::PerBlock(std::vector<int64_t>{2, 4}), {10}},
      // Block-size mismatches.
      {Granularity::PerBlock(0, 3), {10, 20, 30}},
      {Granularity::PerBlock(1, 7), {10, 20, 30}},
      {Granularity::PerBlock(0, 10), {5}},
      {Granularity::PerBlock(std::vector<int64_t>{2, 7, -1}), {10, 20, 30}},
  };
  for (const auto& [g, shape] : cases) {
    EXPECT_OK(g.Validate());
    EXPECT_CODE(g.BlockShape(shape), kInvalid) << g.ToString() << " on " << ShapeString(shape);
  }
}

TEST(Granularity, AxisErrorStatesTheAllowedRange) {
  const absl::StatusOr<Shape> b = Granularity::PerChannel(3).BlockShape({2, 3});
  EXPECT_CODE(b, kInvalid);
  EXPECT_NE(b.status().message().find("[-2, 2)"), std::string::npos) << b.status();
}

// semantics.md §9.5 "Rejected when the granularity is built".
TEST(Granularity, ValidateRejectsUnbuildableBlockSizes) {
  const Granularity bad[] = {
      Granularity::PerBlock(0, 0),
      Granularity::PerBlock(1, -1),  // single-axis needs one positive size
      Granularity::PerBlock(std::vector<int64_t>{2, 0}),
      Granularity::PerBlock(std::vector<int64_t>{-2, 4}),
      Granularity::PerBlock(1, {2, 2}),  // axis with two sizes
      Granularity::PerBlock(0, {2, 2}),
      Granularity::PerBlock(0, std::vector<int64_t>{}),
  };
  for (const Granularity& g : bad) {
    EXPECT_CODE(g.Validate(), kInvalid) << g.ToString();
    EXPECT_CODE(g.BlockShape({4, 4}), kInvalid) << g.ToString();
  }
  EXPECT_OK(Granularity::PerTensor().Validate());
  EXPECT_OK(Granularity::PerChannel(-7).Validate());  // axes are checked against the shape
  EXPECT_OK(Granularity::PerBlock(9, 3).Validate());
  EXPECT_OK(Granularity::PerBlock(std::vector<int64_t>{-1, 1, 3}).Validate());
}

// semantics.md §9.4 "no reduction needed": every B_d = 1 gives N = S.
TEST(Granularity, BlockCounts) {
  EXPECT_EQ(BlockCounts({10, 20, 30}, {10, 20, 30}), (Shape{1, 1, 1}));
  EXPECT_EQ(BlockCounts({10, 20, 30}, {10, 1, 30}), (Shape{1, 20, 1}));
  EXPECT_EQ(BlockCounts({1, 18, 4}, {1, 6, 4}), (Shape{1, 3, 1}));
  EXPECT_EQ(BlockCounts({2, 1}, {1, 1}), (Shape{2, 1}));
}

TEST(Granularity, ToStringForms) {
  EXPECT_EQ(Granularity::PerTensor().ToString(), "per_tensor");
  EXPECT_EQ(Granularity::PerChannel(1).ToString(), "per_channel(axis=1)");
  EXPECT_EQ(Granularity::PerBlock(-1, 32).ToString(), "per_block(axis=-1, block_size=32)");
  EXPECT_EQ(Granularity::PerBlock(std::vector<int64_t>{4, -1}).ToString(),
            "per_block(block_size=(4, -1))");
}

TEST(Granularity, EqualityComparesKindAxisAndSizes) {
  EXPECT_EQ(Granularity(), Granularity::PerTensor());
  EXPECT_EQ(Granularity::PerBlock(1, 4),
            Granularity::PerBlock(std::optional<int64_t>(1), std::vector<int64_t>{4}));
  EXPECT_NE(Granularity::PerChannel(0), Granularity::PerChannel(1));
  EXPECT_NE(Granularity::PerChannel(0), Granularity::PerTensor());
  EXPECT_NE(Granularity::PerBlock(0, 4), Granularity::PerBlock(std::vector<int64_t>{4}));
  EXPECT_EQ(Granularity::PerBlock(1, 4).axis(), std::optional<int64_t>(1));
  EXPECT_EQ(Granularity::PerBlock(std::vector<int64_t>{4, 2}).axis(), std::nullopt);
  EXPECT_EQ(TargetName(Target::kWeight), "weight");
  EXPECT_EQ(TargetName(Target::kActivation), "activation");
}

}  // namespace
}  // namespace qparams::testing
