#include "common/slot.h"

#include <zlib.h>

#include "absl/strings/str_cat.h"

namespace qparams {

absl::string_view HashedPart(absl::string_view name) {
  const size_t open = name.find('{');
  if (open == absl::string_view::npos) return name;
  const size_t close = name.find('}', open + 1);
  if (close == absl::string_view::npos || close == open + 1) return name;
  return name.substr(open + 1, close - open - 1);
}

std::string WithoutHashTagBraces(absl::string_view name) {
  const absl::string_view tag = HashedPart(name);
  if (tag.size() == name.size()) return std::string(name);
  const size_t open = static_cast<size_t>(tag.data() - name.data()) - 1;
  return absl::StrCat(name.substr(0, open), tag, name.substr(open + tag.size() + 2));
}

int SlotOf(absl::string_view full_name) {
  const absl::string_view name = HashedPart(full_name);
  const uLong crc =
      crc32(0, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
  return static_cast<int>(crc % kSlotCount);
}

}  // namespace qparams
