#include "tools/reshard.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "core/status_macros.h"

namespace qparams {
namespace {

using Owners = std::array<std::string, kSlotCount>;

// Each slot's owner as `topology` gives it.
Owners OwnersOf(const v1::Topology& topology) {
  Owners owners;
  for (const v1::SlotRange& range : topology.ranges()) {
    for (int slot = std::max(range.low(), 0); slot <= std::min(range.high(), kSlotCount - 1);
         ++slot) {
      owners[slot] = range.replica();
    }
  }
  return owners;
}

// The first slot of [low, high] `replica` does not own, or -1.
int FirstNotOwned(const Owners& owners, int low, int high, const std::string& replica) {
  for (int slot = low; slot <= high; ++slot) {
    if (owners[slot] != replica) return slot;
  }
  return -1;
}

// Whether every slot of [low, high] is in `state` with `peer` in `moves`.
bool AllIn(const v1::SlotMoves& moves, int low, int high, v1::SlotMove::State state,
           const std::string& peer) {
  for (int slot = low; slot <= high; ++slot) {
    bool found = false;
    for (const v1::SlotMove& move : moves.moves()) {
      if (move.low() <= slot && slot <= move.high()) {
        found = move.state() == state && move.peer() == peer;
      }
    }
    if (!found) return false;
  }
  return true;
}

// The first slot of [low, high] in a move, described, or "".
std::string MoveUnderWay(const v1::SlotMoves& moves, int low, int high) {
  for (const v1::SlotMove& move : moves.moves()) {
    if (move.high() >= low && move.low() <= high) {
      return absl::StrCat(moves.replica_id(), " shows slots ", move.low(), ":", move.high(), " ",
                          v1::SlotMove::State_Name(move.state()), " with ", move.peer());
    }
  }
  return "";
}

// The map file's text of `owners` at `epoch`, maximal runs in slot order.
std::string RenderMap(const Owners& owners, int64_t epoch) {
  std::string text = absl::StrCat("# epoch ", epoch, "\n# slots   replica\n");
  int low = 0;
  for (int slot = 1; slot <= kSlotCount; ++slot) {
    if (slot == kSlotCount || owners[slot] != owners[low]) {
      absl::StrAppend(&text, low, ":", slot - 1, " ", owners[low], "\n");
      low = slot;
    }
  }
  return text;
}

// A call's error, naming the replica and the step.
absl::Status At(const std::string& replica, absl::string_view step, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(replica, ": ", step, ": ", status.message()));
}

class Move {
 public:
  Move(Client& source, Client& target, const ReshardPlan& plan, const ReshardOptions& options)
      : source_(source), target_(target), plan_(plan), options_(options) {}

