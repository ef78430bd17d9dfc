// Bearer-token authentication: a file maps tokens to tenants, and every call of
// QParamsService must carry `authorization: Bearer <token>`. Tenants namespace the
// sessions; the health service is not covered.

#ifndef QPARAMS_SERVER_AUTH_H_
#define QPARAMS_SERVER_AUTH_H_

#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qparams {

class TokenAuthenticator {
 public:
  // Reads a tokens file: one "TOKEN TENANT" per line (spaces or tabs between), blank lines and lines
  // starting with '#' skipped. A tenant is 1 to 64 characters of [a-zA-Z0-9._-];
  // a token 16 to 512 printable non-space characters. INVALID_ARGUMENT naming the
  // line for anything else (and for a token listed twice); FAILED_PRECONDITION if
  // the file cannot be read or lists no token.
  static absl::StatusOr<TokenAuthenticator> Load(const std::string& path);
  // The same from the file's text; `source` names it in messages.
  static absl::StatusOr<TokenAuthenticator> Parse(absl::string_view text,
                                                  absl::string_view source);

  // The tenant of a call whose `authorization` metadata is `header` (unset if the
  // call has none). UNAUTHENTICATED if it is missing, not "Bearer <token>", or the
  // token is unknown; the message never echoes the token.
  absl::StatusOr<std::string> Authenticate(std::optional<absl::string_view> header) const;

  size_t token_count() const { return tenants_.size(); }

 private:
  absl::flat_hash_map<std::string, std::string> tenants_;  // token -> tenant
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_AUTH_H_
