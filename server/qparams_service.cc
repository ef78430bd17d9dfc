#include "server/qparams_service.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "core/observation.h"
#include "core/status_macros.h"
#include "domain/session_cursor.h"
#include "domain/session_store.h"
#include "export/engine_export_source.h"
#include "export/exporter.h"
#include "export/item_export_source.h"
#include "proto/convert.h"
#include "proto/status.h"
#include "server/wire.h"

namespace qparams {
namespace {

// The bytes of observation data a request carries, for ServerMetrics::received_bytes.
size_t ObservationBytes(const v1::ObserveRequest& request) {
  switch (request.observation_case()) {
    case v1::ObserveRequest::kRange:
      return request.range().min().data().size() + request.range().max().data().size();
    case v1::ObserveRequest::kHistogram:
      return request.histogram().counts_size() * sizeof(uint64_t);
    default:
      return request.tensor().data().size();
  }
}

}  // namespace

QParamsServiceImpl::QParamsServiceImpl(Engine* engine, ServiceOptions options)
    : engine_(engine),
      options_(options),
      calls_(engine, options),
      fan_out_(engine, options.cluster_address, options.cluster_credentials) {
  SetMessageAllocatorFor_Observe(&observe_allocator_);
  SetMessageAllocatorFor_ObserveBatch(&observe_batch_allocator_);
  SetMessageAllocatorFor_Compute(&compute_allocator_);
  SetMessageAllocatorFor_Step(&step_allocator_);
}

absl::StatusOr<std::string> QParamsServiceImpl::Tenant(grpc::CallbackServerContext* context,
                                                       absl::string_view method) const {
  QPARAMS_ASSIGN_OR_RETURN(Caller caller, calls_.Authorize(context, Access::kData, method));
  return std::move(caller.name);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::Unary(
    grpc::CallbackServerContext* context, absl::string_view method,
    absl::FunctionRef<absl::Status(const std::string& tenant)> body, Access access) {
  absl::StatusOr<Caller> caller = calls_.Authorize(context, access, method);
  const absl::Status status = caller.ok() ? body(caller->name) : caller.status();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(calls_.Finish(context, method, status));
  return reactor;
}

template <typename Message>
grpc::ServerWriteReactor<Message>* QParamsServiceImpl::PullStream(
    grpc::CallbackServerContext* context, absl::string_view method,
    absl::FunctionRef<absl::StatusOr<PullProducer<Message>>(std::string tenant)> start) {
  absl::StatusOr<std::string> tenant = Tenant(context, method);
  absl::StatusOr<PullProducer<Message>> produce =
      tenant.ok() ? start(*std::move(tenant)) : tenant.status();
  return new PullWriteReactor<Message>(std::move(produce),
                                       [this, context, method](const absl::Status& status) {
                                         calls_.LogFailure(context, method, status);
                                         return wire::ToGrpcStatus(status);
                                       });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::FannedUnary(grpc::CallbackServerContext* context,
                                                          absl::string_view method,
                                                          std::function<absl::Status()> body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::StatusOr<Caller> caller = calls_.Authorize(context, Access::kData, method);
      !caller.ok()) {
    reactor->Finish(calls_.Finish(context, method, caller.status()));
    return reactor;
  }
  FanOut::Detach([this, context, method, reactor, body = std::move(body)] {
    reactor->Finish(calls_.Finish(context, method, body()));
  });
  return reactor;
}

template <typename Message>
grpc::ServerWriteReactor<Message>* QParamsServiceImpl::FannedStream(
    grpc::CallbackServerContext* context, absl::string_view method,
    std::function<absl::Status(const std::function<bool(const Message&)>& write)> body) {
  const absl::StatusOr<std::string> tenant = Tenant(context, method);
  if (!tenant.ok()) body = [status = tenant.status()](const auto&) { return status; };
  return new FanOutWriteReactor<Message>(std::move(body),
                                         [this, context, method](const absl::Status& status) {
                                           return calls_.Finish(context, method, status);
                                         });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::ListCalculators(
    grpc::CallbackServerContext* context, const v1::ListCalculatorsRequest* /*request*/,
    v1::ListCalculatorsResponse* response) {
  return Unary(context, "ListCalculators", [&](const std::string& /*tenant*/) {
    for (const CalculatorClass* cls : engine_->ListCalculators()) {
      v1::CalculatorInfo* info = response->add_calculators();
      info->set_key(cls->key);
      info->set_stateful(cls->stateful);
      info->set_description(cls->description);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::Compute(grpc::CallbackServerContext* context,
                                                      const v1::ComputeRequest* request,
                                                      v1::ComputeResponse* response) {
  return Unary(context, "Compute", [&](const std::string& /*tenant*/) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const QuantSpec spec, wire::SpecFromProto(request->spec()));
    QPARAMS_ASSIGN_OR_RETURN(
        const Observation observation,
        wire::ComputeObservationFromProto(*request, options_.max_tensor_elements));
    QPARAMS_ASSIGN_OR_RETURN(const QParams qparams,
                             engine_->Compute(request->calculator(), spec, observation));
    *response->mutable_qparams() = wire::QParamsToProto(qparams);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::CreateSession(
    grpc::CallbackServerContext* context, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  return Unary(context, "CreateSession", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const QuantSpec spec, wire::SpecFromProto(request->spec()));
    CalculatorOptions options;
    if (request->has_averaging_constant()) {
      options.averaging_constant = request->averaging_constant();
    }
    if (request->has_histogram()) {
      QPARAMS_ASSIGN_OR_RETURN(options.histogram,
                               wire::HistogramParamsFromProto(request->histogram()));
    }
    QPARAMS_ASSIGN_OR_RETURN(
        const SessionInfo session,
        engine_->CreateSession(tenant, request->name(), request->calculator(), spec, options));
    wire::SessionToProto(session, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetSession(grpc::CallbackServerContext* context,
                                                         const v1::GetSessionRequest* request,
                                                         v1::Session* response) {
  return Unary(context, "GetSession", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const SessionInfo session,
                             engine_->GetSession(tenant, request->name()));
    wire::SessionToProto(session, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::ListSessions(grpc::CallbackServerContext* context,
                                                           const v1::ListSessionsRequest* request,
                                                           v1::ListSessionsResponse* response) {
  if (std::vector<std::string> replicas = fan_out_.Replicas(*context); !replicas.empty()) {
    return FannedUnary(context, "ListSessions", [this, context, request, response, replicas] {
      QPARAMS_ASSIGN_OR_RETURN(*response, fan_out_.ListSessions(*context, replicas, *request));
      return absl::OkStatus();
    });
  }
  return Unary(context, "ListSessions", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const SessionPage page,
                             engine_->ListSessions(tenant, request->page_size(),
                                                   request->page_token(), request->filter()));
    for (const SessionInfo& session : page.sessions) {
      wire::SessionToProto(session, response->add_sessions());
    }
    response->set_next_page_token(page.next_page_token);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::DeleteSession(
    grpc::CallbackServerContext* context, const v1::DeleteSessionRequest* request,
    v1::DeleteSessionResponse* /*response*/) {
  return Unary(context, "DeleteSession", [&](const std::string& tenant) {
    return engine_->DeleteSession(tenant, request->name());
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::CreateScaleGroup(
    grpc::CallbackServerContext* context, const v1::CreateScaleGroupRequest* request,
    v1::ScaleGroup* response) {
  return Unary(context, "CreateScaleGroup", [&](const std::string& tenant) -> absl::Status {
    const v1::ScaleGroup& group = request->group();
    ScaleGroupRequest create{group.name(),
                             {group.members().begin(), group.members().end()},
                             wire::GroupShareFromProto(group.share()),
                             group.fill_uncalibrated()};
    QPARAMS_ASSIGN_OR_RETURN(const ScaleGroupInfo created,
                             engine_->CreateScaleGroup(tenant, create));
    wire::ScaleGroupToProto(created, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetScaleGroup(
    grpc::CallbackServerContext* context, const v1::GetScaleGroupRequest* request,
    v1::ScaleGroup* response) {
  return Unary(context, "GetScaleGroup", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const ScaleGroupInfo group,
                             engine_->GetScaleGroup(tenant, request->name()));
    wire::ScaleGroupToProto(group, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::ListScaleGroups(
    grpc::CallbackServerContext* context, const v1::ListScaleGroupsRequest* request,
    v1::ListScaleGroupsResponse* response) {
  if (std::vector<std::string> replicas = fan_out_.Replicas(*context); !replicas.empty()) {
    return FannedUnary(context, "ListScaleGroups", [this, context, request, response, replicas] {
      QPARAMS_ASSIGN_OR_RETURN(*response, fan_out_.ListScaleGroups(*context, replicas, *request));
      return absl::OkStatus();
    });
  }
  return Unary(context, "ListScaleGroups", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const ScaleGroupPage page,
                             engine_->ListScaleGroups(tenant, request->page_size(),
                                                      request->page_token(), request->filter()));
    for (const ScaleGroupInfo& group : page.groups) {
      wire::ScaleGroupToProto(group, response->add_groups());
    }
    response->set_next_page_token(page.next_page_token);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::DeleteScaleGroup(
    grpc::CallbackServerContext* context, const v1::DeleteScaleGroupRequest* request,
    v1::DeleteScaleGroupResponse* /*response*/) {
  return Unary(context, "DeleteScaleGroup", [&](const std::string& tenant) {
    return engine_->DeleteScaleGroup(tenant, request->name());
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetGroupQParams(
    grpc::CallbackServerContext* context, const v1::GetGroupQParamsRequest* request,
    v1::GroupQParams* response) {
  return Unary(context, "GetGroupQParams", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const GroupResult result,
                             engine_->GetGroupQParams(tenant, request->name()));
    *response = wire::GroupResultToProto(request->name(), result);
    return absl::OkStatus();
  });
}

absl::Status QParamsServiceImpl::ObserveOne(absl::string_view tenant,
                                            const v1::ObserveRequest& request,
                                            v1::ObserveResponse* response) {
  if (options_.received_bytes != nullptr) {
    options_.received_bytes->Increment(ObservationBytes(request));
  }
  ObserveOutcome outcome = engine_->Observe(
      tenant, request.name(), wire::ObservationFromProto(request, options_.max_tensor_elements),
      request.omit_qparams(), wire::ObserveKeyFromProto(request));
  response->set_observation_count(outcome.result.observation_count);
  QPARAMS_RETURN_IF_ERROR(outcome.status);
  if (outcome.result.duplicate) response->set_duplicate(true);
  if (!request.omit_qparams()) {
    *response->mutable_qparams() = wire::QParamsToProto(outcome.result.qparams);
    if (outcome.result.calibration) {
      *response->mutable_calibration() = wire::CalibrationToProto(*outcome.result.calibration);
    }
  }
  return absl::OkStatus();
}

void QParamsServiceImpl::ObserveItem(grpc::CallbackServerContext* context, absl::string_view method,
                                     absl::string_view tenant, const v1::ObserveRequest& request,
                                     v1::ObserveResponse* response) {
  const absl::Status status = ObserveOne(tenant, request, response);
  calls_.LogFailure(context, method, status);
  *response->mutable_status() = wire::ToRpcStatus(status);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::Observe(grpc::CallbackServerContext* context,
                                                      const v1::ObserveRequest* request,
                                                      v1::ObserveResponse* response) {
  return Unary(context, "Observe", [&](const std::string& tenant) {
    return ObserveOne(tenant, *request, response);
  });
}

// Reads a request, answers it, and only then reads the next: responses leave in
// request order, and a failed request fails only its own response.
class QParamsServiceImpl::ObserveStreamReactor final
    : public grpc::ServerBidiReactor<v1::ObserveRequest, v1::ObserveResponse> {
 public:
  ObserveStreamReactor(QParamsServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    absl::StatusOr<std::string> tenant = service_->Tenant(context, "ObserveStream");
    if (!tenant.ok()) {
      service_->calls_.LogFailure(context_, "ObserveStream", tenant.status());
      Finish(wire::ToGrpcStatus(tenant.status()));
      return;
    }
    tenant_ = *std::move(tenant);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done writing (or the call ended)
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    service_->ObserveItem(context_, "ObserveStream", tenant_, request_, &response_);
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream ended before a response"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  QParamsServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  std::string tenant_;
  v1::ObserveRequest request_;
  v1::ObserveResponse response_;
};

grpc::ServerBidiReactor<v1::ObserveRequest, v1::ObserveResponse>*
QParamsServiceImpl::ObserveStream(grpc::CallbackServerContext* context) {
  return new ObserveStreamReactor(this, context);
}

grpc::ServerWriteReactor<v1::Session>* QParamsServiceImpl::ReadSessions(
    grpc::CallbackServerContext* context, const v1::ReadSessionsRequest* request) {
  if (std::vector<std::string> replicas = fan_out_.Replicas(*context); !replicas.empty()) {
    return FannedStream<v1::Session>(
        context, "ReadSessions",
        [this, context, request, replicas](const std::function<bool(const v1::Session&)>& write) {
          return fan_out_.ReadSessions(*context, replicas, *request, write);
        });
  }
  return PullStream<v1::Session>(
      context, "ReadSessions",
      [&](std::string tenant) -> absl::StatusOr<PullProducer<v1::Session>> {
        if (!request->prefix().empty()) {
          QPARAMS_RETURN_IF_ERROR(ValidateSessionName(request->prefix(), "prefix"));
        }
        auto cursor =
            std::make_shared<SessionCursor>(engine_, std::move(tenant), request->prefix());
        return [cursor](v1::Session* session) -> absl::StatusOr<bool> {
          QPARAMS_ASSIGN_OR_RETURN(const SessionInfo* next, cursor->Next());
          if (next == nullptr) return false;
          wire::SessionToProto(*next, session);
          return true;
        };
      });
}

// Every session is checked before the first message (Exporter::Start). With
// `items`, the options are (and the scale groups applied) before the first message,
// and the items follow a batch per message.
grpc::ServerWriteReactor<v1::ExportChunk>* QParamsServiceImpl::ExportSessions(
    grpc::CallbackServerContext* context, const v1::ExportSessionsRequest* request) {
  // A share (items) is this replica's alone; a fanning-out replica asks for them.
  if (std::vector<std::string> replicas = fan_out_.Replicas(*context);
      !replicas.empty() && !request->items()) {
    return FannedStream<v1::ExportChunk>(
        context, "ExportSessions",
        [this, context, request,
         replicas](const std::function<bool(const v1::ExportChunk&)>& write) {
          return fan_out_.ExportSessions(*context, replicas, *request, write);
        });
  }
  return PullStream<v1::ExportChunk>(
      context, "ExportSessions",
      [&](std::string tenant) -> absl::StatusOr<PullProducer<v1::ExportChunk>> {
        ExportOptions options = wire::ExportOptionsFromProto(*request);
        if (request->items()) {
          QPARAMS_ASSIGN_OR_RETURN(const ExportFormat format, Exporter::CheckOptions(options));
          QPARAMS_ASSIGN_OR_RETURN(std::shared_ptr<const EngineExportSource> source,
                                   EngineExportSource::Create(engine_, std::move(tenant),
                                                              options.prefix, format,
                                                              &export_groups_));
          std::shared_ptr<ExportPass> pass = source->NewPass();
          return [source, pass](v1::ExportChunk* chunk) -> absl::StatusOr<bool> {
            // Batches of about kItemChunkBytes (at least one item, however large).
            constexpr size_t kItemChunkBytes = 256 << 10;
            size_t bytes = 0;
            while (bytes < kItemChunkBytes) {
              QPARAMS_ASSIGN_OR_RETURN(const ExportItem* item, pass->Next());
              if (item == nullptr) break;
              v1::ExportItem* out = chunk->add_items();
              wire::ExportItemToProto(*item, out);
              bytes += out->ByteSizeLong();
            }
            return chunk->items_size() > 0;
          };
        }
        QPARAMS_ASSIGN_OR_RETURN(
            std::shared_ptr<Exporter> exporter,
            Exporter::Start(engine_, std::move(tenant), std::move(options), &export_groups_));
        return [exporter](v1::ExportChunk* chunk) -> absl::StatusOr<bool> {
          QPARAMS_ASSIGN_OR_RETURN(std::string piece, exporter->Next());
          if (piece.empty()) return false;
          chunk->set_data(std::move(piece));
          return true;
        };
      });
}

// Reads the options and every item, holding them (ItemExportSource's limits); once
// the client has closed its side, checks and renders them, and writes each piece
// only once the client has taken the last. The first error ends the call (a refusal
// of what the client sent, once it has closed its side).
class QParamsServiceImpl::RenderExportReactor final
    : public grpc::ServerBidiReactor<v1::RenderExportRequest, v1::ExportChunk> {
 public:
  RenderExportReactor(QParamsServiceImpl* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    const absl::StatusOr<std::string> tenant = service_->Tenant(context, "RenderExport");
    if (!tenant.ok()) {
      End(tenant.status());
      return;
    }
    StartRead(&request_);
  }

  // A refusal waits for the client to close its side, so that it reaches the client
  // whole: a balancer resets a stream the server ends while the client still sends.
  // Until then the rest is read and dropped.
  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done writing (or the call ended)
      if (refused_.ok()) {
        Render();
      } else {
        End(refused_);
      }
      return;
    }
    if (refused_.ok()) {
      refused_ = Take(request_);
      if (!refused_.ok()) source_.reset();  // what it held is of no use now
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(absl::CancelledError("the stream ended before every message was written"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Take(const v1::RenderExportRequest& request) {
    if (!started_) {
      if (!request.has_options()) {
        return absl::InvalidArgumentError(
            "the first RenderExportRequest must carry the export's options (options)");
      }
      if (request.options().items()) {
        return absl::InvalidArgumentError(
            "RenderExportRequest.options.items must be false: RenderExport writes the document");
      }
      options_ = wire::ExportOptionsFromProto(request.options());
      QPARAMS_RETURN_IF_ERROR(Exporter::CheckOptions(options_).status());
      source_ = std::make_unique<ItemExportSource>(options_.prefix);
      started_ = true;
    } else if (request.has_options()) {
      return absl::InvalidArgumentError(
          "only the first RenderExportRequest carries options; the others carry items");
    }
    for (const v1::ExportItem& wire_item : request.items()) {
      QPARAMS_ASSIGN_OR_RETURN(ExportItem item, wire::ExportItemFromProto(wire_item));
      QPARAMS_RETURN_IF_ERROR(source_->Add(std::move(item)));
    }
    return absl::OkStatus();
  }

  void Render() {
    if (!started_) {
      End(absl::InvalidArgumentError(
          "RenderExport received no options: the first message carries them"));
      return;
    }
    const absl::Status sealed = source_->Seal();
    if (!sealed.ok()) {
      End(sealed);
      return;
    }
    absl::StatusOr<std::unique_ptr<Exporter>> exporter =
        Exporter::Start(std::move(source_), std::move(options_));
    if (!exporter.ok()) {
      End(exporter.status());
      return;
    }
    exporter_ = *std::move(exporter);
    WriteNext();
  }

  void WriteNext() {
    chunk_.Clear();
    absl::StatusOr<std::string> piece = exporter_->Next();
    if (!piece.ok() || piece->empty()) {
      End(piece.status());
      return;
    }
    chunk_.set_data(*std::move(piece));
    StartWrite(&chunk_);
  }

  void End(const absl::Status& status) {
    service_->calls_.LogFailure(context_, "RenderExport", status);
    Finish(wire::ToGrpcStatus(status));
  }

  QParamsServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  v1::RenderExportRequest request_;
  bool started_ = false;  // the options arrived
  absl::Status refused_;  // the first refusal, sent once the client closes its side
  ExportOptions options_;
  std::unique_ptr<ItemExportSource> source_;  // from the first message until Render
  std::unique_ptr<Exporter> exporter_;
  v1::ExportChunk chunk_;
};

grpc::ServerBidiReactor<v1::RenderExportRequest, v1::ExportChunk>*
QParamsServiceImpl::RenderExport(grpc::CallbackServerContext* context) {
  return new RenderExportReactor(this, context);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetTopology(grpc::CallbackServerContext* context,
                                                          const v1::GetTopologyRequest* /*request*/,
                                                          v1::Topology* response) {
  return Unary(
      context, "GetTopology",
      [&](const std::string& /*tenant*/) {
        wire::TopologyToProto(*engine_, response);
        return absl::OkStatus();
      },
      Access::kTopology);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::ObserveBatch(grpc::CallbackServerContext* context,
                                                           const v1::ObserveBatchRequest* request,
                                                           v1::ObserveBatchResponse* response) {
  return Unary(context, "ObserveBatch", [&](const std::string& tenant) {
    if (request->observations_size() > wire::kMaxBatchObservations) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "observations: ", request->observations_size(), " in one ObserveBatch; at most ",
          wire::kMaxBatchObservations, " (send more batches, or use ObserveStream)"));
    }
    response->mutable_responses()->Reserve(request->observations_size());
    for (const v1::ObserveRequest& observation : request->observations()) {
      ObserveItem(context, "ObserveBatch", tenant, observation, response->add_responses());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetQParams(grpc::CallbackServerContext* context,
                                                         const v1::GetQParamsRequest* request,
                                                         v1::GetQParamsResponse* response) {
  return Unary(context, "GetQParams", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const CachedQParams qparams,
                             engine_->GetQParams(tenant, request->name()));
    *response->mutable_qparams() = wire::QParamsToProto(qparams.qparams);
    response->set_initialized(qparams.initialized);
    if (qparams.calibration) {
      *response->mutable_calibration() = wire::CalibrationToProto(*qparams.calibration);
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetHistogram(grpc::CallbackServerContext* context,
                                                           const v1::GetHistogramRequest* request,
                                                           v1::HistogramObservation* response) {
  return Unary(context, "GetHistogram", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const Histogram histogram,
                             engine_->GetHistogram(tenant, request->name()));
    *response = wire::HistogramToProto(histogram);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::SetExportMode(
    grpc::CallbackServerContext* context, const v1::SetExportModeRequest* request,
    v1::Session* response) {
  return Unary(context, "SetExportMode", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const SessionInfo session,
                             engine_->SetExportMode(tenant, request->name(), request->enabled()));
    wire::SessionToProto(session, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::SetGranularity(
    grpc::CallbackServerContext* context, const v1::SetGranularityRequest* request,
    v1::Session* response) {
  return Unary(context, "SetGranularity", [&](const std::string& tenant) -> absl::Status {
    std::optional<Granularity> granularity;
    if (request->has_granularity() &&
        request->granularity().kind_case() != v1::Granularity::KIND_NOT_SET) {
      QPARAMS_ASSIGN_OR_RETURN(granularity,
                               wire::GranularityFromProto(request->granularity(), "granularity"));
    }
    QPARAMS_ASSIGN_OR_RETURN(const SessionInfo session,
                             engine_->SetGranularity(tenant, request->name(), granularity));
    wire::SessionToProto(session, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetSlotMoves(
    grpc::CallbackServerContext* context, const v1::GetSlotMovesRequest* /*request*/,
    v1::SlotMoves* response) {
  return Unary(
      context, "GetSlotMoves",
      [&](const std::string& /*tenant*/) {
        wire::SlotMovesToProto(*engine_, response);
        return absl::OkStatus();
      },
      Access::kTopology);
}

}  // namespace qparams
