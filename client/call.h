// The pieces a Client's calls (include/qparams/client.h) are made of, shared by its source
// files (client.cc, steps.cc): a call's deadline and token, a unary call that follows
// a refusal naming the session's owner, which failures may be retried, and the waits
// between attempts.
//
// Internal to the qparams_client target: nothing outside client.cc and steps.cc
// includes it.

#ifndef QPARAMS_CLIENT_CALL_H_
#define QPARAMS_CLIENT_CALL_H_

#include <algorithm>
#include <string>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/replica_router.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"
#include "proto/convert.h"
#include "proto/status.h"

namespace qparams::client_internal {

// Sets the deadline of a call, `timeout` from now, and its authorization metadata
// unless `authorization` is "".
inline void Prepare(grpc::ClientContext& context, absl::Duration timeout,
                    const std::string& authorization) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!authorization.empty()) context.AddMetadata("authorization", authorization);
}

// The status of a finished call of `context`: an incomplete listing (UNAVAILABLE
// naming the replicas it missed in wire::kUnreachableMetadata) carries their names
// as the wire::kUnreachablePayload (UnreachableReplicas).
inline absl::Status FromCall(const grpc::ClientContext& context, const grpc::Status& status) {
  absl::Status result = wire::FromGrpcStatus(status);
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto found = trailers.find(wire::kUnreachableMetadata);
      !result.ok() && found != trailers.end()) {
    result.SetPayload(wire::kUnreachablePayload,
                      absl::Cord(absl::string_view(found->second.data(), found->second.size())));
  }
  return result;
}

// Calls the unary `method` of `stub` with a deadline `timeout` from now, the
// `authorization` metadata ("" = none) and the routing header of `session`, and
// addressed to `replica` unless it is "".
//
// With a `router` that reroutes (no pinned replica), a call naming a session that a
// replica refuses naming another owner (FAILED_PRECONDITION with the x-qparams-owner
// trailer) makes the router read the topology again, and goes once more, addressed
// to that owner; its answer is the call's, but for a refusal of the address itself
// (a client pointed straight at one replica), when the first refusal is. A refusal
// changes nothing, so any method may be retried.
template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> Unary(Stub& stub,
                               grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                            Response*),
                               const Request& request, absl::Duration timeout,
                               const std::string& authorization, const std::string& session = "",
                               const std::string& replica = "", ReplicaRouter* router = nullptr) {
  std::string owner;
  absl::Status first;  // the refusal naming `owner`
  {
    grpc::ClientContext context;
    Prepare(context, timeout, authorization);
    ReplicaRouter::AddHeaders(context, session, replica);
    Response response;
    const grpc::Status status = (stub.*method)(&context, request, &response);
    if (status.ok()) return response;
    if (router == nullptr || !router->Reroutes() || session.empty() || !replica.empty() ||
        status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
      return wire::FromGrpcStatus(status);
    }
    const auto& trailers = context.GetServerTrailingMetadata();
    const auto found = trailers.find(wire::kOwnerMetadata);
    if (found == trailers.end()) return wire::FromGrpcStatus(status);
    owner.assign(found->second.data(), found->second.size());
    first = wire::FromGrpcStatus(status);
  }
  router->Refresh().IgnoreError();  // the retry goes by the refusal's owner either way
  grpc::ClientContext context;
  Prepare(context, timeout, authorization);
  ReplicaRouter::AddHeaders(context, session, owner);
  Response response;
  const grpc::Status status = (stub.*method)(&context, request, &response);
  if (status.ok()) return response;
  // Refused as addressed to another replica (no owner named): this client reached
  // one replica straight, not a balancer; the first refusal says more.
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
      context.GetServerTrailingMetadata().count(wire::kOwnerMetadata) == 0) {
    return first;
  }
  return wire::FromGrpcStatus(status);
}

// A call that may or may not have been applied (docs/retries.md). The server never
// answers UNKNOWN: gRPC reports it for a call a proxy or the transport reset
// ("Stream removed": HAProxy resetting a stream whose replica died under it).
inline bool Retryable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
         code == absl::StatusCode::kUnknown;
}

inline bool Retryable(const absl::Status& status) { return Retryable(status.code()); }

// The waits between attempts of one call: exponential with full jitter in the upper
// half (so that clients cut off together do not come back together), and none once
// the next attempt would start later than `total` after the first.
//
// Not thread-safe: one caller's attempts, one after the other.
class Backoff {
 public:
  Backoff(absl::Duration total, absl::Duration initial, absl::Duration max)
      : deadline_(absl::Now() + total), next_(initial), max_(max) {}

  // Sleeps before the next attempt and returns true, or returns false at once if
  // that attempt would start after the deadline.
  bool Wait() {
    const absl::Duration wait = next_ / 2 + absl::Uniform(gen_, 0.0, 0.5) * next_;
    if (absl::Now() + wait > deadline_) return false;
    absl::SleepFor(wait);
    next_ = std::min(next_ * 2, max_);
    return true;
  }

 private:
  const absl::Time deadline_;
  absl::Duration next_;
  const absl::Duration max_;
  absl::BitGen gen_;
};

}  // namespace qparams::client_internal

#endif  // QPARAMS_CLIENT_CALL_H_
