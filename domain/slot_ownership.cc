#include "domain/slot_ownership.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "core/status_macros.h"
#include "domain/session_store.h"
#include "storage/small_file.h"

namespace qparams {

absl::Status CheckSlotRange(int low, int high) {
  if (low < 0 || high >= kSlotCount || low > high) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slots ", low, ":", high, ": a range is LOW:HIGH with 0 <= LOW <= HIGH < ", kSlotCount));
  }
  return absl::OkStatus();
}

SlotOwnership::SlotOwnership(std::shared_ptr<const SlotMap> map, std::string replica_id)
    : replica_id_(std::move(replica_id)), slot_map_(std::move(map)) {}

// ---- Admissions ----

// Each constructor locks the map itself, as absl::ReaderMutexLock does, so that
// the analysis sees the map read under it.
SlotOwnership::ReadAdmission::ReadAdmission(const SlotOwnership& ownership)
    : mu_(&ownership.map_mu_), replica_id_(ownership.replica_id_), slot_(-1) {
  ownership.map_mu_.ReaderLock();
  map_ = ownership.slot_map_.get();
}

SlotOwnership::ReadAdmission::ReadAdmission(const SlotOwnership& ownership, absl::string_view name)
    : mu_(&ownership.map_mu_),
      replica_id_(ownership.replica_id_),
      name_(name),
      slot_(SlotOf(name)) {
  ownership.map_mu_.ReaderLock();
  map_ = ownership.slot_map_.get();
}

SlotOwnership::ReadAdmission::~ReadAdmission() { mu_->ReaderUnlock(); }

bool SlotOwnership::ReadAdmission::Owns(absl::string_view name) const {
  return map_ == nullptr || map_->OwnerOfSession(name) == replica_id_;
}

bool SlotOwnership::ReadAdmission::OwnsSlot() const {
  return map_ == nullptr || map_->OwnerOf(slot_) == replica_id_;
}

absl::Status SlotOwnership::ReadAdmission::CheckOwned() const {
  QPARAMS_RETURN_IF_ERROR(ValidateSessionName(name_));
  if (map_ == nullptr) return absl::OkStatus();
  const std::string& owner = map_->OwnerOf(slot_);
  if (owner == replica_id_) return absl::OkStatus();
  absl::Status refusal = absl::FailedPreconditionError(
      absl::StrCat("session ", name_, " belongs to replica ", owner, " (slot ", slot_,
                   "), not to this replica ", replica_id_,
                   "; send it there (the x-qparams-session header routes it through the "
                   "balancer)"));
  refusal.SetPayload(kOwnerPayload, absl::Cord(owner));
  return refusal;
}

// The gate is one of an array, locked through a pointer the analysis cannot
// follow; its state and peer are read under it and do not change while it is held.
SlotOwnership::WriteAdmission::WriteAdmission(const SlotOwnership& ownership,
                                              absl::string_view name) ABSL_NO_THREAD_SAFETY_ANALYSIS
    : read_(ownership, name),
      gate_mu_(&ownership.gates_[read_.slot()].mu),
      state_((gate_mu_->ReaderLock(), ownership.gates_[read_.slot()].state)),
      peer_(&ownership.gates_[read_.slot()].peer) {}

SlotOwnership::WriteAdmission::~WriteAdmission() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  gate_mu_->ReaderUnlock();
}

absl::Status SlotOwnership::WriteAdmission::CheckWritable() const {
  QPARAMS_RETURN_IF_ERROR(CheckOwned());
  if (state_ != SlotMoveState::kMigrating) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("slot ", slot(), " is moving to ", *peer_,
                                             "; retry (session ", read_.name(), ")"));
}

absl::Status SlotOwnership::CheckAddressedTo(absl::string_view replica) const {
  if (replica == replica_id_ && !replica.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the call is addressed to replica \"", replica, "\" (x-qparams-replica), but this is ",
      replica_id_.empty() ? "a server without sharding (no --replica_id)"
                          : absl::StrCat("replica ", replica_id_),
      "; call through the balancer, or address this replica by its own name"));
}

// ---- The map ----

