#include "storage/journal_format.h"

#include <zlib.h>

#include "absl/strings/str_format.h"

namespace qparams::journal_format {

std::string FileName(absl::string_view prefix, uint64_t number) {
  return absl::StrFormat("%s%020u", prefix, number);
}

uint32_t Checksum(absl::string_view bytes) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
}

void AppendFrame(const storage::v1::Record& record, std::string& out) {
  const size_t length = record.ByteSizeLong();
  const size_t start = out.size();
  out.resize(start + 8 + length);
  char* payload = out.data() + start + 8;
  record.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(payload));
  char* header = out.data() + start;
  PutU32(header, static_cast<uint32_t>(length));
  PutU32(header + 4, Checksum(absl::string_view(payload, length)));
}

}  // namespace qparams::journal_format
