#include "common/slot_map.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file.h"

namespace qparams {
namespace {

bool ReplicaChar(char c) { return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-'; }

std::optional<int> ParseSlot(absl::string_view text) {
  int slot = 0;
  if (!absl::SimpleAtoi(text, &slot) || slot < 0 || slot >= kSlotCount) return std::nullopt;
  if (!absl::ascii_isdigit(text.front())) return std::nullopt;  // no sign, no space
  return slot;
}

}  // namespace

absl::StatusOr<SlotMap> SlotMap::Parse(absl::string_view text) {
  std::array<std::string, kSlotCount> owner;  // "" = not given yet
  std::optional<int64_t> epoch;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    auto refuse = [&](absl::string_view rule) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slot map line ", line_number, " \"", absl::StripAsciiWhitespace(line), "\": ", rule));
    };
    if (absl::string_view comment = absl::StripLeadingAsciiWhitespace(line);
        absl::ConsumePrefix(&comment, "#")) {
      const std::vector<absl::string_view> words =
          absl::StrSplit(comment, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
      if (words.empty() || words[0] != "epoch") continue;
      int64_t n = 0;
      if (words.size() != 2 || !absl::ascii_isdigit(words[1].front()) ||
          !absl::SimpleAtoi(words[1], &n)) {
        return refuse("an epoch line is \"# epoch N\" with N a non-negative integer");
      }
      if (epoch.has_value()) return refuse(absl::StrCat("a second epoch line (epoch ", *epoch,
                                                        " was given before)"));
      epoch = n;
      continue;
    }
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    if (fields.size() != 2) return refuse("expected \"LOW:HIGH REPLICA\" or \"SLOT REPLICA\"");
    const std::vector<absl::string_view> bounds = absl::StrSplit(fields[0], ':');
    if (bounds.size() > 2) return refuse("a slot range is LOW:HIGH");
    const std::optional<int> low = ParseSlot(bounds[0]);
    const std::optional<int> high = ParseSlot(bounds.back());
    if (!low || !high) {
      return refuse(absl::StrCat("slots are integers from 0 to ", kSlotCount - 1));
    }
    if (const std::string rule = Assign(owner, *low, *high, fields[1]); !rule.empty()) {
      return refuse(rule);
    }
  }
  absl::StatusOr<SlotMap> map = Build(owner);
  if (map.ok()) map->epoch_ = epoch.value_or(0);
  return map;
}

absl::StatusOr<SlotMap> SlotMap::FromRanges(const std::vector<Range>& ranges, int64_t epoch) {
  if (epoch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot map epoch ", epoch, ": an epoch is a non-negative integer"));
  }
  std::array<std::string, kSlotCount> owner;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Range& range = ranges[i];
    auto refuse = [&](absl::string_view rule) {
      return absl::InvalidArgumentError(absl::StrCat("slot range ", i, " (", range.low, ":",
                                                     range.high, " ", range.replica, "): ", rule));
    };
    if (range.low < 0 || range.high >= kSlotCount) {
      return refuse(absl::StrCat("slots are integers from 0 to ", kSlotCount - 1));
    }
    if (const std::string rule = Assign(owner, range.low, range.high, range.replica);
        !rule.empty()) {
      return refuse(rule);
    }
  }
  absl::StatusOr<SlotMap> map = Build(owner);
  if (map.ok()) map->epoch_ = epoch;
  return map;
}

std::string SlotMap::Assign(std::array<std::string, kSlotCount>& owner, int low, int high,
                            absl::string_view replica) {
  if (low > high) return "LOW is above HIGH";
  if (!ValidReplicaName(replica)) return "a replica name is 1 to 64 characters of [a-zA-Z0-9._-]";
  for (int slot = low; slot <= high; ++slot) {
    if (!owner[slot].empty()) return absl::StrCat("slot ", slot, " is already ", owner[slot], "'s");
    owner[slot] = std::string(replica);
  }
  return "";
}

