// Who may call what (docs/security.md): the one place where a call's credential
// meets the server's tokens files. Three kinds of call:
//   kData      sessions, groups, exports, computing: a tenant's token where the
//              server has --auth_tokens_file (the tenant namespaces the sessions),
//              else open;
//   kTopology  GetTopology, GetSlotMoves: read by clients and by the resharding
//              tool alike, so a tenant's or an admin's token (open as kData is);
//   kAdmin     every method of qparams.v1.ClusterAdmin (the slot map, moves, record
//              reading, import and drop): always an admin's token of
//              --admin_tokens_file; without that file cluster control is off and
//              every such call is refused.
// Every refusal is counted (qparams_auth_refusals_total{reason}) and logged as an
// "audit:" line with the method and the peer, never the token.

#ifndef QPARAMS_SERVER_AUTHORIZER_H_
#define QPARAMS_SERVER_AUTHORIZER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "metrics/metrics.h"
#include "server/auth.h"

namespace qparams {

enum class Access { kData, kTopology, kAdmin };

// The holder of the credential a call was allowed with.
struct Caller {
  std::string name;    // the tenant ("" on an open server), or the admin's name
  bool admin = false;  // allowed by an admin token
};

// Thread safety: Authorize may run on any thread, concurrently with Reload (the
// token sets are swapped under mu_, and read as shared_ptr copies).
class Authorizer {
 public:
  // Reads the tokens files (either path may be empty: none of that kind). Errors
  // are TokenAuthenticator::Load's, prefixed with the flag's name. `refusals` (a
  // family labelled `reason`, may be null) must outlive the authorizer.
  static absl::StatusOr<std::unique_ptr<Authorizer>> Load(std::string data_tokens_file,
                                                          std::string admin_tokens_file,
                                                          Family<Counter>* refusals);

  // An authorizer without tokens files: data calls open, cluster control off.
  static const Authorizer& NoTokens();

  // What the call carrying `header` (its authorization metadata) may do as
  // `access`: its Caller, or UNAUTHENTICATED (no usable credential: missing,
  // malformed, unknown, expired) or PERMISSION_DENIED (a credential of the other
  // kind; cluster control off) with a message saying how to fix it. A refusal is
  // counted and logged with `method` and `peer`.
  absl::StatusOr<Caller> Authorize(std::optional<absl::string_view> header, Access access,
                                   absl::string_view method, absl::string_view peer,
                                   absl::Time now = absl::Now()) const ABSL_LOCKS_EXCLUDED(mu_);

  // Reads both files again (SIGHUP: tokens added, revoked, rotated). All or
  // nothing: on an error the tokens in force stay, and the error is returned.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Tokens {
    std::shared_ptr<const TokenAuthenticator> data;   // null: data calls are open
    std::shared_ptr<const TokenAuthenticator> admin;  // null: cluster control is off
  };
  Authorizer(std::string data_file, std::string admin_file, Family<Counter>* refusals)
      : data_file_(std::move(data_file)), admin_file_(std::move(admin_file)), refusals_(refusals) {}
  static absl::StatusOr<Tokens> Read(const std::string& data_file, const std::string& admin_file);
  Tokens tokens() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Refuse(Refusal reason, absl::Status status, absl::string_view method,
                      absl::string_view peer) const;

  const std::string data_file_;
  const std::string admin_file_;
  Family<Counter>* const refusals_;
  mutable absl::Mutex mu_;
  Tokens tokens_ ABSL_GUARDED_BY(mu_);
};

// The audit line of an admin call that was allowed: who, from where, what, on
// which slots, and how it ended.
void LogAdminAction(const Caller& caller, absl::string_view peer, absl::string_view method,
                    absl::string_view detail, const absl::Status& result);

}  // namespace qparams

#endif  // QPARAMS_SERVER_AUTHORIZER_H_
