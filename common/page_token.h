// ListSessions page tokens: opaque to callers, bound to the filter they were issued
// for, and carrying the last name of the page they follow. Servers issue them; a
// replica that answers for the cluster issues the token of a page it merged from
// several replicas' pages (server/fan_out.h), which every replica accepts, since a
// token names a position in the name order, not a replica's state.

#ifndef QPARAMS_COMMON_PAGE_TOKEN_H_
#define QPARAMS_COMMON_PAGE_TOKEN_H_

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

#endif  // QPARAMS_COMMON_PAGE_TOKEN_H_
