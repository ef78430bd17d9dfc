// ListSessions page tokens: opaque to clients, bound to the filter they were issued
// for, and carrying the last name of the page they follow.

#ifndef QPARAMS_SERVER_PAGE_TOKEN_H_
#define QPARAMS_SERVER_PAGE_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qparams {

// The token of the page after the one ending with `last_name`, for `filter`.
std::string EncodePageToken(absl::string_view filter, absl::string_view last_name);

// The last name encoded in `token` ("" for an empty token, the first page).
// INVALID_ARGUMENT if the token is malformed or was issued for another filter.
absl::StatusOr<std::string> DecodePageToken(absl::string_view token, absl::string_view filter);

}  // namespace qparams

#endif  // QPARAMS_SERVER_PAGE_TOKEN_H_
