#include "proto/status.h"

#include <cstdint>
#include <string>

#include "common/slot.h"

namespace qparams::wire {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

v1::RpcStatus ToRpcStatus(const absl::Status& status) {
  v1::RpcStatus out;
  out.set_code(static_cast<int32_t>(status.code()));
  out.set_message(std::string(status.message()));
  if (auto owner = status.GetPayload(kOwnerPayload); owner.has_value()) {
    out.set_owner(std::string(*owner));
  }
  return out;
}

absl::Status FromRpcStatus(const v1::RpcStatus& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.code()), status.message());
}

}  // namespace qparams::wire
