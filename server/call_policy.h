// What every call of both services (QParamsServiceImpl, ClusterAdminServiceImpl)
// goes through around its body: who may make it, the log line of its failure, and
// the trailing metadata that names a session's owner. One place, so that the data
// path and the control path answer a credential, an address and a refusal alike.

#ifndef QPARAMS_SERVER_CALL_POLICY_H_
#define QPARAMS_SERVER_CALL_POLICY_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "domain/engine.h"
#include "grpcpp/grpcpp.h"
#include "server/authorizer.h"
#include "server/service_options.h"

namespace qparams {

// Thread safety: every method may run on any thread, concurrently (it reads the
// engine's replica and the authorizer, both thread-safe, and writes only `context`,
// which is the calling method's).
class CallPolicy {
 public:
  // `engine` and `options.authorizer` (null: Authorizer::NoTokens()) must outlive
  // the policy.
  CallPolicy(const Engine* engine, const ServiceOptions& options);

  // Who the caller of `method` is, if it may make a call of `access`: the
  // authorization metadata checked by Authorizer::Authorize (its refusals,
  // UNAUTHENTICATED or PERMISSION_DENIED, counted and audited there), then the
  // replica the call is addressed to (x-qparams-replica): FAILED_PRECONDITION for
  // another one (Engine::CheckAddressedTo). Every method asks it first, once.
  absl::StatusOr<Caller> Authorize(grpc::CallbackServerContext* context, Access access,
                                   absl::string_view method) const;

  // Logs a failed call (method, peer, code, message) when ServiceOptions::
  // log_failed_rpcs asks for it; nothing for OK.
  void LogFailure(grpc::CallbackServerContext* context, absl::string_view method,
                  const absl::Status& status) const;

  // The gRPC status a call that ends with `status` finishes with: logged if it
  // failed (LogFailure), and a refusal for a session another replica owns
  // (kOwnerPayload) names that owner in the trailing metadata kOwnerMetadata too,
  // for clients to act on without parsing, and an incomplete listing names the
  // replicas it missed (wire::kUnreachablePayload) in wire::kUnreachableMetadata.
  // Called once, before the call finishes.
  grpc::Status Finish(grpc::CallbackServerContext* context, absl::string_view method,
                      const absl::Status& status) const;

 private:
  const Engine* const engine_;
  const Authorizer* const authorizer_;
  const bool log_failed_rpcs_;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_CALL_POLICY_H_
