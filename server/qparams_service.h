// qparams.v1.QParamsService on gRPC's callback API: the data path (sessions,
// scale groups, observations, exports, steps) and the topology reads clients route
// with. It translates wire messages to Engine calls and results back, and does
// nothing else: every rule lives in the Engine or the core. Cluster control is
// ClusterAdminServiceImpl's (server/cluster_admin_service.h).

#ifndef QPARAMS_SERVER_QPARAMS_SERVICE_H_
#define QPARAMS_SERVER_QPARAMS_SERVICE_H_

#include <functional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "domain/engine.h"
#include "export/engine_group_source.h"
#include "grpcpp/grpcpp.h"
#include "qparams/v1/qparams.grpc.pb.h"
#include "server/arena_allocator.h"
#include "server/authorizer.h"
#include "server/call_policy.h"
#include "server/fan_out.h"
#include "server/pull_write_reactor.h"
#include "server/service_options.h"

namespace qparams {

// Thread safety: gRPC calls the methods from any thread, concurrently; the engine
// orders what they change.
class QParamsServiceImpl final : public v1::QParamsService::CallbackService {
 public:
  // `engine` and `options.authorizer` must outlive the service.
  QParamsServiceImpl(Engine* engine, ServiceOptions options);

  grpc::ServerUnaryReactor* ListCalculators(grpc::CallbackServerContext* context,
                                            const v1::ListCalculatorsRequest* request,
                                            v1::ListCalculatorsResponse* response) override;
  grpc::ServerUnaryReactor* Compute(grpc::CallbackServerContext* context,
                                    const v1::ComputeRequest* request,
                                    v1::ComputeResponse* response) override;
  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* context,
                                          const v1::CreateSessionRequest* request,
                                          v1::Session* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const v1::GetSessionRequest* request,
                                       v1::Session* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* context,
                                          const v1::DeleteSessionRequest* request,
                                          v1::DeleteSessionResponse* response) override;
  grpc::ServerUnaryReactor* CreateScaleGroup(grpc::CallbackServerContext* context,
                                             const v1::CreateScaleGroupRequest* request,
                                             v1::ScaleGroup* response) override;
  grpc::ServerUnaryReactor* GetScaleGroup(grpc::CallbackServerContext* context,
                                          const v1::GetScaleGroupRequest* request,
                                          v1::ScaleGroup* response) override;
  grpc::ServerUnaryReactor* ListScaleGroups(grpc::CallbackServerContext* context,
                                            const v1::ListScaleGroupsRequest* request,
                                            v1::ListScaleGroupsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteScaleGroup(grpc::CallbackServerContext* context,
                                             const v1::DeleteScaleGroupRequest* request,
                                             v1::DeleteScaleGroupResponse* response) override;
  grpc::ServerUnaryReactor* GetGroupQParams(grpc::CallbackServerContext* context,
                                            const v1::GetGroupQParamsRequest* request,
                                            v1::GroupQParams* response) override;
  grpc::ServerUnaryReactor* Observe(grpc::CallbackServerContext* context,
                                    const v1::ObserveRequest* request,
                                    v1::ObserveResponse* response) override;
  grpc::ServerWriteReactor<v1::Session>* ReadSessions(
      grpc::CallbackServerContext* context, const v1::ReadSessionsRequest* request) override;
  grpc::ServerUnaryReactor* GetTopology(grpc::CallbackServerContext* context,
                                        const v1::GetTopologyRequest* request,
                                        v1::Topology* response) override;
  grpc::ServerWriteReactor<v1::ExportChunk>* ExportSessions(
      grpc::CallbackServerContext* context, const v1::ExportSessionsRequest* request) override;
  grpc::ServerBidiReactor<v1::RenderExportRequest, v1::ExportChunk>* RenderExport(
      grpc::CallbackServerContext* context) override;
  grpc::ServerBidiReactor<v1::ObserveRequest, v1::ObserveResponse>* ObserveStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ObserveBatch(grpc::CallbackServerContext* context,
                                         const v1::ObserveBatchRequest* request,
                                         v1::ObserveBatchResponse* response) override;
  grpc::ServerUnaryReactor* GetQParams(grpc::CallbackServerContext* context,
                                       const v1::GetQParamsRequest* request,
                                       v1::GetQParamsResponse* response) override;
  grpc::ServerUnaryReactor* GetHistogram(grpc::CallbackServerContext* context,
                                         const v1::GetHistogramRequest* request,
                                         v1::HistogramObservation* response) override;
  grpc::ServerUnaryReactor* SetExportMode(grpc::CallbackServerContext* context,
                                          const v1::SetExportModeRequest* request,
                                          v1::Session* response) override;
  grpc::ServerUnaryReactor* SetGranularity(grpc::CallbackServerContext* context,
                                           const v1::SetGranularityRequest* request,
                                           v1::Session* response) override;
  grpc::ServerUnaryReactor* GetSlotMoves(grpc::CallbackServerContext* context,
                                         const v1::GetSlotMovesRequest* request,
                                         v1::SlotMoves* response) override;

  // server/step_service.cc
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* context,
                                 const v1::StepRequest* request,
                                 v1::StepResponse* response) override;
  grpc::ServerUnaryReactor* ResumeSteps(grpc::CallbackServerContext* context,
                                        const v1::ResumeStepsRequest* request,
                                        v1::ResumeStepsResponse* response) override;