  absl::StatusOr<ReshardResult> Run(ReshardMode mode) {
    QPARAMS_RETURN_IF_ERROR(Read());
    const bool target_switched = FirstNotOwned(target_owners_, plan_.low, plan_.high,
                                               plan_.target) < 0;
    if (mode == ReshardMode::kAbort) {
      if (target_switched) {
        return absl::FailedPreconditionError(absl::StrCat(
            plan_.target, " owns slots ", Range(), " already (its slot map): the move is past "
            "its switch and cannot be rolled back; finish it with resume, then move the slots "
            "back with another reshard"));
      }
      return Abort();
    }
    if (mode == ReshardMode::kStart) {
      if (int slot = FirstNotOwned(source_owners_, plan_.low, plan_.high, plan_.source);
          slot >= 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "slot ", slot, " belongs to ", source_owners_[slot].empty() ? "no replica"
                                                                        : source_owners_[slot],
            ", not to ", plan_.source, " (its slot map); a move takes slots from their owner"));
      }
      for (const v1::SlotMoves* moves : {&source_moves_, &target_moves_}) {
        if (std::string busy = MoveUnderWay(*moves, plan_.low, plan_.high); !busy.empty()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "a move is under way: ", busy, "; resume it or abort it first"));
        }
      }
      QPARAMS_RETURN_IF_ERROR(Import());
      QPARAMS_RETURN_IF_ERROR(Migrate());
      QPARAMS_RETURN_IF_ERROR(Copy());
      return SwitchAndFinish();
    }
    // kResume: from the furthest step the states show.
    if (target_switched) return SwitchAndFinish();
    if (AllIn(source_moves_, plan_.low, plan_.high, v1::SlotMove::MIGRATING, plan_.target)) {
      QPARAMS_RETURN_IF_ERROR(Copy());
      return SwitchAndFinish();
    }
    if (AllIn(target_moves_, plan_.low, plan_.high, v1::SlotMove::IMPORTING, plan_.source)) {
      QPARAMS_RETURN_IF_ERROR(Migrate());
      QPARAMS_RETURN_IF_ERROR(Copy());
      return SwitchAndFinish();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "no move of slots ", Range(), " from ", plan_.source, " to ", plan_.target,
        " is under way: ", plan_.target, " is not importing them and ", plan_.source,
        " not migrating them; start one"));
  }

 private:
  std::string Range() const { return absl::StrCat(plan_.low, ":", plan_.high); }

  void Log(absl::string_view line) const {
    if (options_.log) options_.log(line);
  }

  // Both replicas' maps and states.
  absl::Status Read() {
    absl::StatusOr<v1::Topology> source = source_.GetTopologyOf(plan_.source);
    if (!source.ok()) return At(plan_.source, "GetTopology", source.status());
    absl::StatusOr<v1::Topology> target = target_.GetTopologyOf(plan_.target);
    if (!target.ok()) return At(plan_.target, "GetTopology", target.status());
    source_owners_ = OwnersOf(*source);
    target_owners_ = OwnersOf(*target);
    absl::StatusOr<v1::SlotMoves> source_moves = source_.GetSlotMoves(plan_.source);
    if (!source_moves.ok()) return At(plan_.source, "GetSlotMoves", source_moves.status());
    absl::StatusOr<v1::SlotMoves> target_moves = target_.GetSlotMoves(plan_.target);
    if (!target_moves.ok()) return At(plan_.target, "GetSlotMoves", target_moves.status());
    source_moves_ = *std::move(source_moves);
    target_moves_ = *std::move(target_moves);
    // The map to switch to, newer than either replica's so that both take it (the
    // epoch rule); read again after the switch, it stays the one pushed.
    if (result_.next_map.empty()) {
      Owners next = source_owners_;
      for (int slot = plan_.low; slot <= plan_.high; ++slot) next[slot] = plan_.target;
      result_.next_map = RenderMap(next, std::max(source->epoch(), target->epoch()) + 1);
    }
    return absl::OkStatus();
  }

  absl::Status Set(Client& client, const std::string& replica, v1::SlotMove::State state,
                   const std::string& peer) {
    v1::SlotMove move;
    move.set_low(plan_.low);
    move.set_high(plan_.high);
    move.set_state(state);
    move.set_peer(peer);
    absl::StatusOr<v1::SlotMoves> set = client.SetSlotState(replica, move);
    const std::string step =
        absl::StrCat("slots ", Range(), " ", absl::AsciiStrToLower(v1::SlotMove::State_Name(state)),
                     peer.empty() ? "" : absl::StrCat(state == v1::SlotMove::MIGRATING ? " to "
                                                                                       : " from ",
                                                      peer));
    if (!set.ok()) return At(replica, step, set.status());
    Log(absl::StrCat(replica, ": ", step));
    return absl::OkStatus();
  }

  absl::Status Import() {
    return Set(target_, plan_.target, v1::SlotMove::IMPORTING, plan_.source);
  }

  absl::Status Migrate() {
    frozen_since_ = absl::Now();
    return Set(source_, plan_.source, v1::SlotMove::MIGRATING, plan_.target);
  }

  absl::Status Copy() {
    if (frozen_since_ == absl::InfinitePast()) frozen_since_ = absl::Now();
    const absl::Time start = absl::Now();
    absl::StatusOr<v1::DropSlotsResponse> stale =
        target_.DropSlots(plan_.target, plan_.low, plan_.high);
    if (!stale.ok()) return At(plan_.target, "dropping its old copies", stale.status());
    if (stale->sessions() > 0 || stale->groups() > 0) {
      Log(absl::StrCat(plan_.target, ": dropped ", stale->sessions(), " session(s) and ",
                       stale->groups(), " group(s) left by an earlier copy"));
    }
    absl::StatusOr<v1::ImportSessionsResponse> copied =
        source_.CopySlots(plan_.source, plan_.target, plan_.low, plan_.high, &target_);
    if (!copied.ok()) return At(plan_.source, "copying", copied.status());
    result_.sessions_copied = copied->sessions();
    result_.groups_copied = copied->groups();
    result_.copy_time = absl::Now() - start;
    Log(absl::StrCat(plan_.source, " -> ", plan_.target, ": copied ", copied->sessions(),
                     " session(s) and ", copied->groups(), " group(s) in ",
                     absl::FormatDuration(absl::Trunc(result_.copy_time, absl::Milliseconds(1)))));
    return absl::OkStatus();
  }

  absl::StatusOr<ReshardResult> SwitchAndFinish() {
    const bool switched =
        FirstNotOwned(target_owners_, plan_.low, plan_.high, plan_.target) < 0 &&
        FirstNotOwned(source_owners_, plan_.low, plan_.high, plan_.target) < 0;
    if (!switched) {
      if (!options_.switch_map) {
        if (frozen_since_ != absl::InfinitePast()) result_.frozen_time = absl::Now() - frozen_since_;
        result_.outcome = ReshardResult::Outcome::kAwaitingSwitch;
        Log(absl::StrCat("slots ", Range(), " are copied and frozen on ", plan_.source,
                         "; put the new slot map in force (", plan_.target, " first, then ",
                         plan_.source, ", the others, the balancer), then resume"));
        return result_;
      }
      QPARAMS_RETURN_IF_ERROR(options_.switch_map(result_.next_map));
      QPARAMS_RETURN_IF_ERROR(Read());
      for (const auto& [replica, owners] :
           {std::pair{&plan_.target, &target_owners_}, std::pair{&plan_.source, &source_owners_}}) {
        if (int slot = FirstNotOwned(*owners, plan_.low, plan_.high, plan_.target); slot >= 0) {
          return absl::FailedPreconditionError(absl::StrCat(
              "after the switch, ", *replica, "'s slot map still gives slot ", slot, " to ",
              (*owners)[slot], "; put the new map in force there, then resume"));
        }
      }
      Log(absl::StrCat("the slot map gives slots ", Range(), " to ", plan_.target));
    }
    if (frozen_since_ != absl::InfinitePast()) result_.frozen_time = absl::Now() - frozen_since_;
    QPARAMS_RETURN_IF_ERROR(Set(target_, plan_.target, v1::SlotMove::STABLE, ""));
    QPARAMS_RETURN_IF_ERROR(Set(source_, plan_.source, v1::SlotMove::STABLE, ""));
    absl::StatusOr<v1::DropSlotsResponse> dropped =
        source_.DropSlots(plan_.source, plan_.low, plan_.high);
    if (!dropped.ok()) return At(plan_.source, "dropping its copies", dropped.status());
    result_.sessions_dropped = dropped->sessions();
    Log(absl::StrCat(plan_.source, ": dropped ", dropped->sessions(), " session(s) and ",
                     dropped->groups(), " group(s) of slots ", Range()));
    result_.outcome = ReshardResult::Outcome::kDone;
    return result_;
  }

  absl::StatusOr<ReshardResult> Abort() {
    // The target stops importing before it drops, so no import lands after the drop;
    // the source serves the slots again last.
    QPARAMS_RETURN_IF_ERROR(Set(target_, plan_.target, v1::SlotMove::STABLE, ""));
    absl::StatusOr<v1::DropSlotsResponse> dropped =
        target_.DropSlots(plan_.target, plan_.low, plan_.high);
    if (!dropped.ok()) return At(plan_.target, "dropping its copies", dropped.status());
    result_.sessions_dropped = dropped->sessions();
    Log(absl::StrCat(plan_.target, ": dropped ", dropped->sessions(), " session(s) and ",
                     dropped->groups(), " group(s) of slots ", Range()));
    QPARAMS_RETURN_IF_ERROR(Set(source_, plan_.source, v1::SlotMove::STABLE, ""));
    result_.outcome = ReshardResult::Outcome::kAborted;
    return result_;
  }

  Client& source_;
  Client& target_;
  const ReshardPlan& plan_;
  const ReshardOptions& options_;
  Owners source_owners_;
  Owners target_owners_;
  v1::SlotMoves source_moves_;
  v1::SlotMoves target_moves_;
  absl::Time frozen_since_ = absl::InfinitePast();
  ReshardResult result_;
};

}  // namespace

absl::StatusOr<ReshardResult> Reshard(Client& source, Client& target, const ReshardPlan& plan,
                                      ReshardMode mode, const ReshardOptions& options) {
  if (plan.low < 0 || plan.high >= kSlotCount || plan.low > plan.high) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slots ", plan.low, ":", plan.high, ": a range is LOW:HIGH with 0 <= LOW <= HIGH < ",
        kSlotCount));
  }
  for (const std::string* name : {&plan.source, &plan.target}) {
    if (!SlotMap::ValidReplicaName(*name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replica \"", *name, "\": a replica name is 1 to 64 characters of [a-zA-Z0-9._-]"));
    }
  }
  if (plan.source == plan.target) {
    return absl::InvalidArgumentError(
        absl::StrCat("the source and the target are both ", plan.source));
  }
  return Move(source, target, plan, options).Run(mode);
}

}  // namespace qparams
