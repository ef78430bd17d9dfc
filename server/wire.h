// The server's half of the wire conversions: the domain's and the exporter's values
// (sessions, scale groups, export items, the topology and the slot moves, a step's
// timeout) to and from qparams.v1 messages, for both services. proto/convert.h
// converts the core's values; these need domain/ and export/, which proto/ may not
// include, so they live here, in one file, rather than beside each method.
//
// Thread safety: every function is; those reading an Engine read it as its own
// accessors allow (any thread).

#ifndef QPARAMS_SERVER_WIRE_H_
#define QPARAMS_SERVER_WIRE_H_

#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "domain/engine.h"
#include "domain/session.h"
#include "domain/slot_moves.h"
#include "export/export_source.h"
#include "export/exporter.h"
#include "qparams/v1/qparams.pb.h"
#include "storage/group_codec.h"

namespace qparams::wire {

// A session's state as GetSession, ListSessions, ReadSessions and the setters answer
// it, into `out` (an empty message: fields are set, none is cleared).
void SessionToProto(const SessionInfo& info, v1::Session* out);

// A scale group as CreateScaleGroup, GetScaleGroup and ListScaleGroups answer it.
void ScaleGroupToProto(const ScaleGroupInfo& group, v1::ScaleGroup* out);

// An export item (ExportSessionsRequest.items, RenderExport) on the wire, and back.
// From the wire: INVALID_ARGUMENT naming the item for a spec the wire cannot hold;
// the rest of an item's checks are ItemExportSource::Add's.
void ExportItemToProto(const ExportItem& item, v1::ExportItem* out);
absl::StatusOr<ExportItem> ExportItemFromProto(const v1::ExportItem& in);

// An export's options as sent (Exporter::CheckOptions checks them).
ExportOptions ExportOptionsFromProto(const v1::ExportSessionsRequest& request);

// The engine's topology now (GetTopology, SetSlotMap): its slot map's ranges and
// replicas, or, without one, a single replica "" owning every slot.
void TopologyToProto(const Engine& engine, v1::Topology* out);

// The engine's slots being moved now (GetSlotMoves, SetSlotState).
void SlotMovesToProto(const Engine& engine, v1::SlotMoves* out);

// A SetSlotState's state: INVALID_ARGUMENT for STATE_UNSPECIFIED or an unknown value.
absl::StatusOr<SlotMoveState> SlotMoveStateFromProto(v1::SlotMove::State state);

// The step timeout a Step asks for: none if unset (the engine's default), else
// within [1 ms, 24 h], INVALID_ARGUMENT saying so otherwise.
absl::StatusOr<std::optional<absl::Duration>> StepTimeoutFromProto(const v1::StepRequest& request);

}  // namespace qparams::wire

#endif  // QPARAMS_SERVER_WIRE_H_
