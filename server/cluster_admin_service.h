// qparams.v1.ClusterAdmin on gRPC's callback API: the control path of a sharded
// deployment (the slot map, and moving slots between replicas: docs/sharding.md),
// apart from QParamsServiceImpl's data path. Every method acts on a replica's slots
// of every tenant, so every one is an admin call (Access::kAdmin: an admin token of
// --admin_tokens_file, docs/security.md), authorized and audited by one helper
// (AdminCall, cluster_admin_service.cc) rather than by each method. Like
// QParamsServiceImpl it translates wire messages to Engine calls and does nothing
// else.

#ifndef QPARAMS_SERVER_CLUSTER_ADMIN_SERVICE_H_
#define QPARAMS_SERVER_CLUSTER_ADMIN_SERVICE_H_

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "domain/engine.h"
#include "grpcpp/grpcpp.h"
#include "qparams/v1/qparams.grpc.pb.h"
#include "server/call_policy.h"
#include "server/service_options.h"

namespace qparams {

// Thread safety: gRPC calls the methods from any thread, concurrently; the engine
// orders what they change.
class ClusterAdminServiceImpl final : public v1::ClusterAdmin::CallbackService {
 public:
  // `engine` and `options.authorizer` must outlive the service.
  ClusterAdminServiceImpl(Engine* engine, const ServiceOptions& options);

  grpc::ServerUnaryReactor* SetSlotMap(grpc::CallbackServerContext* context,
                                       const v1::SetSlotMapRequest* request,
                                       v1::Topology* response) override;
  grpc::ServerUnaryReactor* SetSlotState(grpc::CallbackServerContext* context,
                                         const v1::SetSlotStateRequest* request,
                                         v1::SlotMoves* response) override;
  grpc::ServerWriteReactor<v1::SlotRecords>* ReadSlotRecords(
      grpc::CallbackServerContext* context, const v1::ReadSlotRecordsRequest* request) override;
  grpc::ServerReadReactor<v1::SlotRecords>* ImportSessions(
      grpc::CallbackServerContext* context, v1::ImportSessionsResponse* response) override;
  grpc::ServerUnaryReactor* DropSlots(grpc::CallbackServerContext* context,
                                      const v1::DropSlotsRequest* request,
                                      v1::DropSlotsResponse* response) override;

 private:
  class AdminCall;      // every method's authorization and audit line
  class ImportReactor;  // ImportSessions

  // Every unary method: runs `body` for an admin caller (AdminCall) and finishes the
  // call with its status, or the refusal. A body fails through the status macros
  // (core/status_macros.h), writes the response as it goes, and describes what it
  // did in `detail` (slots, epoch) for the audit line.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, absl::string_view method,
                                  absl::FunctionRef<absl::Status(std::string& detail)> body);

  Engine* const engine_;
  const CallPolicy calls_;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_CLUSTER_ADMIN_SERVICE_H_
