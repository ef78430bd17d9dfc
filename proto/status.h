// The one conversion between absl::Status and the wire's statuses: gRPC's call
// status, and the RpcStatus that a stream or batch response carries per item. Both
// use the canonical codes (google.rpc.Code), value for value, so a status crosses
// unchanged: code and message.

#ifndef QPARAMS_PROTO_STATUS_H_
#define QPARAMS_PROTO_STATUS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"
#include "qparams/v1/qparams.pb.h"

namespace qparams::wire {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The status of one item of a stream, batch or step response (ObserveStream,
// ObserveBatch, Step, ResumeSteps): code and message, and, for a refusal naming the
// replica that owns the item's session (kOwnerPayload, common/slot.h), that replica
// as `owner`, for the client to send the item there. Every item status goes through
// it, so none loses its owner.
v1::RpcStatus ToRpcStatus(const absl::Status& status);
// Code and message only: a client reads an item's `owner` from the RpcStatus.
absl::Status FromRpcStatus(const v1::RpcStatus& status);

// `status` of a call to one replica of several, its message naming the replica
// ("replica r1: ...").
absl::Status FromReplica(const std::string& replica, const absl::Status& status);

// A listing over every replica (ListSessions, ListScaleGroups, ReadSessions fanned
// out by a replica, server/fan_out.h) that could not read some replicas is
// UNAVAILABLE naming them: in the status, this payload (their names,
// comma-separated); on the wire, the trailing metadata kUnreachableMetadata (the
// same names), which the server adds and the C++ and Python clients read back.
inline constexpr char kUnreachablePayload[] = "qparams.dev/unreachable-replicas";
inline constexpr char kUnreachableMetadata[] = "x-qparams-unreachable";
// The replicas an incomplete listing names (kUnreachablePayload); none for any
// other status.
std::vector<std::string> UnreachableReplicas(const absl::Status& status);
// The status of a listing that could not read `failed` (by replica, each with its
// error), once the other replicas' items were delivered: UNAVAILABLE naming them,
// with the kUnreachablePayload.
absl::Status IncompleteError(const std::map<std::string, absl::Status>& failed);
// The same for replicas known only by name (pages' unreachable_replicas).
absl::Status IncompleteError(const std::vector<std::string>& unreachable);

}  // namespace qparams::wire

#endif  // QPARAMS_PROTO_STATUS_H_