 private:
  class ObserveStreamReactor;
  class StepReactor;  // Step
  class RenderExportReactor;

  // The tenant of a data call (CallPolicy::Authorize with Access::kData): "" on an
  // open server.
  absl::StatusOr<std::string> Tenant(grpc::CallbackServerContext* context,
                                     absl::string_view method) const;

  // The one path of an observation into the Engine, for Observe, ObserveStream and
  // ObserveBatch: fills `response` (qparams on success unless the request omits
  // them, the session's count either way).
  absl::Status ObserveOne(absl::string_view tenant, const v1::ObserveRequest& request,
                          v1::ObserveResponse* response);
  // ObserveOne for one item of a stream or batch: its status goes into `response`
  // (and the log, if asked to), not into the call's.
  void ObserveItem(grpc::CallbackServerContext* context, absl::string_view method,
                   absl::string_view tenant, const v1::ObserveRequest& request,
                   v1::ObserveResponse* response);

  // Every unary method: authorizes the caller once (CallPolicy::Authorize, `access`),
  // runs `body` with its name (the tenant of a data call), and finishes the call with
  // the first failure, or OK (CallPolicy::Finish). A body fails through the status
  // macros (core/status_macros.h) and writes the response as it goes.
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, absl::string_view method,
                                  absl::FunctionRef<absl::Status(const std::string& tenant)> body,
                                  Access access = Access::kData);
  // ReadSessions' and ExportSessions' stream (PullWriteReactor): `start` gets the
  // caller's tenant (Tenant, resolved once) and returns the producer of the
  // messages; a refusal, or a failure of `start`, ends the stream before the first.
  template <typename Message>
  grpc::ServerWriteReactor<Message>* PullStream(
      grpc::CallbackServerContext* context, absl::string_view method,
      absl::FunctionRef<absl::StatusOr<PullProducer<Message>>(std::string tenant)> start);
  // A listing, read or export answered for every replica (FanOut): authorizes the
  // caller here, then runs `body` on a thread of its own, which finishes the call
  // (CallPolicy::Finish, so an incomplete listing names its replicas in the trailing
  // metadata). `body` may only use what outlives the call.
  grpc::ServerUnaryReactor* FannedUnary(grpc::CallbackServerContext* context,
                                        absl::string_view method,
                                        std::function<absl::Status()> body);
  // As FannedUnary, for a server stream: `body` writes its messages (FanOutWriteReactor).
  template <typename Message>
  grpc::ServerWriteReactor<Message>* FannedStream(
      grpc::CallbackServerContext* context, absl::string_view method,
      std::function<absl::Status(const std::function<bool(const Message&)>& write)> body);

  Engine* const engine_;
  const ServiceOptions options_;
  const CallPolicy calls_;
  // Answers the clients' listings, reads and exports for every replica.
  FanOut fan_out_;
  // What ExportSessions reads of the engine's scale groups.
  const EngineGroupSource export_groups_{engine_};
  // The hot unary calls parse and answer on an arena.
  ArenaMessageAllocator<v1::ObserveRequest, v1::ObserveResponse> observe_allocator_;
  ArenaMessageAllocator<v1::ObserveBatchRequest, v1::ObserveBatchResponse> observe_batch_allocator_;
  ArenaMessageAllocator<v1::ComputeRequest, v1::ComputeResponse> compute_allocator_;
  ArenaMessageAllocator<v1::StepRequest, v1::StepResponse> step_allocator_;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_QPARAMS_SERVICE_H_