absl::StatusOr<std::shared_ptr<const SlotMap>> SlotOwnership::ChooseSlotMap(
    Env& env, const std::string& dir, std::shared_ptr<const SlotMap> given) {
  const std::string path = absl::StrCat(dir, "/", kSlotMapFileName);
  absl::StatusOr<std::optional<std::string>> text = ReadSmallFile(env, dir, kSlotMapFileName);
  if (!text.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the persisted slot map: ", text.status().message()));
  }
  if (text->has_value()) {
    absl::StatusOr<SlotMap> persisted = SlotMap::Parse(**text);
    if (!persisted.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " (the slot map this replica last took): ", persisted.status().message(),
          "; remove it to start from --slot_map alone"));
    }
    if (persisted->epoch() > given->epoch()) {
      LogInfo(absl::StrCat("slot map: using epoch ", persisted->epoch(), " from ", path,
                           ", newer than the given map's epoch ", given->epoch()));
      return std::make_shared<const SlotMap>(*std::move(persisted));
    }
    if (*persisted == *given) return given;
    if (persisted->epoch() == given->epoch()) {
      LogWarning(absl::StrCat("slot map: the given map and ", path, " both have epoch ",
                              given->epoch(), " but differ (",
                              SlotMap::DescribeChange(*persisted, *given),
                              "); using the given map: bump the epoch of every changed map"));
    }
  }
  absl::Status written = WriteSmallFile(env, dir, kSlotMapFileName, given->ToText());
  if (!written.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot persist the slot map: ", written.message()));
  }
  return given;
}

absl::Status SlotOwnership::PersistIn(Env& env, std::string dir) {
  env_ = &env;
  dir_ = std::move(dir);
  return LoadMoves();
}

std::shared_ptr<const SlotMap> SlotOwnership::slot_map() const {
  absl::ReaderMutexLock lock(&map_mu_);
  return slot_map_;
}

absl::Status SlotOwnership::SetSlotMap(std::shared_ptr<const SlotMap> map) {
  if (map == nullptr) return absl::InvalidArgumentError("slot map: none given");
  absl::MutexLock set_lock(&set_map_mu_);
  const std::shared_ptr<const SlotMap> current = slot_map();
  if (current == nullptr || replica_id_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this server is not a replica (started without --replica_id and --slot_map), so it "
        "takes no slot map (epoch ",
        map->epoch(), "); start it with both to shard"));
  }
  if (map->epoch() < current->epoch()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slot map epoch ", map->epoch(), " is older than replica ", replica_id_, "'s epoch ",
        current->epoch(), "; a new map needs an epoch above ", current->epoch()));
  }
  if (map->epoch() == current->epoch()) {
    if (map->SameOwners(*current)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "slot map epoch ", map->epoch(), " is replica ", replica_id_, "'s epoch ", current->epoch(),
        " but gives other owners (", SlotMap::DescribeChange(*current, *map),
        "); a changed map needs an epoch above ", current->epoch()));
  }
  if (env_ != nullptr) {
    QPARAMS_RETURN_IF_ERROR(WriteSmallFile(*env_, dir_, kSlotMapFileName, map->ToText()));
  }
  {
    absl::MutexLock lock(&map_mu_);
    slot_map_ = map;
  }
  LogInfo(absl::StrCat("slot map: epoch ", current->epoch(), " -> ", map->epoch(), ": ",
                       SlotMap::DescribeChange(*current, *map), "; replica ", replica_id_, " owns ",
                       map->SlotsOf(replica_id_), " slot(s)"));
  return absl::OkStatus();
}

// ---- Slot moves ----

std::vector<SlotMove> SlotOwnership::Runs(const SlotStates& moves) {
  std::vector<SlotMove> runs;
  for (int slot = 0; slot < kSlotCount; ++slot) {
    const auto& [state, peer] = moves[slot];
    if (state == SlotMoveState::kStable) continue;
    if (!runs.empty() && runs.back().high == slot - 1 && runs.back().state == state &&
        runs.back().peer == peer) {
      runs.back().high = slot;
    } else {
      runs.push_back({slot, slot, state, peer});
    }
  }
  return runs;
}

std::vector<SlotMove> SlotOwnership::SlotMoves() const {
  absl::MutexLock lock(&moves_mu_);
  return Runs(moves_);
}

