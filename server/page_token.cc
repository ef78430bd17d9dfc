#include "server/page_token.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace qparams {
namespace {

// Versioned so that the format can change without misreading old tokens.
constexpr absl::string_view kVersion = "v1";

}  // namespace

std::string EncodePageToken(absl::string_view filter, absl::string_view last_name) {
  // Names never hold '\n' (ValidateSessionName), so it separates the fields safely;
  // the filter is escaped since it is free text.
  return absl::WebSafeBase64Escape(
      absl::StrCat(kVersion, "\n", absl::CEscape(filter), "\n", last_name));
}

absl::StatusOr<std::string> DecodePageToken(absl::string_view token, absl::string_view filter) {
  if (token.empty()) return std::string();
  std::string raw;
  std::vector<std::string> fields;
  std::string token_filter;
  if (!absl::WebSafeBase64Unescape(token, &raw) ||
      (fields = absl::StrSplit(raw, '\n')).size() != 3 || fields[0] != kVersion ||
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

}  // namespace qparams
