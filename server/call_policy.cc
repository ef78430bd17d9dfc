#include "server/call_policy.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/slot.h"
#include "core/status_macros.h"
#include "proto/convert.h"
#include "proto/status.h"

namespace qparams {

CallPolicy::CallPolicy(const Engine* engine, const ServiceOptions& options)
    : engine_(engine),
      authorizer_(options.authorizer != nullptr ? options.authorizer : &Authorizer::NoTokens()),
      log_failed_rpcs_(options.log_failed_rpcs) {}

absl::StatusOr<Caller> CallPolicy::Authorize(grpc::CallbackServerContext* context, Access access,
                                             absl::string_view method) const {
  const auto& metadata = context->client_metadata();
  std::optional<absl::string_view> header;
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    header = absl::string_view(it->second.data(), it->second.size());
  }
  QPARAMS_ASSIGN_OR_RETURN(Caller caller,
                           authorizer_->Authorize(header, access, method, context->peer()));
  if (auto it = metadata.find(kReplicaHeader); it != metadata.end()) {
    QPARAMS_RETURN_IF_ERROR(
        engine_->CheckAddressedTo(absl::string_view(it->second.data(), it->second.size())));
  }
  return caller;
}

void CallPolicy::LogFailure(grpc::CallbackServerContext* context, absl::string_view method,
                            const absl::Status& status) const {
  if (!log_failed_rpcs_ || status.ok()) return;
  LogInfo(absl::StrCat(method, " from ", context->peer(), " failed: ",
                       absl::StatusCodeToString(status.code()), ": ", status.message()));
}

grpc::Status CallPolicy::Finish(grpc::CallbackServerContext* context, absl::string_view method,
                                const absl::Status& status) const {
  LogFailure(context, method, status);
  if (auto owner = status.GetPayload(kOwnerPayload); owner.has_value()) {
    context->AddTrailingMetadata(wire::kOwnerMetadata, std::string(*owner));
  }
  if (auto unreachable = status.GetPayload(wire::kUnreachablePayload); unreachable.has_value()) {
    context->AddTrailingMetadata(wire::kUnreachableMetadata, std::string(*unreachable));
  }
  return wire::ToGrpcStatus(status);
}

}  // namespace qparams
