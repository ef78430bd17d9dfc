// Which slots this replica owns and which it is moving (docs/sharding.md): the slot
// map, each slot's gate and move state, and their files in the data directory. The
// engine asks it, once per call, for an admission of the name the call is about.
//
// Lock order, as the types give it (absl::Mutex is not reentrant, so none is taken
// twice):
//   set_map_mu_ -> map_mu_ (exclusive)          SetSlotMap, alone;
//   moves_mu_ -> map_mu_ (shared) -> gates, exclusive, in slot order
//                                               SetSlotState, alone;
//   map_mu_ (shared) -> one gate (shared)       a WriteAdmission: its ReadAdmission
//                                               member is built (and locks) first.
// No other code takes them: the mutexes are private, and only the admissions and
// the two setters lock them.

#ifndef QPARAMS_DOMAIN_SLOT_OWNERSHIP_H_
#define QPARAMS_DOMAIN_SLOT_OWNERSHIP_H_

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "domain/slot_moves.h"
#include "storage/env.h"

namespace qparams {

// The file in the data directory that holds the last slot map a replica took
// (SlotMap::ToText), so that a restart does not fall back to an older --slot_map.
inline constexpr absl::string_view kSlotMapFileName = "slot-map";

// The data directory's file of the slot moves this replica takes part in
// (domain/slot_moves.h).
inline constexpr absl::string_view kSlotMovesFileName = "slot-moves";

// INVALID_ARGUMENT unless 0 <= low <= high < kSlotCount.
absl::Status CheckSlotRange(int low, int high);

class SlotOwnership {
 public:
  // `map` null: no sharding, this replica owns every slot. Nothing is persisted
  // until PersistIn.
  SlotOwnership(std::shared_ptr<const SlotMap> map, std::string replica_id);

  // The map a sharded replica starts with: the greater epoch of `given` and the one
  // `dir` holds (kSlotMapFileName), `given` on a tie (logged), that choice persisted.
  // FAILED_PRECONDITION for a persisted map that does not parse, or a file that
  // cannot be read or written.
  static absl::StatusOr<std::shared_ptr<const SlotMap>> ChooseSlotMap(
      Env& env, const std::string& dir, std::shared_ptr<const SlotMap> given);

  // From now on SetSlotMap and SetSlotState persist in `dir` through `env` (which
  // must outlive this); then the move states `dir` holds (kSlotMovesFileName) are
  // taken: FAILED_PRECONDITION for a file that does not read or parse (a replica that
  // cannot tell which slots it is moving must not serve them). Call before serving.
  absl::Status PersistIn(Env& env, std::string dir);

  const std::string& replica_id() const { return replica_id_; }

  // The map now; null without sharding. A snapshot: SetSlotMap may replace it.
  std::shared_ptr<const SlotMap> slot_map() const ABSL_LOCKS_EXCLUDED(map_mu_);

  // Engine::SetSlotMap's contract (engine.h).
  absl::Status SetSlotMap(std::shared_ptr<const SlotMap> map)
      ABSL_LOCKS_EXCLUDED(set_map_mu_, map_mu_);

  // Engine::SlotMoves, SetSlotState and CheckAddressedTo's contracts (engine.h).
  std::vector<SlotMove> SlotMoves() const ABSL_LOCKS_EXCLUDED(moves_mu_);
  absl::Status SetSlotState(int low, int high, SlotMoveState state, absl::string_view peer)
      ABSL_LOCKS_EXCLUDED(moves_mu_, map_mu_);
  absl::Status CheckAddressedTo(absl::string_view replica) const;

  // A read's admission: the map held shared for the admission's life, so that the
  // map a call checked is the map in force until it ends (SetSlotMap waits for it).
  // With a name, that name's slot, hashed once. Not copyable; one per call.
  class ABSL_SCOPED_LOCKABLE ReadAdmission {
   public:
    explicit ReadAdmission(const SlotOwnership& ownership)
        ABSL_SHARED_LOCK_FUNCTION(ownership.map_mu_);
    ReadAdmission(const SlotOwnership& ownership, absl::string_view name)
        ABSL_SHARED_LOCK_FUNCTION(ownership.map_mu_);
    ReadAdmission(const ReadAdmission&) = delete;
    ReadAdmission& operator=(const ReadAdmission&) = delete;
    ~ReadAdmission() ABSL_UNLOCK_FUNCTION();