absl::StatusOr<SlotMap> SlotMap::Build(const std::array<std::string, kSlotCount>& owner) {
  SlotMap map;
  for (int slot = 0; slot < kSlotCount; ++slot) {
    if (owner[slot].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("slot map: no line gives slot ", slot,
                                                     "; every slot from 0 to ", kSlotCount - 1,
                                                     " needs an owner"));
    }
    map.replicas_.push_back(owner[slot]);
  }
  std::sort(map.replicas_.begin(), map.replicas_.end());
  map.replicas_.erase(std::unique(map.replicas_.begin(), map.replicas_.end()), map.replicas_.end());
  for (int slot = 0; slot < kSlotCount; ++slot) {
    map.owners_[slot] =
        static_cast<int>(std::lower_bound(map.replicas_.begin(), map.replicas_.end(), owner[slot]) -
                         map.replicas_.begin());
  }
  return map;
}

absl::StatusOr<SlotMap> SlotMap::Load(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<SlotMap> map = Parse(*text);
  if (!map.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", map.status().message()));
  }
  return map;
}

bool SlotMap::ValidReplicaName(absl::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), ReplicaChar);
}

bool SlotMap::HasReplica(absl::string_view replica) const {
  return std::binary_search(replicas_.begin(), replicas_.end(), replica);
}

int SlotMap::SlotsOf(absl::string_view replica) const {
  int n = 0;
  for (int slot = 0; slot < kSlotCount; ++slot) n += OwnerOf(slot) == replica ? 1 : 0;
  return n;
}

SlotMap SlotMap::WithEpoch(int64_t epoch) const {
  SlotMap map = *this;
  map.epoch_ = epoch;
  return map;
}

std::string SlotMap::ToText() const {
  std::string text = absl::StrCat("# epoch ", epoch_, "\n# slots   replica\n");
  for (const Range& range : Ranges()) {
    const std::string slots = absl::StrCat(range.low, ":", range.high);
    absl::StrAppend(&text, slots, std::string(std::max<size_t>(10 - slots.size(), 1), ' '),
                    range.replica, "\n");
  }
  return text;
}

bool SlotMap::SameOwners(const SlotMap& other) const {
  for (int slot = 0; slot < kSlotCount; ++slot) {
    if (OwnerOf(slot) != other.OwnerOf(slot)) return false;
  }
  return true;
}

std::vector<SlotMap::Range> SlotMap::ChangedFrom(const SlotMap& other) const {
  std::vector<Range> changed;
  for (int slot = 0; slot < kSlotCount; ++slot) {
    if (OwnerOf(slot) == other.OwnerOf(slot)) continue;
    if (!changed.empty() && changed.back().high == slot - 1 &&
        changed.back().replica == OwnerOf(slot) &&
        other.OwnerOf(changed.back().low) == other.OwnerOf(slot)) {
      changed.back().high = slot;
    } else {
      changed.push_back({slot, slot, OwnerOf(slot)});
    }
  }
  return changed;
}

std::string SlotMap::DescribeChange(const SlotMap& before, const SlotMap& after) {
  std::vector<std::string> pieces;
  for (const Range& range : after.ChangedFrom(before)) {
    pieces.push_back(absl::StrCat(range.low, ":", range.high, " ", before.OwnerOf(range.low),
                                  "->", range.replica));
  }
  if (pieces.empty()) return "no slot changes owner";
  return absl::StrJoin(pieces, ", ");
}

std::vector<SlotMap::Range> SlotMap::Ranges() const {
  std::vector<Range> ranges;
  for (int slot = 0; slot < kSlotCount; ++slot) {
    if (!ranges.empty() && ranges.back().replica == OwnerOf(slot)) {
      ranges.back().high = slot;
    } else {
      ranges.push_back({slot, slot, OwnerOf(slot)});
    }
  }
  return ranges;
}

}  // namespace qparams
