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

#ifndef QPARAMS_COMMON_SLOT_MAP_H_
#define QPARAMS_COMMON_SLOT_MAP_H_

#include <array>
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
  // [a-zA-Z0-9._-]{1,64}, a slot two lines give; or naming the first slot no line
  // gives.
  static absl::StatusOr<SlotMap> Parse(absl::string_view text);

  // The map whose slots `ranges` give (e.g. a GetTopology answer's), under the
  // same rules as Parse(): INVALID_ARGUMENT naming the range and the rule.
  static absl::StatusOr<SlotMap> FromRanges(const std::vector<Range>& ranges);

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
};

}  // namespace qparams

#endif  // QPARAMS_COMMON_SLOT_MAP_H_
