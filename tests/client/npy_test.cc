// Reading and writing .npy files: the header versions and descrs np.save writes, and
// a clear error for everything else.

#include "tools/npy.h"

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

// A .npy file's bytes: magic, version `major`.0, the header length (2 bytes in 1.0,
// 4 after) and `dict` padded with spaces and a newline to 64 bytes, as np.save does;
// then `data`.
std::string Npy(int major, const std::string& dict, const std::string& data) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  header.append(63 - (prefix + header.size()) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back(0);
  for (size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<char>(header.size() >> 8 * i));
  return out + header + data;
}

std::string Dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return absl::StrCat("{'descr': '", descr, "', 'fortran_order': ", fortran ? "True" : "False",
                      ", 'shape': ", shape, ", }");
}

// Writes `bytes` to a fresh file in the test's temporary directory.
std::string WriteFile(const std::string& name, const std::string& bytes) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/npy_test_", name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Expects INVALID_ARGUMENT with a message naming the file and containing `problem`.
::testing::AssertionResult InvalidNaming(const absl::StatusOr<Tensor>& result,
                                         const std::string& path, const std::string& problem) {
  if (result.ok()) return ::testing::AssertionFailure() << "read " << path << " without error";
  const absl::Status& s = result.status();
  if (s.code() != absl::StatusCode::kInvalidArgument ||
      s.message().find(path) == absl::string_view::npos ||
      s.message().find(problem) == absl::string_view::npos) {
    return ::testing::AssertionFailure() << s << ": expected INVALID_ARGUMENT naming " << path
                                         << " and saying \"" << problem << "\"";
  }
  return ::testing::AssertionSuccess();
}

TEST(ReadNpy, ReadsAVersion1File) {
  const std::string data = Encode(DType::kFloat32, {1, 2, 3, 4, 5, 6});
  const std::string path = WriteFile("v1.npy", Npy(1, Dict("<f4", "(2, 3)"), data));
  ASSERT_OK_AND_ASSIGN(Tensor t, ReadNpy(path));
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(t.shape, (Shape{2, 3}));
  EXPECT_EQ(t.data.view(), data);
}

TEST(ReadNpy, ReadsVersion2And3Files) {
  const std::string data = Encode(DType::kFloat32, {-1.5, 2.5});
  for (int major : {2, 3}) {
    const std::string path =
        WriteFile(absl::StrCat("v", major, ".npy"), Npy(major, Dict("<f4", "(2,)"), data));
    ASSERT_OK_AND_ASSIGN(Tensor t, ReadNpy(path));
    EXPECT_EQ(t.shape, (Shape{2}));
    EXPECT_EQ(t.data.view(), data);
  }
}

TEST(ReadNpy, ReadsEveryFloatDescr) {
  struct Case {
    std::string descr;
    DType dtype;
  };
  for (const Case& c :
       {Case{"<f4", DType::kFloat32}, Case{"<f2", DType::kFloat16}, Case{"<f8", DType::kFloat64},
        Case{"=f4", DType::kFloat32}, Case{"|f2", DType::kFloat16}}) {
    SCOPED_TRACE(c.descr);
    const std::string data = Encode(c.dtype, {0.5, -2, 3, 1024});
    const std::string path = WriteFile("descr.npy", Npy(1, Dict(c.descr, "(1, 2, 2)"), data));
    ASSERT_OK_AND_ASSIGN(Tensor t, ReadNpy(path));
    EXPECT_EQ(t.dtype, c.dtype);
    EXPECT_EQ(t.shape, (Shape{1, 2, 2}));
    EXPECT_EQ(Values(t.view()), (std::vector<double>{0.5, -2, 3, 1024}));
  }
}

// Any key order, double quotes, Python 2 longs: what older np.save versions wrote.
TEST(ReadNpy, ReadsOtherHeaderSpellings) {
  const std::string data = Encode(DType::kFloat32, {1, 2, 3, 4, 5, 6});
  const std::string path = WriteFile(
      "spellings.npy",
      Npy(1, "{\"shape\": (3L, 2L), \"fortran_order\": False, \"descr\": \"<f4\"}", data));
  ASSERT_OK_AND_ASSIGN(Tensor t, ReadNpy(path));
  EXPECT_EQ(t.shape, (Shape{3, 2}));
}

// NumPy has no bfloat16: bf16 arrays are saved as their 16-bit patterns (--dtype).
TEST(ReadNpy, ReadsSixteenBitIntegersAsBFloat16Bits) {
  const std::string bits = Encode(DType::kBFloat16, {1.5, -3, 0.25});
  for (const std::string descr : {"<u2", "<i2"}) {
    SCOPED_TRACE(descr);
    const std::string path = WriteFile("bf16.npy", Npy(1, Dict(descr, "(3,)"), bits));
    ASSERT_OK_AND_ASSIGN(Tensor t, ReadNpy(path, DType::kBFloat16));
    EXPECT_EQ(t.dtype, DType::kBFloat16);
    EXPECT_EQ(Values(t.view()), (std::vector<double>{1.5, -3, 0.25}));
    EXPECT_TRUE(InvalidNaming(ReadNpy(path), path, "bfloat16"));
  }
}

TEST(ReadNpy, RejectsADTypeOtherThanTheRequestedOne) {
  const std::string path =
      WriteFile("as.npy", Npy(1, Dict("<f4", "(2,)"), Encode(DType::kFloat32, {1, 2})));
  EXPECT_TRUE(InvalidNaming(ReadNpy(path, DType::kBFloat16), path, "not bfloat16"));
  EXPECT_OK(ReadNpy(path, DType::kFloat32));
}