absl::Status SlotOwnership::CheckMove(int low, int high, SlotMoveState state,
                                      absl::string_view peer) const {
  if (slot_map_ == nullptr) {
    return absl::FailedPreconditionError(
        "this server has no slot map (--replica_id, --slot_map): it owns every slot, and no "
        "slot can move out of it or into it");
  }
  for (int slot = low; slot <= high; ++slot) {
    const std::string& owner = slot_map_->OwnerOf(slot);
    if (state == SlotMoveState::kMigrating && owner != replica_id_) {
      return absl::FailedPreconditionError(
          absl::StrCat("slot ", slot, " belongs to replica ", owner, ", not to this replica ",
                       replica_id_, "; only a slot's owner migrates it"));
    }
    if (state == SlotMoveState::kImporting && owner == replica_id_) {
      return absl::FailedPreconditionError(absl::StrCat("slot ", slot, " belongs to this replica ",
                                                        replica_id_, "; it cannot import it"));
    }
    const auto& [current, current_peer] = moves_[slot];
    if (state != SlotMoveState::kStable && current != SlotMoveState::kStable &&
        (current != state || current_peer != peer)) {
      return absl::FailedPreconditionError(
          absl::StrCat("slot ", slot, " is ", SlotMoveStateName(current), " with ", current_peer,
                       "; finish or abort that move first"));
    }
  }
  return absl::OkStatus();
}

absl::Status SlotOwnership::SetSlotState(int low, int high, SlotMoveState state,
                                         absl::string_view peer) {
  QPARAMS_RETURN_IF_ERROR(CheckSlotRange(low, high));
  if (state == SlotMoveState::kStable) {
    peer = "";
  } else if (!SlotMap::ValidReplicaName(peer) || peer == replica_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer \"", peer,
                     "\": a move's peer is another replica's name (1 to 64 characters of "
                     "[a-zA-Z0-9._-]), not this replica ",
                     replica_id_));
  }
  absl::MutexLock lock(&moves_mu_);
  // The map cannot change until the states have: a move's checks and its switch
  // are ordered.
  absl::ReaderMutexLock map_lock(&map_mu_);
  QPARAMS_RETURN_IF_ERROR(CheckMove(low, high, state, peer));
  SlotStates moves = moves_;
  for (int slot = low; slot <= high; ++slot) moves[slot] = {state, std::string(peer)};
  if (moves == moves_) return absl::OkStatus();
  // Writes in flight on the slots finish first; later ones see the new state.
  std::vector<std::unique_ptr<absl::MutexLock>> held;
  held.reserve(high - low + 1);
  for (int slot = low; slot <= high; ++slot) {
    held.push_back(std::make_unique<absl::MutexLock>(&gates_[slot].mu));
  }
  if (env_ != nullptr) {
    if (absl::Status written =
            WriteSmallFile(*env_, dir_, kSlotMovesFileName, RenderSlotMoves(Runs(moves)));
        !written.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the slot moves cannot be written (", written.message(), ")"));
    }
  }
  moves_ = std::move(moves);
  // Each gate is held exclusively above, through a run of locks the analysis
  // cannot follow.
  [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (int slot = low; slot <= high; ++slot) {
      gates_[slot].state = state;
      gates_[slot].peer = std::string(peer);
    }
  }();
  LogInfo(absl::StrCat("slots ", low, ":", high, " are ", SlotMoveStateName(state),
                       peer.empty() ? "" : absl::StrCat(" with ", peer)));
  return absl::OkStatus();
}

absl::Status SlotOwnership::LoadMoves() {
  absl::StatusOr<std::optional<std::string>> text = ReadSmallFile(*env_, dir_, kSlotMovesFileName);
  absl::StatusOr<std::vector<SlotMove>> moves =
      !text.ok() ? text.status()
                 : ParseSlotMoves(text->has_value() ? absl::string_view(**text) : "");
  if (!moves.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir_, "/", kSlotMovesFileName, ": ", moves.status().message(),
        " (the slot moves this replica takes part in; fix or remove it, then resume or abort "
        "the move)"));
  }
  absl::MutexLock lock(&moves_mu_);
  for (const SlotMove& move : *moves) {
    for (int slot = move.low; slot <= move.high; ++slot) {
      moves_[slot] = {move.state, move.peer};
      absl::MutexLock gate(&gates_[slot].mu);
      gates_[slot].state = move.state;
      gates_[slot].peer = move.peer;
    }
    LogInfo(absl::StrCat("slots ", move.low, ":", move.high, " are ", SlotMoveStateName(move.state),
                         " with ", move.peer, " (a move in progress: resume or abort it)"));
  }
  return absl::OkStatus();
}

}  // namespace qparams
