#include "server/cluster_admin_service.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/slot_map.h"
#include "core/status_macros.h"
#include "server/authorizer.h"
#include "server/pull_write_reactor.h"
#include "server/wire.h"

namespace qparams {
namespace {

// A batch of ReadSlotRecords ends at this many records or bytes, whichever first.
constexpr int kSlotRecordsPerMessage = 256;
constexpr size_t kSlotRecordBytesPerMessage = size_t{4} << 20;

// ReadSlotRecords' messages: the scale groups of slots [low, high] first (few,
// small, in the first message), then the sessions listed now, each record read when
// its message is produced (a session deleted since the listing is left out).
absl::StatusOr<PullProducer<v1::SlotRecords>> SlotRecordsOf(Engine* engine, int low, int high) {
  struct Walk {
    std::vector<SlotRecord> groups;
    std::vector<SessionKey> keys;
    size_t next_key = 0;
  };
  auto walk = std::make_shared<Walk>();
  QPARAMS_ASSIGN_OR_RETURN(walk->groups, engine->SlotGroupRecords(low, high));
  QPARAMS_ASSIGN_OR_RETURN(walk->keys, engine->SlotSessionKeys(low, high));
  return [walk, engine](v1::SlotRecords* batch) -> absl::StatusOr<bool> {
    size_t bytes = 0;
    for (SlotRecord& group : walk->groups) {
      bytes += group.bytes.size();
      batch->add_records(std::move(group.bytes));
    }
    walk->groups.clear();
    while (walk->next_key < walk->keys.size() && batch->records_size() < kSlotRecordsPerMessage &&
           bytes < kSlotRecordBytesPerMessage) {
      absl::StatusOr<SlotRecord> record = engine->SessionRecord(walk->keys[walk->next_key++]);
      if (absl::IsNotFound(record.status())) continue;  // deleted since the listing
      if (!record.ok()) return record.status();
      bytes += record->bytes.size();
      batch->add_records(std::move(record->bytes));
    }
    return batch->records_size() > 0;
  };
}

}  // namespace

// One admin call, from its start to its end: authorized as it starts (this
// service's one check of Access::kAdmin, whose refusals the Authorizer counts and
// audits), and, once allowed, audited as it ends (LogAdminAction: who, from where,
// what, how it ended). Every method constructs one first and ends through it, and
// does nothing else when refused.
//
// Not a server interceptor (grpc::experimental::ServerInterceptorFactoryInterface)
// over the whole service: in gRPC 1.51 a server interceptor sees a call's batches
// but cannot end the call before its handler runs (hijacking is the client's only),
// so every handler would still have to learn of the refusal and skip its work; and
// the audit line needs what the method did (slots, epoch, counts), which only the
// method knows.
//
// Copyable; a copy ends the same call. Thread safety: the call's, one thread at a
// time.
class ClusterAdminServiceImpl::AdminCall {
 public:
  AdminCall(const ClusterAdminServiceImpl& service, grpc::CallbackServerContext* context,
            absl::string_view method)
      : calls_(&service.calls_), context_(context), method_(method) {
    absl::StatusOr<Caller> caller = calls_->Authorize(context, Access::kAdmin, method);
    if (caller.ok()) {
      caller_ = *std::move(caller);
    } else {
      refusal_ = caller.status();
    }
  }

  // OK when the caller may make the call; else why not, to End the call with.
  const absl::Status& refusal() const { return refusal_; }

  // The gRPC status to finish the call with (CallPolicy::Finish), after the audit
  // line of an allowed call: `detail` (what it did) and `status`. Called once.
  grpc::Status End(const absl::Status& status, absl::string_view detail) const {
    if (caller_.has_value()) LogAdminAction(*caller_, context_->peer(), method_, detail, status);
    return calls_->Finish(context_, method_, status);
  }

