#include "common/slot.h"

#include <zlib.h>

namespace qparams {

absl::string_view HashedPart(absl::string_view name) {
  const size_t open = name.find('{');
  if (open == absl::string_view::npos) return name;
  const size_t close = name.find('}', open + 1);
  if (close == absl::string_view::npos || close == open + 1) return name;
  return name.substr(open + 1, close - open - 1);
}

int SlotOf(absl::string_view full_name) {
  const absl::string_view name = HashedPart(full_name);
  const uLong crc =
      crc32(0, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
  return static_cast<int>(crc % kSlotCount);
}

}  // namespace qparams
