// The slots a replica is moving out or in (Redis Cluster's MIGRATING and IMPORTING):
// the state a move (docs/sharding.md, "Moving slots online") leaves in each of the
// two replicas, persisted in the data directory so that a crash leaves a state the
// move can resume or roll back.
//
// As text, one maximal run per line, in slot order ('#' comments, blank lines
// skipped): "migrating LOW:HIGH PEER" (this replica owns the slots, refuses their
// writes, and is handing them to PEER) or "importing LOW:HIGH PEER" (this replica
// takes the slots' sessions from PEER, and will own them once the map says so).
// Slots no line names are stable.

#ifndef QPARAMS_DOMAIN_SLOT_MOVES_H_
#define QPARAMS_DOMAIN_SLOT_MOVES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qparams {

enum class SlotMoveState { kStable, kMigrating, kImporting };

// "stable", "migrating", "importing".
absl::string_view SlotMoveStateName(SlotMoveState state);

// A maximal run of slots in one state with one peer.
struct SlotMove {
  int low = 0;
  int high = 0;  // inclusive
  SlotMoveState state = SlotMoveState::kStable;
  std::string peer;  // the other replica of the move; "" when stable
  friend bool operator==(const SlotMove& a, const SlotMove& b) {
    return a.low == b.low && a.high == b.high && a.state == b.state && a.peer == b.peer;
  }
};

// The text above of `moves` (non-stable runs only).
std::string RenderSlotMoves(const std::vector<SlotMove>& moves);

// INVALID_ARGUMENT naming the line and the rule: not three fields, a state other
// than migrating or importing, a slot outside [0, kSlotCount) or LOW above HIGH, a
// peer that is not a replica name, a slot two lines give.
absl::StatusOr<std::vector<SlotMove>> ParseSlotMoves(absl::string_view text);

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_SLOT_MOVES_H_
