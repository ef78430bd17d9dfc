#include "server/qparams_service.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "common/timestamp.h"
#include "core/observation.h"
#include "core/status_macros.h"
#include "domain/session_cursor.h"
#include "domain/session_store.h"
#include "export/engine_export_source.h"
#include "export/exporter.h"
#include "export/item_export_source.h"
#include "proto/convert.h"
#include "proto/status.h"

namespace qparams {
namespace {

void ScaleGroupToProto(const ScaleGroupInfo& group, v1::ScaleGroup* out) {
  out->set_name(group.name);
  for (const std::string& member : group.members) out->add_members(member);
  out->set_share(wire::GroupShareToProto(group.share));
  out->set_fill_uncalibrated(group.fill_uncalibrated);
  *out->mutable_create_time() = TimestampFromTime(group.create_time);
}

void SessionToProto(const SessionInfo& info, v1::Session* out) {
  out->set_name(info.name);
  out->set_calculator(info.calculator);
  *out->mutable_spec() = wire::SpecToProto(info.spec);
  out->set_averaging_constant(info.averaging_constant);
  out->set_initialized(info.initialized);
  out->set_export_mode(info.export_mode);
  out->set_observation_count(info.observation_count);
  *out->mutable_qparams() = wire::QParamsToProto(info.qparams);
  out->mutable_running_min()->Assign(info.running_min.begin(), info.running_min.end());
  out->mutable_running_max()->Assign(info.running_max.begin(), info.running_max.end());
  if (info.input_dtype) out->set_input_dtype(wire::DTypeToProto(*info.input_dtype));
  *out->mutable_create_time() = TimestampFromTime(info.create_time);
  *out->mutable_update_time() = TimestampFromTime(info.update_time);
  out->set_description(info.description);
  if (info.histogram_params) {
    *out->mutable_histogram() = wire::HistogramParamsToProto(*info.histogram_params);
  }
  if (info.calibration) *out->mutable_calibration() = wire::CalibrationToProto(*info.calibration);
  if (info.steps) *out->mutable_steps() = wire::StepProgressToProto(*info.steps);
}

// An export item (ExportSessionsRequest.items, RenderExport) on the wire.
void ExportItemToProto(const ExportItem& item, v1::ExportItem* out) {
  out->set_name(item.session.name);
  *out->mutable_spec() = wire::SpecToProto(item.session.spec);
  out->set_initialized(item.session.initialized);
  *out->mutable_qparams() = wire::QParamsToProto(item.session.qparams);
  out->set_filled_group(item.filled_group);
}

// INVALID_ARGUMENT naming the item for a spec the wire cannot hold; the rest of its
// checks are ItemExportSource::Add's.
absl::StatusOr<ExportItem> ExportItemFromProto(const v1::ExportItem& in) {
  ExportItem item;
  item.session.name = in.name();
  absl::StatusOr<QuantSpec> spec = wire::SpecFromProto(in.spec());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("export item ", in.name(), ": ", spec.status().message()));
  }
  item.session.spec = *std::move(spec);
  item.session.initialized = in.initialized();
  item.session.qparams = wire::QParamsFromProto(in.qparams());
  item.filled_group = in.filled_group();
  return item;
}

// An export's options on the wire.
ExportOptions ExportOptionsFromProto(const v1::ExportSessionsRequest& request) {
  return {request.prefix(), request.format(), request.allow_uninitialized(),
          {request.tensor_names().begin(), request.tensor_names().end()}};
}

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

void SlotMovesToProto(const Engine& engine, v1::SlotMoves* out) {
  out->set_replica_id(engine.replica_id());
  for (const SlotMove& move : engine.SlotMoves()) {
    v1::SlotMove* m = out->add_moves();
    m->set_low(move.low);
    m->set_high(move.high);
    m->set_state(move.state == SlotMoveState::kMigrating ? v1::SlotMove::MIGRATING
                                                         : v1::SlotMove::IMPORTING);
    m->set_peer(move.peer);
  }
}

// A batch of ReadSlotRecords ends at this many records or bytes, whichever first.
constexpr int kSlotRecordsPerMessage = 256;
constexpr size_t kSlotRecordBytesPerMessage = size_t{4} << 20;

}  // namespace

