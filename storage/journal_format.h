// The files of a journal's data directory (journal.h): their names, the magic each
// starts with and the frames after it, [u32 length][u32 crc32][record],
// little-endian. The writer (journal_writer.cc) and the reader (journal_reader.cc)
// share it, as LevelDB's log writer and reader share log_format.h.

#ifndef QPARAMS_STORAGE_JOURNAL_FORMAT_H_
#define QPARAMS_STORAGE_JOURNAL_FORMAT_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "qparams/storage/v1/storage.pb.h"

namespace qparams::journal_format {

inline constexpr char kMagic[8] = {'Q', 'P', 'J', 'R', 'N', 'L', '1', '\n'};
inline constexpr char kSnapshotPrefix[] = "snapshot-";
inline constexpr char kJournalPrefix[] = "journal-";
inline constexpr uint32_t kMaxRecordBytes = 1u << 30;

// `prefix` and `number` in 20 digits: "journal-00000000000000000001".
std::string FileName(absl::string_view prefix, uint64_t number);

// The frame's checksum of a record's bytes (zlib's crc32).
uint32_t Checksum(absl::string_view bytes);

inline void PutU32(char* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Appends `record`'s frame to `out`, serializing in place.
void AppendFrame(const storage::v1::Record& record, std::string& out);

}  // namespace qparams::journal_format

#endif  // QPARAMS_STORAGE_JOURNAL_FORMAT_H_