TEST(ReadNpy, RejectsBigEndianData) {
  const std::string path = WriteFile("big.npy", Npy(1, Dict(">f4", "(2,)"), std::string(8, '\0')));
  EXPECT_TRUE(InvalidNaming(ReadNpy(path), path, "big-endian"));
}

TEST(ReadNpy, RejectsFortranOrder) {
  const std::string path = WriteFile(
      "fortran.npy", Npy(1, Dict("<f4", "(2, 2)", /*fortran=*/true), std::string(16, '\0')));
  EXPECT_TRUE(InvalidNaming(ReadNpy(path), path, "fortran_order"));
}

TEST(ReadNpy, RejectsOtherDTypes) {
  for (const std::string descr : {"<i4", "|u1", "|O", "<c8", "<M8[s]"}) {
    SCOPED_TRACE(descr);
    const std::string path = WriteFile("other.npy", Npy(1, Dict(descr, "(1,)"), "12345678"));
    EXPECT_TRUE(InvalidNaming(ReadNpy(path), path, "unsupported dtype"));
  }
  const std::string path = WriteFile(
      "structured.npy",
      Npy(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", "1234"));
  EXPECT_TRUE(InvalidNaming(ReadNpy(path), path, "structured"));
}

TEST(ReadNpy, RejectsDataOfTheWrongLength) {
  const std::string six = Encode(DType::kFloat32, {1, 2, 3, 4, 5, 6});
  const std::string truncated =
      WriteFile("truncated.npy", Npy(1, Dict("<f4", "(2, 3)"), six.substr(0, 20)));
  EXPECT_TRUE(InvalidNaming(ReadNpy(truncated), truncated,
                            "has 20 bytes of data, but shape [2, 3] of float32 needs 24"));
  const std::string longer = WriteFile("longer.npy", Npy(1, Dict("<f4", "(2, 3)"), six + "xx"));
  EXPECT_TRUE(InvalidNaming(ReadNpy(longer), longer, "has 26 bytes of data"));
}

TEST(ReadNpy, RejectsABadMagicOrHeader) {
  const std::string magic = WriteFile("magic.npy", "PK\x03\x04 this is a zip file");
  EXPECT_TRUE(InvalidNaming(ReadNpy(magic), magic, "not a .npy file"));
  const std::string version =
      WriteFile("version.npy", Npy(4, Dict("<f4", "(1,)"), std::string(4, '\0')));
  EXPECT_TRUE(InvalidNaming(ReadNpy(version), version, "version 4.0"));
  const std::string cut = WriteFile("cut.npy", Npy(1, Dict("<f4", "(1,)"), "").substr(0, 30));
  EXPECT_TRUE(InvalidNaming(ReadNpy(cut), cut, "truncated"));
  const std::string garbled =
      WriteFile("garbled.npy", Npy(1, "{'descr': '<f4', 'shape': (1,)", "1234"));
  EXPECT_TRUE(InvalidNaming(ReadNpy(garbled), garbled, "header"));
  const std::string missing = WriteFile("missing.npy", Npy(1, "{'descr': '<f4'}", "1234"));
  EXPECT_TRUE(InvalidNaming(ReadNpy(missing), missing, "'shape'"));
}

// Rank-0 tensors are malformed on the wire (semantics.md Policy 4).
TEST(ReadNpy, RejectsZeroDimensionalArrays) {
  const std::string path = WriteFile("scalar.npy", Npy(1, Dict("<f4", "()"), "1234"));
  EXPECT_TRUE(InvalidNaming(ReadNpy(path), path, "0-d"));
}

TEST(ReadNpy, ReportsAMissingFileAsNotFound) {
  EXPECT_CODE(ReadNpy(absl::StrCat(::testing::TempDir(), "/npy_test_absent.npy")),
              absl::StatusCode::kNotFound);
}

TEST(ReadNpy, RejectsADirectory) {
  const std::string dir = ::testing::TempDir();
  EXPECT_TRUE(InvalidNaming(ReadNpy(dir), dir, "not a regular file"));
}

TEST(WriteNpy, WritesWhatReadNpyReadsBack) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    SCOPED_TRACE(DTypeName(dtype));
    for (const Shape& shape : {Shape{5}, Shape{1, 5}, Shape{5, 1, 1}}) {
      const Tensor t = MakeTensor(dtype, shape, {1, -2, 0.5, 8, -0.125});
      const std::string path = absl::StrCat(::testing::TempDir(), "/npy_test_write.npy");
      ASSERT_OK(WriteNpy(path, t.view()));
      ASSERT_OK_AND_ASSIGN(Tensor back, ReadNpy(path, dtype));
      EXPECT_EQ(back.dtype, dtype);
      EXPECT_EQ(back.shape, shape);
      EXPECT_EQ(back.data, t.data);
      // np.save aligns the data to 64 bytes.
      std::ifstream file(path, std::ios::binary | std::ios::ate);
      EXPECT_EQ((static_cast<size_t>(file.tellg()) - t.data.size()) % 64, 0u);
    }
  }
}

TEST(WriteNpy, WritesTheHeaderNumPyWrites) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/npy_test_header.npy");
  ASSERT_OK(WriteNpy(path, F32({3}, {1, 2, 3}).view()));
  std::ifstream file(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, Npy(1, Dict("<f4", "(3,)"), Encode(DType::kFloat32, {1, 2, 3})));
}

TEST(WriteNpy, ReportsAnUnwritablePath) {
  EXPECT_CODE(WriteNpy("/nonexistent-dir/x.npy", F32({1}, {1}).view()),
              absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace qparams::testing