QParamsServiceImpl::QParamsServiceImpl(Engine* engine, ServiceOptions options)
    : engine_(engine),
      options_(options),
      authorizer_(options.authorizer != nullptr ? options.authorizer : &Authorizer::NoTokens()) {
  SetMessageAllocatorFor_Observe(&observe_allocator_);
  SetMessageAllocatorFor_ObserveBatch(&observe_batch_allocator_);
  SetMessageAllocatorFor_Compute(&compute_allocator_);
  SetMessageAllocatorFor_Step(&step_allocator_);
}

void QParamsServiceImpl::LogFailure(grpc::CallbackServerContext* context,
                                    absl::string_view method, const absl::Status& status) const {
  if (!options_.log_failed_rpcs || status.ok()) return;
  LogInfo(absl::StrCat(method, " from ", context->peer(), " failed: ",
                       absl::StatusCodeToString(status.code()), ": ", status.message()));
}

void QParamsServiceImpl::AddOwner(grpc::CallbackServerContext* context,
                                  const absl::Status& status) {
  if (auto owner = status.GetPayload(kOwnerPayload); owner.has_value()) {
    context->AddTrailingMetadata(wire::kOwnerMetadata, std::string(*owner));
  }
}

absl::StatusOr<Caller> QParamsServiceImpl::Authorize(grpc::CallbackServerContext* context,
                                                     Access access,
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

absl::StatusOr<std::string> QParamsServiceImpl::Tenant(grpc::CallbackServerContext* context,
                                                       absl::string_view method) const {
  QPARAMS_ASSIGN_OR_RETURN(Caller caller, Authorize(context, Access::kData, method));
  return std::move(caller.name);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::Finish(grpc::CallbackServerContext* context,
                                                     absl::string_view method,
                                                     const absl::Status& status) {
  LogFailure(context, method, status);
  AddOwner(context, status);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(wire::ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* QParamsServiceImpl::Unary(
    grpc::CallbackServerContext* context, absl::string_view method,
    absl::FunctionRef<absl::Status(const std::string& tenant)> body, Access access) {
  absl::StatusOr<Caller> caller = Authorize(context, access, method);
  return Finish(context, method, caller.ok() ? body(caller->name) : caller.status());
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
    SessionToProto(session, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetSession(grpc::CallbackServerContext* context,
                                                         const v1::GetSessionRequest* request,
                                                         v1::Session* response) {
  return Unary(context, "GetSession", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const SessionInfo session,
                             engine_->GetSession(tenant, request->name()));
    SessionToProto(session, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::ListSessions(
    grpc::CallbackServerContext* context, const v1::ListSessionsRequest* request,
    v1::ListSessionsResponse* response) {
  return Unary(context, "ListSessions", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const SessionPage page,
                             engine_->ListSessions(tenant, request->page_size(),
                                                   request->page_token(), request->filter()));
    for (const SessionInfo& session : page.sessions) {
      SessionToProto(session, response->add_sessions());
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
    ScaleGroupToProto(created, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetScaleGroup(
    grpc::CallbackServerContext* context, const v1::GetScaleGroupRequest* request,
    v1::ScaleGroup* response) {
  return Unary(context, "GetScaleGroup", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const ScaleGroupInfo group,
                             engine_->GetScaleGroup(tenant, request->name()));
    ScaleGroupToProto(group, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* QParamsServiceImpl::ListScaleGroups(
    grpc::CallbackServerContext* context, const v1::ListScaleGroupsRequest* request,
    v1::ListScaleGroupsResponse* response) {
  return Unary(context, "ListScaleGroups", [&](const std::string& tenant) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(const ScaleGroupPage page,
                             engine_->ListScaleGroups(tenant, request->page_size(),
                                                      request->page_token(), request->filter()));
    for (const ScaleGroupInfo& group : page.groups) {
      ScaleGroupToProto(group, response->add_groups());
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
  LogFailure(context, method, status);
  *response->mutable_status() = wire::ToRpcStatus(status);
  if (auto owner = status.GetPayload(kOwnerPayload); owner.has_value()) {
    response->mutable_status()->set_owner(std::string(*owner));
  }
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
      service_->LogFailure(context_, "ObserveStream", tenant.status());
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

// A server stream that produces each message only once the client has taken the
// last, so that what it holds is what `produce` holds (a page of sessions, a piece of
// an export), whatever the stream's length. `start` gets the caller's tenant (Tenant,
// resolved here once) and returns `produce`, which fills the next message and
// returns true, or false at the end; an error ends the stream with it, as does a
// failed tenant or `start`, before the first message.
template <typename Message>
class QParamsServiceImpl::PullWriteReactor final : public grpc::ServerWriteReactor<Message> {
 public:
  using Produce = std::function<absl::StatusOr<bool>(Message*)>;
  using Start = absl::FunctionRef<absl::StatusOr<Produce>(std::string tenant)>;

  // `audit` (an admin call's slots): the caller must be an admin rather than a
  // tenant, `start` gets the admin's name, and the call's end is audited.
  PullWriteReactor(QParamsServiceImpl* service, grpc::CallbackServerContext* context,
                   absl::string_view method, Start start,
                   std::optional<std::string> audit = std::nullopt)
      : service_(service), context_(context), method_(method), audit_(std::move(audit)) {
    absl::StatusOr<Caller> caller = service_->Authorize(
        context, audit_.has_value() ? Access::kAdmin : Access::kData, method);
    if (caller.ok()) caller_ = *caller;
    absl::StatusOr<Produce> produce = caller.ok() ? start(caller->name) : caller.status();
    if (!caller.ok()) audit_.reset();  // the refusal was audited
    if (!produce.ok()) {
      End(produce.status());
      return;
    }
    produce_ = *std::move(produce);
    WriteNext();
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
  void WriteNext() {
    message_.Clear();
    absl::StatusOr<bool> produced = produce_(&message_);
    if (!produced.ok() || !*produced) {
      End(produced.status());
      return;
    }
    this->StartWrite(&message_);
  }

  void End(const absl::Status& status) {
    service_->LogFailure(context_, method_, status);
    if (audit_.has_value()) LogAdminAction(caller_, context_->peer(), method_, *audit_, status);
    this->Finish(wire::ToGrpcStatus(status));
  }

  QParamsServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  const absl::string_view method_;
  std::optional<std::string> audit_;
  Caller caller_;
  Produce produce_;
  Message message_;
};

grpc::ServerWriteReactor<v1::Session>* QParamsServiceImpl::ReadSessions(
    grpc::CallbackServerContext* context, const v1::ReadSessionsRequest* request) {
  using Reactor = PullWriteReactor<v1::Session>;
  return new Reactor(
      this, context, "ReadSessions", [&](std::string tenant) -> absl::StatusOr<Reactor::Produce> {
        if (!request->prefix().empty()) {
          QPARAMS_RETURN_IF_ERROR(ValidateSessionName(request->prefix(), "prefix"));
        }
        auto cursor =
            std::make_shared<SessionCursor>(engine_, std::move(tenant), request->prefix());
        return [cursor](v1::Session* session) -> absl::StatusOr<bool> {
          QPARAMS_ASSIGN_OR_RETURN(const SessionInfo* next, cursor->Next());
          if (next == nullptr) return false;
          SessionToProto(*next, session);
          return true;
        };
      });
}

// Every session is checked before the first message (Exporter::Start). With
// `items`, the options are (and the scale groups applied) before the first message,
// and the items follow a batch per message.
grpc::ServerWriteReactor<v1::ExportChunk>* QParamsServiceImpl::ExportSessions(
    grpc::CallbackServerContext* context, const v1::ExportSessionsRequest* request) {
  using Reactor = PullWriteReactor<v1::ExportChunk>;
  return new Reactor(
      this, context, "ExportSessions",
      [&](std::string tenant) -> absl::StatusOr<Reactor::Produce> {
        ExportOptions options = ExportOptionsFromProto(*request);
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
              ExportItemToProto(*item, out);
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
      options_ = ExportOptionsFromProto(request.options());
      QPARAMS_RETURN_IF_ERROR(Exporter::CheckOptions(options_).status());
      source_ = std::make_unique<ItemExportSource>(options_.prefix);
      started_ = true;
    } else if (request.has_options()) {
      return absl::InvalidArgumentError(
          "only the first RenderExportRequest carries options; the others carry items");
    }
    for (const v1::ExportItem& wire_item : request.items()) {
      QPARAMS_ASSIGN_OR_RETURN(ExportItem item, ExportItemFromProto(wire_item));
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
    service_->LogFailure(context_, "RenderExport", status);
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

void QParamsServiceImpl::FillTopology(v1::Topology* response) const {
  response->set_slot_count(kSlotCount);
  response->set_replica_id(engine_->replica_id());
  const std::shared_ptr<const SlotMap> map = engine_->slot_map();
  if (map == nullptr) {
    v1::SlotRange* all = response->add_ranges();
    all->set_low(0);
    all->set_high(kSlotCount - 1);
    response->add_replicas("");
    return;
  }
  response->set_epoch(map->epoch());
  for (const SlotMap::Range& range : map->Ranges()) {
    v1::SlotRange* out = response->add_ranges();
    out->set_low(range.low);
    out->set_high(range.high);
    out->set_replica(range.replica);
  }
  for (const std::string& replica : map->replicas()) response->add_replicas(replica);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::GetTopology(grpc::CallbackServerContext* context,
                                                          const v1::GetTopologyRequest* /*request*/,
                                                          v1::Topology* response) {
  return Unary(
      context, "GetTopology",
      [&](const std::string& /*tenant*/) {
        FillTopology(response);
        return absl::OkStatus();
      },
      Access::kTopology);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::AdminUnary(
    grpc::CallbackServerContext* context, absl::string_view method,
    absl::FunctionRef<absl::Status(std::string& detail)> body) {
  absl::StatusOr<Caller> caller = Authorize(context, Access::kAdmin, method);
  if (!caller.ok()) return Finish(context, method, caller.status());
  std::string detail;
  const absl::Status status = body(detail);
  LogAdminAction(*caller, context->peer(), method, detail, status);
  return Finish(context, method, status);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::SetSlotMap(grpc::CallbackServerContext* context,
                                                         const v1::SetSlotMapRequest* request,
                                                         v1::Topology* response) {
  return AdminUnary(context, "SetSlotMap", [&](std::string& detail) -> absl::Status {
    absl::StatusOr<SlotMap> map = SlotMap::Parse(request->map());
    if (!map.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("map: ", map.status().message()));
    }
    detail = absl::StrCat("epoch ", map->epoch(), " (", map->Ranges().size(), " ranges)");
    QPARAMS_RETURN_IF_ERROR(
        engine_->SetSlotMap(std::make_shared<const SlotMap>(*std::move(map))));
    FillTopology(response);
    return absl::OkStatus();
  });
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
    SessionToProto(session, response);
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
    SessionToProto(session, response);
    return absl::OkStatus();
  });
}

// ---- Moving slots ----

grpc::ServerUnaryReactor* QParamsServiceImpl::GetSlotMoves(
    grpc::CallbackServerContext* context, const v1::GetSlotMovesRequest* /*request*/,
    v1::SlotMoves* response) {
  return Unary(
      context, "GetSlotMoves",
      [&](const std::string& /*tenant*/) {
        SlotMovesToProto(*engine_, response);
        return absl::OkStatus();
      },
      Access::kTopology);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::SetSlotState(
    grpc::CallbackServerContext* context, const v1::SetSlotStateRequest* request,
    v1::SlotMoves* response) {
  return AdminUnary(context, "SetSlotState", [&](std::string& detail) -> absl::Status {
    const v1::SlotMove& move = request->move();
    detail = absl::StrCat("slots ", move.low(), ":", move.high(), " ",
                          v1::SlotMove::State_Name(move.state()),
                          move.peer().empty() ? "" : absl::StrCat(" peer ", move.peer()));
    SlotMoveState state;
    switch (move.state()) {
      case v1::SlotMove::STABLE:
        state = SlotMoveState::kStable;
        break;
      case v1::SlotMove::MIGRATING:
        state = SlotMoveState::kMigrating;
        break;
      case v1::SlotMove::IMPORTING:
        state = SlotMoveState::kImporting;
        break;
      default:
        return absl::InvalidArgumentError(
            "move.state is unset or unknown; set STABLE, MIGRATING or IMPORTING");
    }
    QPARAMS_RETURN_IF_ERROR(engine_->SetSlotState(move.low(), move.high(), state, move.peer()));
    SlotMovesToProto(*engine_, response);
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::SlotRecords>* QParamsServiceImpl::ReadSlotRecords(
    grpc::CallbackServerContext* context, const v1::ReadSlotRecordsRequest* request) {
  using Reactor = PullWriteReactor<v1::SlotRecords>;
  return new Reactor(
      this, context, "ReadSlotRecords",
      [&](std::string /*tenant*/) -> absl::StatusOr<Reactor::Produce> {
        struct Walk {
          std::vector<storage::v1::Record> groups;
          std::vector<SessionKey> keys;
          size_t next_key = 0;
        };
        auto walk = std::make_shared<Walk>();
        QPARAMS_ASSIGN_OR_RETURN(walk->groups,
                                 engine_->SlotGroupRecords(request->low(), request->high()));
        QPARAMS_ASSIGN_OR_RETURN(walk->keys,
                                 engine_->SlotSessionKeys(request->low(), request->high()));
        Engine* engine = engine_;
        return [walk, engine](v1::SlotRecords* batch) -> absl::StatusOr<bool> {
          size_t bytes = 0;
          // The groups (few, small) go first, in the first message.
          for (const storage::v1::Record& group : walk->groups) {
            bytes += group.ByteSizeLong();
            group.SerializeToString(batch->add_records());
          }
          walk->groups.clear();
          while (walk->next_key < walk->keys.size() &&
                 batch->records_size() < kSlotRecordsPerMessage &&
                 bytes < kSlotRecordBytesPerMessage) {
            absl::StatusOr<storage::v1::Record> record =
                engine->SessionRecord(walk->keys[walk->next_key++]);
            if (absl::IsNotFound(record.status())) continue;  // deleted since the listing
            if (!record.ok()) return record.status();
            bytes += record->ByteSizeLong();
            record->SerializeToString(batch->add_records());
          }
          return batch->records_size() > 0;
        };
      },
      /*audit=*/absl::StrCat("slots ", request->low(), ":", request->high()));
}

// Reads a message, imports its records (journaled in order, synced once), then reads
// the next; the first failure finishes the call with it.
class QParamsServiceImpl::ImportReactor final : public grpc::ServerReadReactor<v1::SlotRecords> {
 public:
  ImportReactor(QParamsServiceImpl* service, grpc::CallbackServerContext* context,
                v1::ImportSessionsResponse* response)
      : service_(service), context_(context), response_(response) {
    absl::StatusOr<Caller> caller = service_->Authorize(context, Access::kAdmin, "ImportSessions");
    if (!caller.ok()) {
      End(caller.status());
      return;
    }
    caller_ = *std::move(caller);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done writing (or the call ended)
      End(absl::OkStatus());
      return;
    }
    std::vector<storage::v1::Record> records(request_.records_size());
    for (int i = 0; i < request_.records_size(); ++i) {
      if (!records[i].ParseFromString(request_.records(i))) {
        End(absl::InvalidArgumentError(absl::StrCat("message ", messages_, ": records[", i,
                                                    "] is not a storage record")));
        return;
      }
    }
    if (absl::Status status = service_->engine_->Import(records); !status.ok()) {
      End(absl::Status(status.code(),
                       absl::StrCat("message ", messages_, ": ", status.message())));
      return;
    }
    for (const storage::v1::Record& record : records) {
      if (record.kind_case() == storage::v1::Record::kPut) {
        response_->set_sessions(response_->sessions() + 1);
      } else {
        response_->set_groups(response_->groups() + 1);
      }
    }
    ++messages_;
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  void End(const absl::Status& status) {
    service_->LogFailure(context_, "ImportSessions", status);
    if (caller_.has_value()) {
      LogAdminAction(*caller_, context_->peer(), "ImportSessions",
                     absl::StrCat(response_->sessions(), " sessions, ", response_->groups(),
                                  " groups in ", messages_, " messages"),
                     status);
    }
    Finish(wire::ToGrpcStatus(status));
  }

  QParamsServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  std::optional<Caller> caller_;  // once authorized
  v1::ImportSessionsResponse* const response_;
  v1::SlotRecords request_;
  int64_t messages_ = 0;  // imported so far
};

grpc::ServerReadReactor<v1::SlotRecords>* QParamsServiceImpl::ImportSessions(
    grpc::CallbackServerContext* context, v1::ImportSessionsResponse* response) {
  return new ImportReactor(this, context, response);
}

grpc::ServerUnaryReactor* QParamsServiceImpl::DropSlots(grpc::CallbackServerContext* context,
                                                        const v1::DropSlotsRequest* request,
                                                        v1::DropSlotsResponse* response) {
  return AdminUnary(context, "DropSlots", [&](std::string& detail) -> absl::Status {
    detail = absl::StrCat("slots ", request->low(), ":", request->high());
    QPARAMS_ASSIGN_OR_RETURN(const SlotDrop dropped,
                             engine_->DropSlots(request->low(), request->high()));
    absl::StrAppend(&detail, " (", dropped.sessions, " sessions, ", dropped.groups, " groups)");
    response->set_sessions(dropped.sessions);
    response->set_groups(dropped.groups);
    return absl::OkStatus();
  });
}

}  // namespace qparams
