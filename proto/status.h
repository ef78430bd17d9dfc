// The one conversion between absl::Status and the wire's statuses: gRPC's call
// status, and the RpcStatus that a stream or batch response carries per item. Both
// use the canonical codes (google.rpc.Code), value for value, so a status crosses
// unchanged: code and message.

#ifndef QPARAMS_PROTO_STATUS_H_
#define QPARAMS_PROTO_STATUS_H_

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

}  // namespace qparams::wire

#endif  // QPARAMS_PROTO_STATUS_H_
