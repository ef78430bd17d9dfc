// The slot of a session name: zlib's CRC-32 of its bytes mod 256, the slot HAProxy's
// `req.hdr(x-qparams-session),crc32,mod(256)` computes (tests/python/
// test_haproxy_slots.py checks the two agree on HAProxy itself). The vectors were
// computed apart from the code under test: CRC-32's published check value, and a
// bitwise CRC-32 in Python, equal to Python's zlib.crc32 on each.

#include "common/slot.h"

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

namespace qparams::testing {
namespace {

TEST(Slot, KnownVectors) {
  struct Vector {
    std::string name;
    uint32_t crc32;  // for the reader: the slot is its low byte
    int slot;
  };
  const Vector vectors[] = {
      {"", 0x00000000, 0},
      {"a", 0xE8B7BE43, 0x43},
      {"123456789", 0xCBF43926, 0x26},  // CRC-32's check value
      {"The quick brown fox jumps over the lazy dog", 0x414FA339, 0x39},
      {"model/layer1.weight", 0x6375413E, 0x3E},
      {"conv1/act", 0xB863C0B4, 0xB4},
      {"x/y-z_1.2", 0x8993B618, 0x18},
      {std::string(128, 'a'), 0xF12B368C, 0x8C},
      // Any bytes, not only the names the server accepts: NUL and bytes >= 0x80.
      {std::string("\xff\x00\x80", 3), 0xAC616EDF, 0xDF},
  };
  for (const Vector& v : vectors) {
    EXPECT_EQ(static_cast<uint32_t>(v.slot), v.crc32 % 256) << "the vector itself";
    EXPECT_EQ(SlotOf(v.name), v.slot) << "\"" << v.name << "\" (" << v.name.size() << " bytes)";
  }
}

TEST(Slot, IsInRangeAndCoversEveryByte) {
  EXPECT_EQ(kSlotCount, 256);
  EXPECT_STREQ(kSessionHeader, "x-qparams-session");
  // The length counts: a string view's bytes, not up to its first NUL.
  EXPECT_NE(SlotOf(absl::string_view("a\0", 2)), SlotOf("a"));
  std::string name(64, 'n');
  const int base = SlotOf(name);
  int changed = 0;
  for (size_t i = 0; i < name.size(); ++i) {
    std::string other = name;
    other[i] = 'm';
    const int slot = SlotOf(other);
    EXPECT_GE(slot, 0);
    EXPECT_LT(slot, kSlotCount);
    changed += slot != base;
  }
  // A CRC changes with any one byte, but the slot keeps 8 of its 32 bits, so it need
  // not; here it does in every position (as Python's zlib.crc32 says too).
  EXPECT_EQ(changed, 64);
}

// Hash tags (Redis Cluster's rule) on the table tests/data/slots.tsv, which the
// Python client's routing is checked against too (tests/python/test_haproxy_slots.py).
TEST(Slot, HashTagsFollowTheTable) {
  std::ifstream in(QPARAMS_SLOTS_TSV);
  ASSERT_TRUE(in) << QPARAMS_SLOTS_TSV;
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> f = absl::StrSplit(line, '\t');
    ASSERT_EQ(f.size(), 3u) << line;
    EXPECT_EQ(HashedPart(f[0]), f[1]) << f[0];
    EXPECT_EQ(SlotOf(f[0]), std::stoi(f[2])) << f[0];
    EXPECT_EQ(SlotOf(f[0]), SlotOf(f[1])) << f[0];
    ++rows;
  }
  EXPECT_GE(rows, 20);
}

TEST(Slot, HashedPartIsAViewIntoTheName) {
  const std::string name = "grp{tag}rest";
  const absl::string_view part = HashedPart(name);
  EXPECT_EQ(part, "tag");
  EXPECT_EQ(part.data(), name.data() + 4);
  EXPECT_EQ(HashedPart(""), "");
}

// Exactly the two braces around the hashed part go; names without a tag stay whole.
TEST(Slot, WithoutHashTagBracesDropsOnlyTheTagsBraces) {
  EXPECT_EQ(WithoutHashTagBraces("{model.layers.0.mlp}.up_proj.weight"),
            "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(WithoutHashTagBraces("run/{a}b{c}"), "run/ab{c}");
  EXPECT_EQ(WithoutHashTagBraces("x{a}"), "xa");
  EXPECT_EQ(WithoutHashTagBraces("{}x"), "{}x");
  EXPECT_EQ(WithoutHashTagBraces("x{"), "x{");
  EXPECT_EQ(WithoutHashTagBraces("plain"), "plain");
  EXPECT_EQ(WithoutHashTagBraces(""), "");
}

}  // namespace
}  // namespace qparams::testing
