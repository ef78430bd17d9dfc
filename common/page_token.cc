#include "common/page_token.h"

#include <zlib.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace qparams {
namespace {

// Versioned so that the format can change without misreading old tokens.
constexpr absl::string_view kVersion = "v1";

// A checksum of the fields, so that a truncated or edited token is refused rather
// than read as another position.
std::string Checksum(absl::string_view fields) {
  return absl::StrFormat(
      "%08x", crc32(0, reinterpret_cast<const Bytef*>(fields.data()), fields.size()));
}

}  // namespace

std::string EncodePageToken(absl::string_view filter, absl::string_view last_name) {
  // Names never hold '\n' (ValidateSessionName), so it separates the fields safely;
  // the filter is escaped since it is free text.
  const std::string fields =
      absl::StrCat(kVersion, "\n", absl::CEscape(filter), "\n", last_name);
  return absl::WebSafeBase64Escape(absl::StrCat(fields, "\n", Checksum(fields)));
}

absl::StatusOr<std::string> DecodePageToken(absl::string_view token, absl::string_view filter) {
  if (token.empty()) return std::string();
  std::string raw;
  std::vector<std::string> fields;
  std::string token_filter;
  if (!absl::WebSafeBase64Unescape(token, &raw) ||
      (fields = absl::StrSplit(raw, '\n')).size() != 4 || fields[0] != kVersion ||
      fields[3] != Checksum(raw.substr(0, raw.rfind('\n'))) ||
      !absl::CUnescape(fields[1], &token_filter) || fields[2].empty()) {
    return absl::InvalidArgumentError(
        "page_token is not a token this server issued; pass a next_page_token unchanged");
  }
  if (token_filter != filter) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token was issued for filter \"", token_filter, "\", not \"", filter,
                     "\"; keep the filter across pages or start again without a token"));
  }
  return fields[2];
}

absl::StatusOr<PageStart> StartPage(
    int page_size, absl::string_view page_token, absl::string_view filter,
    absl::FunctionRef<absl::Status(absl::string_view filter)> check_filter) {
  if (page_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size is ", page_size, "; it must be >= 0 (0 means ", kDefaultPageSize, ")"));
  }
  if (!filter.empty()) {
    if (absl::Status refused = check_filter(filter); !refused.ok()) return refused;
  }
  absl::StatusOr<std::string> after = DecodePageToken(page_token, filter);
  if (!after.ok()) return after.status();
  return PageStart{*std::move(after),
                   page_size == 0 ? kDefaultPageSize : std::min(page_size, kMaxPageSize)};
}

}  // namespace qparams