    // The admitted name and its slot.
    absl::string_view name() const { return name_; }
    int slot() const { return slot_; }
    // The map admitted under (null without sharding); valid for the admission's life.
    const SlotMap* map() const { return map_; }
    const std::string& replica_id() const { return replica_id_; }
    // Whether this replica owns the session or group `name` (always, unsharded).
    bool Owns(absl::string_view name) const;
    // Whether it owns the admitted name's slot.
    bool OwnsSlot() const;
    // The admitted name is valid and this replica owns it: else INVALID_ARGUMENT, or
    // FAILED_PRECONDITION naming the owner (carried as kOwnerPayload, common/slot.h).
    absl::Status CheckOwned() const;

   private:
    absl::Mutex* const mu_;
    const SlotMap* map_ = nullptr;  // set under the lock
    const std::string& replica_id_;
    const absl::string_view name_;
    const int slot_;  // -1 without a name
  };

  // A write's admission: a ReadAdmission of `name`, then the name's slot gate held
  // shared, from the call's checks to its last journal append (SetSlotState waits
  // for it). Destroyed in the reverse order.
  class WriteAdmission {
   public:
    WriteAdmission(const SlotOwnership& ownership, absl::string_view name);
    WriteAdmission(const WriteAdmission&) = delete;
    WriteAdmission& operator=(const WriteAdmission&) = delete;
    ~WriteAdmission();

    const ReadAdmission& read() const { return read_; }
    int slot() const { return read_.slot(); }
    bool OwnsSlot() const { return read_.OwnsSlot(); }
    absl::Status CheckOwned() const { return read_.CheckOwned(); }
    // The slot's move state, fixed for the admission's life.
    SlotMoveState state() const { return state_; }
    // CheckOwned, then UNAVAILABLE if the slot is migrating ("slot S is moving to
    // rX; retry").
    absl::Status CheckWritable() const;

   private:
    const ReadAdmission read_;  // first: the map before the gate
    absl::Mutex* const gate_mu_;
    const SlotMoveState state_;
    const std::string* const peer_;  // the gate's, unchanged while it is held
  };

 private:
  // One slot's move state, and the lock every write to the slot holds shared.
  struct SlotGate {
    mutable absl::Mutex mu;
    SlotMoveState state ABSL_GUARDED_BY(mu) = SlotMoveState::kStable;
    std::string peer ABSL_GUARDED_BY(mu);
  };
  // Each slot's state and peer, and their maximal non-stable runs.
  using SlotStates = std::array<std::pair<SlotMoveState, std::string>, kSlotCount>;
  static std::vector<SlotMove> Runs(const SlotStates& moves);
  absl::Status LoadMoves() ABSL_LOCKS_EXCLUDED(moves_mu_);
  // The checks of SetSlotState against the map and the current states.
  absl::Status CheckMove(int low, int high, SlotMoveState state, absl::string_view peer) const
      ABSL_SHARED_LOCKS_REQUIRED(map_mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(moves_mu_);

  const std::string replica_id_;
  // Where the map and the moves persist; null and "" until PersistIn (memory only).
  Env* env_ = nullptr;
  std::string dir_;
  // Serializes SetSlotMap (epoch check, persistence, swap).
  absl::Mutex set_map_mu_ ABSL_ACQUIRED_BEFORE(map_mu_);
  // Held shared by every admission for its whole length, exclusively by SetSlotMap
  // to swap the map: a call sees one map, and a swap waits for the calls admitted
  // under the former one.
  mutable absl::Mutex map_mu_ ABSL_ACQUIRED_AFTER(set_map_mu_, moves_mu_);
  std::shared_ptr<const SlotMap> slot_map_ ABSL_GUARDED_BY(map_mu_);
  std::array<SlotGate, kSlotCount> gates_;
  // Serializes SetSlotState and its file.
  mutable absl::Mutex moves_mu_ ABSL_ACQUIRED_BEFORE(map_mu_);
  // The gates' states, for SlotMoves and the file.
  SlotStates moves_ ABSL_GUARDED_BY(moves_mu_);
};

}  // namespace qparams

#endif  // QPARAMS_DOMAIN_SLOT_OWNERSHIP_H_