 private:
  const CallPolicy* calls_;
  grpc::CallbackServerContext* context_;
  absl::string_view method_;
  std::optional<Caller> caller_;  // once allowed
  absl::Status refusal_;
};

ClusterAdminServiceImpl::ClusterAdminServiceImpl(Engine* engine, const ServiceOptions& options)
    : engine_(engine), calls_(engine, options) {}

grpc::ServerUnaryReactor* ClusterAdminServiceImpl::Unary(
    grpc::CallbackServerContext* context, absl::string_view method,
    absl::FunctionRef<absl::Status(std::string& detail)> body) {
  const AdminCall call(*this, context, method);
  std::string detail;
  const absl::Status status = call.refusal().ok() ? body(detail) : call.refusal();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(call.End(status, detail));
  return reactor;
}

grpc::ServerUnaryReactor* ClusterAdminServiceImpl::SetSlotMap(grpc::CallbackServerContext* context,
                                                              const v1::SetSlotMapRequest* request,
                                                              v1::Topology* response) {
  return Unary(context, "SetSlotMap", [&](std::string& detail) -> absl::Status {
    absl::StatusOr<SlotMap> map = SlotMap::Parse(request->map());
    if (!map.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("map: ", map.status().message()));
    }
    detail = absl::StrCat("epoch ", map->epoch(), " (", map->Ranges().size(), " ranges)");
    QPARAMS_RETURN_IF_ERROR(engine_->SetSlotMap(std::make_shared<const SlotMap>(*std::move(map))));
    wire::TopologyToProto(*engine_, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* ClusterAdminServiceImpl::SetSlotState(
    grpc::CallbackServerContext* context, const v1::SetSlotStateRequest* request,
    v1::SlotMoves* response) {
  return Unary(context, "SetSlotState", [&](std::string& detail) -> absl::Status {
    const v1::SlotMove& move = request->move();
    detail = absl::StrCat("slots ", move.low(), ":", move.high(), " ",
                          v1::SlotMove::State_Name(move.state()),
                          move.peer().empty() ? "" : absl::StrCat(" peer ", move.peer()));
    QPARAMS_ASSIGN_OR_RETURN(const SlotMoveState state, wire::SlotMoveStateFromProto(move.state()));
    QPARAMS_RETURN_IF_ERROR(engine_->SetSlotState(move.low(), move.high(), state, move.peer()));
    wire::SlotMovesToProto(*engine_, response);
    return absl::OkStatus();
  });
}

grpc::ServerWriteReactor<v1::SlotRecords>* ClusterAdminServiceImpl::ReadSlotRecords(
    grpc::CallbackServerContext* context, const v1::ReadSlotRecordsRequest* request) {
  const AdminCall call(*this, context, "ReadSlotRecords");
  absl::StatusOr<PullProducer<v1::SlotRecords>> produce =
      call.refusal().ok() ? SlotRecordsOf(engine_, request->low(), request->high())
                          : absl::StatusOr<PullProducer<v1::SlotRecords>>(call.refusal());
  return new PullWriteReactor<v1::SlotRecords>(
      std::move(produce),
      [call, detail = absl::StrCat("slots ", request->low(), ":", request->high())](
          const absl::Status& status) { return call.End(status, detail); });
}

// Reads a message, imports its records (journaled in order, synced once), then reads
// the next; the first failure finishes the call with it.
class ClusterAdminServiceImpl::ImportReactor final
    : public grpc::ServerReadReactor<v1::SlotRecords> {
 public:
  ImportReactor(const ClusterAdminServiceImpl& service, grpc::CallbackServerContext* context,
                v1::ImportSessionsResponse* response)
      : engine_(service.engine_), call_(service, context, "ImportSessions"), response_(response) {
    if (!call_.refusal().ok()) {
      End(call_.refusal());
      return;
    }
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client is done writing (or the call ended)
      End(absl::OkStatus());
      return;
    }
    std::vector<SlotRecord> records(request_.records_size());
    for (int i = 0; i < request_.records_size(); ++i) {
      records[i].bytes = std::move(*request_.mutable_records(i));
    }
    absl::StatusOr<SlotImport> imported = engine_->Import(records);
    if (!imported.ok()) {
      const absl::Status& status = imported.status();
      End(absl::Status(status.code(), absl::StrCat("message ", messages_, ": ", status.message())));
      return;
    }
    response_->set_sessions(response_->sessions() + imported->sessions);
    response_->set_groups(response_->groups() + imported->groups);
    ++messages_;
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  void End(const absl::Status& status) {
    Finish(call_.End(status, absl::StrCat(response_->sessions(), " sessions, ", response_->groups(),
                                          " groups in ", messages_, " messages")));
  }

  Engine* const engine_;
  const AdminCall call_;
  v1::ImportSessionsResponse* const response_;
  v1::SlotRecords request_;
  int64_t messages_ = 0;  // imported so far
};

grpc::ServerReadReactor<v1::SlotRecords>* ClusterAdminServiceImpl::ImportSessions(
    grpc::CallbackServerContext* context, v1::ImportSessionsResponse* response) {
  return new ImportReactor(*this, context, response);
}

grpc::ServerUnaryReactor* ClusterAdminServiceImpl::DropSlots(grpc::CallbackServerContext* context,
                                                             const v1::DropSlotsRequest* request,
                                                             v1::DropSlotsResponse* response) {
  return Unary(context, "DropSlots", [&](std::string& detail) -> absl::Status {
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
