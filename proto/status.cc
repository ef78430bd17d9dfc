#include "proto/status.h"

#include <cstdint>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/types/optional.h"
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

absl::Status FromReplica(const std::string& replica, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("replica ", replica, ": ", status.message()));
}

std::vector<std::string> UnreachableReplicas(const absl::Status& status) {
  std::vector<std::string> replicas;
  if (const absl::optional<absl::Cord> payload = status.GetPayload(kUnreachablePayload)) {
    replicas = absl::StrSplit(std::string(*payload), ',', absl::SkipEmpty());
  }
  return replicas;
}

absl::Status IncompleteError(const std::map<std::string, absl::Status>& failed) {
  std::vector<std::string> names, messages;
  for (const auto& [replica, status] : failed) {
    names.push_back(replica);
    messages.emplace_back(FromReplica(replica, status).message());
  }
  absl::Status status = absl::UnavailableError(
      absl::StrCat("the listing is incomplete: ", failed.size(),
                   " replica(s) could not be read, so their sessions and groups are not in it: ",
                   absl::StrJoin(messages, "; ")));
  status.SetPayload(kUnreachablePayload, absl::Cord(absl::StrJoin(names, ",")));
  return status;
}

absl::Status IncompleteError(const std::vector<std::string>& unreachable) {
  std::map<std::string, absl::Status> failed;
  for (const std::string& replica : unreachable) {
    failed[replica] = absl::UnavailableError("could not be read");
  }
  return IncompleteError(failed);
}

}  // namespace qparams::wire
