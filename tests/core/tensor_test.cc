// Shapes, element counts and validated tensor views (semantics.md Policy 4).

#include "core/tensor.h"

#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

TEST(NumElements, IsTheProductOfTheDims) {
  ASSERT_OK_AND_ASSIGN(int64_t n, NumElements({2, 3, 4}));
  EXPECT_EQ(n, 24);
  ASSERT_OK_AND_ASSIGN(int64_t zero, NumElements({5, 0, 7}));
  EXPECT_EQ(zero, 0);
  ASSERT_OK_AND_ASSIGN(int64_t scalar, NumElements({}));
  EXPECT_EQ(scalar, 1);  // the empty product
}

TEST(NumElements, RejectsNegativeDimsNamingTheField) {
  const absl::StatusOr<int64_t> n = NumElements({2, -1}, "input.shape");
  EXPECT_CODE(n, kInvalid);
  EXPECT_NE(n.status().message().find("input.shape[1]"), std::string::npos) << n.status();
}

TEST(NumElements, RejectsInt64Overflow) {
  EXPECT_CODE(NumElements({int64_t{1} << 40, int64_t{1} << 40}), kInvalid);
  // A zero dim makes any product fit.
  ASSERT_OK_AND_ASSIGN(int64_t n, NumElements({int64_t{1} << 40, 0, int64_t{1} << 40}));
  EXPECT_EQ(n, 0);
}

TEST(ShapeString, PrintsLikeAList) {
  EXPECT_EQ(ShapeString({2, 3}), "[2, 3]");
  EXPECT_EQ(ShapeString({7}), "[7]");
  EXPECT_EQ(ShapeString({}), "[]");
}

TEST(TensorView, CreatesAValidView) {
  const std::string data = Encode(DType::kFloat32, {1, 2, 3, 4, 5, 6});
  ASSERT_OK_AND_ASSIGN(TensorView v, TensorView::Create(DType::kFloat32, {2, 3}, data));
  EXPECT_EQ(v.dtype(), DType::kFloat32);
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
  EXPECT_EQ(v.num_elements(), 6);
  EXPECT_EQ(v.bytes().size(), 24u);
  EXPECT_EQ(v.ValueAt(4), 5.0);
}

// Policy 4: rank-0 tensors are malformed.
TEST(TensorView, RejectsRankZero) {
  EXPECT_CODE(TensorView::Create(DType::kFloat32, {}, Encode(DType::kFloat32, {1})), kInvalid);
}

// Policy 4: the byte length must match shape and dtype exactly.
TEST(TensorView, RejectsByteLengthMismatch) {
  const std::string six_floats = Encode(DType::kFloat32, {1, 2, 3, 4, 5, 6});
  EXPECT_CODE(TensorView::Create(DType::kFloat32, {2, 2}, six_floats), kInvalid);
  EXPECT_CODE(TensorView::Create(DType::kFloat32, {2, 4}, six_floats), kInvalid);
  // The same 24 bytes are 12 halves, not 6.
  EXPECT_CODE(TensorView::Create(DType::kFloat16, {6}, six_floats), kInvalid);
  EXPECT_OK(TensorView::Create(DType::kFloat16, {12}, six_floats).status());
  EXPECT_CODE(TensorView::Create(DType::kFloat64, {2}, six_floats.substr(0, 15)), kInvalid);
}

TEST(TensorView, RejectsNegativeDims) {
  const absl::StatusOr<TensorView> v =
      TensorView::Create(DType::kFloat32, {-1, 2}, "", kDefaultMaxTensorElements, "x");
  EXPECT_CODE(v, kInvalid);
  EXPECT_NE(v.status().message().find("x.shape"), std::string::npos) << v.status();
}

TEST(TensorView, TooManyElementsIsResourceExhausted) {
  const std::string data = Encode(DType::kFloat32, std::vector<double>(12, 1.0));
  EXPECT_CODE(TensorView::Create(DType::kFloat32, {3, 4}, data, /*max_elements=*/11),
              absl::StatusCode::kResourceExhausted);
  EXPECT_OK(TensorView::Create(DType::kFloat32, {3, 4}, data, /*max_elements=*/12).status());
}

TEST(TensorView, AHugeShapeWithTheWrongDataIsTheLengthsError) {
  // Over the default limit (2^31) without its data: the length is what to fix.
  absl::Status status = TensorView::Create(DType::kBFloat16, {int64_t{1} << 31, 2}, "",
                                           kDefaultMaxTensorElements, "tensor")
                            .status();
  EXPECT_CODE(status, kInvalid);
  EXPECT_TRUE(absl::StrContains(status.message(), "tensor.data has 0 bytes")) << status;
  // 2^62 float64 elements: the bytes they need do not fit in int64.
  status = TensorView::Create(DType::kFloat64, {int64_t{1} << 31, int64_t{1} << 31},
                              std::string(8, '\0'))
               .status();
  EXPECT_CODE(status, kInvalid);
  EXPECT_TRUE(absl::StrContains(status.message(), "needs more than 2^63")) << status;
}

// Dims of 0 are well formed here; the zero-size rejection happens where values are read.
TEST(TensorView, ZeroSizeIsWellFormed) {
  ASSERT_OK_AND_ASSIGN(TensorView v, TensorView::Create(DType::kFloat32, {0, 5}, ""));
  EXPECT_EQ(v.num_elements(), 0);
}

TEST(TensorView, ValueAtWidensEveryDtypeExactly) {
  const std::vector<double> values = {-1.5, 0.0, 3.25, -0.0, 65504.0};
  for (DType d : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    const Tensor t = Vec(values, d);
    const TensorView v = t.view();
    SCOPED_TRACE(DTypeName(d));
    EXPECT_EQ(v.ValueAt(0), -1.5);
    EXPECT_EQ(v.ValueAt(2), 3.25);
    EXPECT_TRUE(std::signbit(v.ValueAt(3)));
  }
  // bfloat16 has 8 significant bits: 65504 rounds to 65536.
  EXPECT_EQ(Vec(values, DType::kBFloat16).view().ValueAt(4), 65536.0);
  EXPECT_EQ(Vec(values, DType::kFloat16).view().ValueAt(4), 65504.0);
  // float64 keeps what float32 cannot.
  EXPECT_EQ(Vec({0.1}, DType::kFloat64).view().ValueAt(0), 0.1);
  EXPECT_EQ(Vec({0.1}, DType::kFloat32).view().ValueAt(0), static_cast<double>(0.1f));
}

TEST(Tensor, ViewSharesTheOwnedBytes) {
  const Tensor t = F32({2, 2}, {1, 2, 3, 4});
  const TensorView v = t.view();
  EXPECT_EQ(v.shape(), (Shape{2, 2}));
  EXPECT_EQ(v.num_elements(), 4);
  EXPECT_EQ(v.bytes().data(), t.data.data());
  EXPECT_EQ(Values(v), (std::vector<double>{1, 2, 3, 4}));
}

}  // namespace
}  // namespace qparams::testing
