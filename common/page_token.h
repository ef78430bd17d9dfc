// ListSessions page tokens: opaque to callers, bound to the filter they were issued
// for, and carrying the last name of the page they follow. Servers issue them; a
// replica that answers for the cluster issues the token of a page it merged from
// several replicas' pages (server/fan_out.h), which every replica accepts, since a
// token names a position in the name order, not a replica's state.

#ifndef QPARAMS_COMMON_PAGE_TOKEN_H_
#define QPARAMS_COMMON_PAGE_TOKEN_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qparams {

// The token of the page after the one ending with `last_name`, for `filter`.
std::string EncodePageToken(absl::string_view filter, absl::string_view last_name);

// The last name encoded in `token` ("" for an empty token, the first page).
// INVALID_ARGUMENT if the token is malformed or was issued for another filter.
absl::StatusOr<std::string> DecodePageToken(absl::string_view token, absl::string_view filter);

// A listing's page size when the request says 0, and the most it gives.
inline constexpr int kDefaultPageSize = 50;
inline constexpr int kMaxPageSize = 1000;

// Where a page of a name-ordered listing starts, and how many names it holds at
// most: the one reading of every List method's page_size, filter and page_token.
struct PageStart {
  std::string after;  // the last name of the previous page; "" for the first
  int limit = kDefaultPageSize;
};

// In this order: INVALID_ARGUMENT for a negative page_size; `check_filter`'s
// refusal of a non-empty filter; DecodePageToken's. page_size 0 is
// kDefaultPageSize, and it is capped at kMaxPageSize.
absl::StatusOr<PageStart> StartPage(
    int page_size, absl::string_view page_token, absl::string_view filter,
    absl::FunctionRef<absl::Status(absl::string_view filter)> check_filter);

}  // namespace qparams

#endif  // QPARAMS_COMMON_PAGE_TOKEN_H_
