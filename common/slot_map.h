// Which replica owns each of the kSlotCount slots (common/slot.h), read from the one
// file every replica and HAProxy read. Its lines are HAProxy's map_int syntax, so
// that `map_int(FILE)` routes with the very file the replicas check ownership with:
//
//   # slots   replica
//   0:84      qparams-0
//   85:169    qparams-1
//   170:255   qparams-2
//
// "LOW:HIGH REPLICA" (inclusive) or "SLOT REPLICA"; '#' starts a comment; blank lines
// are skipped. Every slot has exactly one owner.
//
// A map has an epoch, Redis Cluster's config epoch: the whole-line comment
// "# epoch N" (N >= 0; absent: 0), which HAProxy skips as any comment. A replica
// takes a new map only with a greater epoch (domain/engine.h, Engine::SetSlotMap), so
// an older file or a late push cannot undo a move.

#ifndef QPARAMS_COMMON_SLOT_MAP_H_
#define QPARAMS_COMMON_SLOT_MAP_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/slot.h"

namespace qparams {

// Immutable once built; thread-safe.
class SlotMap {
 public:
  // A maximal run of slots one replica owns.
  struct Range {
    int low = 0;
    int high = 0;  // inclusive
    std::string replica;
  };

  // INVALID_ARGUMENT naming the line and the rule: not two fields, a slot that is
  // not an integer in [0, kSlotCount), LOW above HIGH, a replica name other than
  // [a-zA-Z0-9._-]{1,64}, a slot two lines give, a comment starting with the word
  // "epoch" that is not "# epoch N" with N a non-negative integer, a second epoch
  // line; or naming the first slot no line gives.
  static absl::StatusOr<SlotMap> Parse(absl::string_view text);

  // The map whose slots `ranges` give (e.g. a GetTopology answer's), under the
  // same rules as Parse(): INVALID_ARGUMENT naming the range and the rule, or a
  // negative epoch.
  static absl::StatusOr<SlotMap> FromRanges(const std::vector<Range>& ranges,
                                            int64_t epoch = 0);

  // Parse() of the file's content; the file's errors name the path.
  static absl::StatusOr<SlotMap> Load(const std::string& path);

  // The replica that owns `slot` (in [0, kSlotCount)).
  const std::string& OwnerOf(int slot) const { return replicas_[owners_[slot]]; }
  // The replica that owns the session `name`.
  const std::string& OwnerOfSession(absl::string_view name) const { return OwnerOf(SlotOf(name)); }
  // Whether `name` is a valid replica name: 1 to 64 characters of [a-zA-Z0-9._-].
  static bool ValidReplicaName(absl::string_view name);

  // Whether `replica` owns any slot.
  bool HasReplica(absl::string_view replica) const;

  // The replicas, sorted, each once.
  const std::vector<std::string>& replicas() const { return replicas_; }
  // The slots in order, as maximal runs.
  std::vector<Range> Ranges() const;
  // How many slots `replica` owns (0 for one the map does not name).
  int SlotsOf(absl::string_view replica) const;

  // The map's version (the "# epoch N" line; 0 without one).
  int64_t epoch() const { return epoch_; }
  // This map under another epoch (>= 0).
  SlotMap WithEpoch(int64_t epoch) const;

  // The map as a file Parse() reads back equal and HAProxy reads as map_int: the
  // epoch line, a header comment, then "LOW:HIGH REPLICA" per range.
  std::string ToText() const;

  // The slots whose owner differs in `other`, as maximal runs named by this map's
  // owner ("LOW:HIGH A->B" pieces for logs come from Describe).
  std::vector<Range> ChangedFrom(const SlotMap& other) const;
  // "12:40 r0->r3, 90:90 r1->r3", or "no slot changes owner": what moving from
  // `before` to `after` changes, for logs.
  static std::string DescribeChange(const SlotMap& before, const SlotMap& after);

  // Same epoch and same owner for every slot.
  bool operator==(const SlotMap& other) const {
    return epoch_ == other.epoch_ && SameOwners(other);
  }
  bool operator!=(const SlotMap& other) const { return !(*this == other); }
  // Same owner for every slot, whatever the epochs.
  bool SameOwners(const SlotMap& other) const;

 private:
  SlotMap() = default;

  // Gives slots [low, high] to `replica` in `owner` ("" = no owner yet); the rule
  // broken, or "" if none.
  static std::string Assign(std::array<std::string, kSlotCount>& owner, int low, int high,
                            absl::string_view replica);
  // The map of `owner`, which must give every slot; INVALID_ARGUMENT naming the
  // first slot it does not.
  static absl::StatusOr<SlotMap> Build(const std::array<std::string, kSlotCount>& owner);

  std::vector<std::string> replicas_;
  std::array<int, kSlotCount> owners_{};  // indexes into replicas_
  int64_t epoch_ = 0;
};

}  // namespace qparams

#endif  // QPARAMS_COMMON_SLOT_MAP_H_
