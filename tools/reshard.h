// The online move of a slot range from one replica to another (docs/sharding.md,
// "Moving slots online"; Redis Cluster's live resharding), driven from a client:
//
//   1. the target marks the slots IMPORTING from the source;
//   2. the source marks them MIGRATING to the target: once every write in flight
//      on them has finished, it refuses their writes (UNAVAILABLE, "slot S is moving
//      to rX; retry"), so their state is frozen; reads are still served;
//   3. the target drops any copy it holds of the slots (a copy left by an earlier
//      move), then the source's records stream into it (ReadSlotRecords ->
//      ImportSessions), each journaled on the target before the next is read;
//   4. the switch: the new slot map (the slots given to the target) is put in force
//      on the target first, then the source, the other replicas and the balancer
//      (ReshardOptions::switch_map);
//   5. the target clears IMPORTING and serves the slots; the source clears MIGRATING
//      and drops its copies.
//
// The states are persisted in each replica's data directory, so a crash of either
// replica, or of the command, at any step leaves a state that kResume continues
// (repeating the copy is harmless: an import replaces what it imported before) and
// that kAbort rolls back before the switch (the target drops what it imported, both
// clear their states). At every step one replica at most accepts writes for a slot:
// the source until step 2, nobody from 2 until the target owns the slots in 4, the
// target after.

#ifndef QPARAMS_TOOLS_RESHARD_H_
#define QPARAMS_TOOLS_RESHARD_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "qparams/client.h"

namespace qparams {

struct ReshardPlan {
  int low = 0;
  int high = 0;  // inclusive
  std::string source;
  std::string target;
};

enum class ReshardMode {
  kStart,   // a new move; FAILED_PRECONDITION if one is under way on the slots
  kResume,  // continue the move the replicas' states show
  kAbort,   // roll it back; FAILED_PRECONDITION once the target owns the slots
};

struct ReshardOptions {
  // Puts `map_text` (the slot map after the move, in the map file's syntax) in force:
  // on the target first, then the source, then the other replicas and the balancer.
  // Null: the operator does it (e.g. the replicas restarted on the new map file) and
  // runs the move again with kResume, which finishes it.
  std::function<absl::Status(const std::string& map_text)> switch_map;
  // One line per step taken ("r0: slots 10:20 migrating to r1"); null: silent.
  std::function<void(absl::string_view line)> log;
};

struct ReshardResult {
  enum class Outcome {
    kDone,           // the target owns the slots, both replicas are stable
    kAwaitingSwitch, // copied and frozen: put next_map in force, then kResume
    kAborted,        // rolled back: the source owns and serves the slots
  };
  Outcome outcome = Outcome::kDone;
  int64_t sessions_copied = 0;
  int64_t groups_copied = 0;
  int64_t sessions_dropped = 0;  // by the source at the end, or the target on abort
  absl::Duration copy_time;      // step 3
  absl::Duration frozen_time;    // from MIGRATING to the end of the switch (or of the copy)
  std::string next_map;          // the slot map after the move
};

// Runs `plan` in `mode` through `source` and `target` (clients that reach those
// replicas: one client of the balancer twice, or one per replica; every call is
// addressed to its replica by name). INVALID_ARGUMENT for a bad plan;
// FAILED_PRECONDITION when the replicas' maps and states do not allow the mode
// (naming what they show); a call's error, naming the replica and the step, after
// which the states are as the step left them: kResume or kAbort again.
absl::StatusOr<ReshardResult> Reshard(Client& source, Client& target, const ReshardPlan& plan,
                                      ReshardMode mode, const ReshardOptions& options = {});

}  // namespace qparams

#endif  // QPARAMS_TOOLS_RESHARD_H_
