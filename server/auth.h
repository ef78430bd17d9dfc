// Bearer tokens: a tokens file names who holds each token (a tenant in
// --auth_tokens_file, an admin in --admin_tokens_file), optionally until when. A call
// carries its token as `authorization: Bearer <token>`; server/authorizer.h decides
// what the holder may do.

#ifndef QPARAMS_SERVER_AUTH_H_
#define QPARAMS_SERVER_AUTH_H_

#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace qparams {

// Why a call's credential was refused: the `reason` label of
// qparams_auth_refusals_total, and the audit line's.
enum class Refusal {
  kMissing,    // no authorization metadata
  kMalformed,  // not "Bearer <token>"
  kUnknown,    // a token no file of this server lists
  kExpired,    // a listed token past its expires= time
  kNotAdmin,   // a tenant's token on an admin call
  kNotTenant,  // an admin's token on a data call
  kAdminOff,   // an admin call on a server without --admin_tokens_file
};
inline constexpr Refusal kAllRefusals[] = {Refusal::kMissing,   Refusal::kMalformed,
                                           Refusal::kUnknown,   Refusal::kExpired,
                                           Refusal::kNotAdmin,  Refusal::kNotTenant,
                                           Refusal::kAdminOff};
absl::string_view RefusalName(Refusal reason);

// The token of an `authorization` header (unset: the call has none), or the
// refusal kMissing / kMalformed. The scheme is case-insensitive (RFC 7235).
struct BearerToken {
  std::optional<absl::string_view> token;  // set when `refusal` is unset
  std::optional<Refusal> refusal;
};
BearerToken ParseBearer(std::optional<absl::string_view> header);

// A parsed tokens file. Immutable once loaded, so thread-safe.
class TokenAuthenticator {
 public:
  struct Holder {
    std::string name;                  // the tenant, or the admin's name
    std::optional<absl::Time> expires;  // refused from this instant on
  };

  // Reads a tokens file: one "TOKEN NAME [expires=YYYY-MM-DDTHH:MM:SSZ]" per line
  // (spaces or tabs between), blank lines and lines starting with '#' skipped. A
  // name is 1 to 64 characters of [a-zA-Z0-9._-]; a token 16 to 512 printable
  // non-space characters; the expiry an RFC 3339 time. INVALID_ARGUMENT naming the
  // line for anything else (and for a token listed twice); FAILED_PRECONDITION if
  // the file cannot be read or lists no token.
  static absl::StatusOr<TokenAuthenticator> Load(const std::string& path);
  // The same from the file's text; `source` names it in messages.
  static absl::StatusOr<TokenAuthenticator> Parse(absl::string_view text,
                                                  absl::string_view source);

  // Who holds `token`, expired or not; null if no line lists it. A hash lookup:
  // its time does not grow with how many leading bytes match a listed token.
  const Holder* Find(absl::string_view token) const;

  size_t token_count() const { return holders_.size(); }

 private:
  absl::flat_hash_map<std::string, Holder> holders_;  // token -> holder
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_AUTH_H_
