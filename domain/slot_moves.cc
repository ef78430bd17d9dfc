#include "domain/slot_moves.h"

#include <array>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/slot.h"
#include "common/slot_map.h"

namespace qparams {
namespace {

std::optional<int> ParseSlot(absl::string_view text) {
  int slot = 0;
  if (!absl::SimpleAtoi(text, &slot) || slot < 0 || slot >= kSlotCount) return std::nullopt;
  return slot;
}

}  // namespace

absl::string_view SlotMoveStateName(SlotMoveState state) {
  switch (state) {
    case SlotMoveState::kMigrating:
      return "migrating";
    case SlotMoveState::kImporting:
      return "importing";
    case SlotMoveState::kStable:
      break;
  }
  return "stable";
}

std::string RenderSlotMoves(const std::vector<SlotMove>& moves) {
  std::string text = "# state   slots   peer (qparams slot moves; see docs/sharding.md)\n";
  for (const SlotMove& move : moves) {
    if (move.state == SlotMoveState::kStable) continue;
    absl::StrAppend(&text, SlotMoveStateName(move.state), " ", move.low, ":", move.high, " ",
                    move.peer, "\n");
  }
  return text;
}

absl::StatusOr<std::vector<SlotMove>> ParseSlotMoves(absl::string_view text) {
  std::vector<SlotMove> moves;
  std::array<bool, kSlotCount> given{};
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    auto refuse = [&](absl::string_view rule) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot moves, line ", number, " \"", line, "\": ", rule));
    };
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 3) return refuse("expected \"STATE LOW:HIGH PEER\"");
    SlotMove move;
    if (fields[0] == "migrating") {
      move.state = SlotMoveState::kMigrating;
    } else if (fields[0] == "importing") {
      move.state = SlotMoveState::kImporting;
    } else {
      return refuse("the state is migrating or importing");
    }
    const std::vector<absl::string_view> bounds = absl::StrSplit(fields[1], ':');
    std::optional<int> low = ParseSlot(bounds[0]);
    std::optional<int> high = bounds.size() == 2 ? ParseSlot(bounds[1]) : std::nullopt;
    if (bounds.size() != 2 || !low || !high || *low > *high) {
      return refuse(absl::StrCat("slots are LOW:HIGH with 0 <= LOW <= HIGH < ", kSlotCount));
    }
    if (!SlotMap::ValidReplicaName(fields[2])) {
      return refuse("a replica name is 1 to 64 characters of [a-zA-Z0-9._-]");
    }
    for (int slot = *low; slot <= *high; ++slot) {
      if (given[slot]) return refuse(absl::StrCat("slot ", slot, " is given twice"));
      given[slot] = true;
    }
    move.low = *low;
    move.high = *high;
    move.peer = std::string(fields[2]);
    moves.push_back(std::move(move));
  }
  return moves;
}

}  // namespace qparams
