// PartialFile: a file written whole under its name or not at all.

#include "tools/partial_file.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace qparams {
namespace {

class PartialFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = absl::StrCat(::testing::TempDir(), "/partial_file_test.XXXXXX");
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  static std::string Content(const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    std::stringstream text;
    text << file.rdbuf();
    return text.str();
  }

  std::string dir_;
};

TEST_F(PartialFileTest, CommitRenamesThePartialFile) {
  PartialFile file(Path("out.json"));
  ASSERT_TRUE(file.Open().ok());
  EXPECT_EQ(file.partial_path(), Path("out.json.partial"));
  ASSERT_TRUE(file.Write("{\"a\": ").ok());
  file.stream() << 1 << "}";
  EXPECT_FALSE(std::filesystem::exists(Path("out.json"))) << "not before the commit";
  ASSERT_TRUE(file.Commit().ok());
  EXPECT_EQ(Content(Path("out.json")), "{\"a\": 1}");
  EXPECT_FALSE(std::filesystem::exists(Path("out.json.partial")));
}

TEST_F(PartialFileTest, ReplacesAnOldFileOnlyAtTheCommit) {
  std::ofstream(Path("out.txt")) << "old";
  {
    PartialFile file(Path("out.txt"));
    ASSERT_TRUE(file.Open().ok());
    ASSERT_TRUE(file.Write("half").ok());
  }  // dropped: an error on the way
  EXPECT_EQ(Content(Path("out.txt")), "old");
  EXPECT_FALSE(std::filesystem::exists(Path("out.txt.partial")));

  PartialFile file(Path("out.txt"));
  ASSERT_TRUE(file.Open().ok());
  ASSERT_TRUE(file.Write("new").ok());
  ASSERT_TRUE(file.Commit().ok());
  EXPECT_EQ(Content(Path("out.txt")), "new");
}

TEST_F(PartialFileTest, AnUnwritablePathFailsNamingThePartialFile) {
  PartialFile file(Path("no/such/dir/out"));
  const absl::Status status = file.Open();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(status.message(),
                                absl::StrCat("cannot write ", Path("no/such/dir/out.partial"))))
      << status;
  EXPECT_FALSE(file.is_open());
}

TEST_F(PartialFileTest, AFailedRenameLeavesNeitherFile) {
  // A non-empty directory where the file should go: rename(2) refuses it.
  std::filesystem::create_directories(Path("taken/inside"));
  PartialFile file(Path("taken"));
  ASSERT_TRUE(file.Open().ok());
  ASSERT_TRUE(file.Write("data").ok());
  const absl::Status status = file.Commit();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(status.message(), "cannot rename")) << status;
  EXPECT_FALSE(std::filesystem::exists(Path("taken.partial")));
  EXPECT_TRUE(std::filesystem::is_directory(Path("taken/inside")));
}

TEST_F(PartialFileTest, AFailedWriteFailsTheCommit) {
  PartialFile file(Path("out.bin"));
  ASSERT_TRUE(file.Open().ok());
  file.stream().setstate(std::ios::badbit);  // as a failing std::ostream writer leaves it
  const absl::Status status = file.Commit();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(std::filesystem::exists(Path("out.bin")));
  EXPECT_FALSE(std::filesystem::exists(Path("out.bin.partial")));
}

}  // namespace
}  // namespace qparams
