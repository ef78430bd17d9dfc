#include "common/slot.h"

#include <zlib.h>

namespace qparams {

int SlotOf(absl::string_view name) {
  const uLong crc =
      crc32(0, reinterpret_cast<const Bytef*>(name.data()), static_cast<uInt>(name.size()));
  return static_cast<int>(crc % kSlotCount);
}

}  // namespace qparams
