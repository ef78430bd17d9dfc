// A string as a JSON string literal: the one quoting the hand-written JSON documents
// share (exports, the coverage report, qparams-cli slot), which stream too much for
// a JSON library's in-memory tree.

#ifndef QPARAMS_COMMON_JSON_STRING_H_
#define QPARAMS_COMMON_JSON_STRING_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace qparams {

// Appends `text` quoted: '"' and '\' escaped, control characters as \u00XX, other
// bytes as they are (session names are ASCII; other text is UTF-8).
inline void AppendJsonString(std::string* out, absl::string_view text) {
  out->push_back('"');
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(out, "\\u%04x", static_cast<int>(c));
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

inline std::string JsonString(absl::string_view text) {
  std::string quoted;
  AppendJsonString(&quoted, text);
  return quoted;
}

}  // namespace qparams

#endif  // QPARAMS_COMMON_JSON_STRING_H_
