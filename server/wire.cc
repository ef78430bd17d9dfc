#include "server/wire.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "common/timestamp.h"
#include "proto/convert.h"

namespace qparams::wire {
namespace {

constexpr absl::Duration kMinStepTimeout = absl::Milliseconds(1);
constexpr absl::Duration kMaxStepTimeout = absl::Hours(24);

}  // namespace

void SessionToProto(const SessionInfo& info, v1::Session* out) {
  out->set_name(info.name);
  out->set_calculator(info.calculator);
  *out->mutable_spec() = SpecToProto(info.spec);
  out->set_averaging_constant(info.averaging_constant);
  out->set_initialized(info.initialized);
  out->set_export_mode(info.export_mode);
  out->set_observation_count(info.observation_count);
  *out->mutable_qparams() = QParamsToProto(info.qparams);
  out->mutable_running_min()->Assign(info.running_min.begin(), info.running_min.end());
  out->mutable_running_max()->Assign(info.running_max.begin(), info.running_max.end());
  if (info.input_dtype) out->set_input_dtype(DTypeToProto(*info.input_dtype));
  *out->mutable_create_time() = TimestampFromTime(info.create_time);
  *out->mutable_update_time() = TimestampFromTime(info.update_time);
  out->set_description(info.description);
  if (info.histogram_params) {
    *out->mutable_histogram() = HistogramParamsToProto(*info.histogram_params);
  }
  if (info.calibration) *out->mutable_calibration() = CalibrationToProto(*info.calibration);
  if (info.steps) *out->mutable_steps() = StepProgressToProto(*info.steps);
}

void ScaleGroupToProto(const ScaleGroupInfo& group, v1::ScaleGroup* out) {
  out->set_name(group.name);
  for (const std::string& member : group.members) out->add_members(member);
  out->set_share(GroupShareToProto(group.share));
  out->set_fill_uncalibrated(group.fill_uncalibrated);
  *out->mutable_create_time() = TimestampFromTime(group.create_time);
}

void ExportItemToProto(const ExportItem& item, v1::ExportItem* out) {
  out->set_name(item.session.name);
  *out->mutable_spec() = SpecToProto(item.session.spec);
  out->set_initialized(item.session.initialized);
  *out->mutable_qparams() = QParamsToProto(item.session.qparams);
  out->set_filled_group(item.filled_group);
}

absl::StatusOr<ExportItem> ExportItemFromProto(const v1::ExportItem& in) {
  ExportItem item;
  item.session.name = in.name();
  absl::StatusOr<QuantSpec> spec = SpecFromProto(in.spec());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("export item ", in.name(), ": ", spec.status().message()));
  }
  item.session.spec = *std::move(spec);
  item.session.initialized = in.initialized();
  item.session.qparams = QParamsFromProto(in.qparams());
  item.filled_group = in.filled_group();
  return item;
}

ExportOptions ExportOptionsFromProto(const v1::ExportSessionsRequest& request) {
  return {request.prefix(),
          request.format(),
          request.allow_uninitialized(),
          {request.tensor_names().begin(), request.tensor_names().end()}};
}

void TopologyToProto(const Engine& engine, v1::Topology* out) {
  out->set_slot_count(kSlotCount);
  out->set_replica_id(engine.replica_id());
  const std::shared_ptr<const SlotMap> map = engine.slot_map();
  if (map == nullptr) {
    v1::SlotRange* all = out->add_ranges();
    all->set_low(0);
    all->set_high(kSlotCount - 1);
    out->add_replicas("");
    return;
  }
  out->set_epoch(map->epoch());
  for (const SlotMap::Range& range : map->Ranges()) {
    v1::SlotRange* r = out->add_ranges();
    r->set_low(range.low);
    r->set_high(range.high);
    r->set_replica(range.replica);
  }
  for (const std::string& replica : map->replicas()) out->add_replicas(replica);
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

absl::StatusOr<SlotMoveState> SlotMoveStateFromProto(v1::SlotMove::State state) {
  switch (state) {
    case v1::SlotMove::STABLE:
      return SlotMoveState::kStable;
    case v1::SlotMove::MIGRATING:
      return SlotMoveState::kMigrating;
    case v1::SlotMove::IMPORTING:
      return SlotMoveState::kImporting;
    default:
      return absl::InvalidArgumentError(
          "move.state is unset or unknown; set STABLE, MIGRATING or IMPORTING");
  }
}

absl::StatusOr<std::optional<absl::Duration>> StepTimeoutFromProto(const v1::StepRequest& request) {
  if (!request.has_step_timeout()) return std::optional<absl::Duration>();
  const google::protobuf::Duration& d = request.step_timeout();
  const absl::Duration timeout = absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
  if (timeout < kMinStepTimeout || timeout > kMaxStepTimeout) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step_timeout: ", absl::FormatDuration(timeout), " is outside [",
        absl::FormatDuration(kMinStepTimeout), ", ", absl::FormatDuration(kMaxStepTimeout), "]"));
  }
  return std::optional<absl::Duration>(timeout);
}

}  // namespace qparams::wire
