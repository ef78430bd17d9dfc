#include "domain/step_merge.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/range.h"
#include "core/status_macros.h"

namespace qparams {

absl::StatusOr<StepMerge::Outcome> StepMerge::Contribute(StepContribution c, Apply apply) {
  if (c.world_size < 1 || c.world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size is ", c.world_size, "; it must be 1 to ", kMaxWorldSize));
  }
  if (c.rank < 0 || c.rank >= c.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank is ", c.rank, "; it must be in [0, world_size ", c.world_size, ")"));
  }
  if (c.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step is ", c.step, "; it must be >= 0"));
  }
  if (c.step <= last_applied_) {
    for (const Applied& applied : applied_) {
      if (applied.step != c.step) continue;
      if (c.rank < static_cast<int32_t>(applied.contributed.size()) &&
          applied.contributed[c.rank]) {
        return Outcome{/*duplicate=*/true, last_applied_};
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", c.step, " was closed without rank ", c.rank,
          " (its step timeout expired); contribute to step ", last_applied_ + 1, " or later"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("step ", c.step, " was applied and is older than the last ", kKeptSteps,
                     " steps kept (the last applied is ", last_applied_, ")"));
  }
  if (c.step > last_applied_ + kMaxStepsAhead) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", c.step, " is more than ", kMaxStepsAhead,
                     " steps ahead of the last applied step ", last_applied_));
  }
  auto [it, fresh] = pending_.try_emplace(c.step);
  Pending& pending = it->second;
  if (fresh) {
    pending.world_size = c.world_size;
    pending.contributed.assign(c.world_size, false);
  } else if (pending.world_size != c.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "world_size is ", c.world_size, " but step ", c.step, " was declared with world_size ",
        pending.world_size, " by its first contribution; a world size changes between steps"));
  }
  if (pending.contributed[c.rank]) return Outcome{/*duplicate=*/true, last_applied_};
  if (c.range.has_value()) {
    if (!pending.merged.has_value()) {
      pending.merged = std::move(c.range);
    } else {
      absl::StatusOr<BlockRange> merged = MergeBlockRanges(pending.merged->range, c.range->range);
      if (!merged.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat("range of step ", c.step, ": ", merged.status().message(),
                         " (every rank's range of a step has the session's dtype and shape)"));
      }
      pending.merged->range = *std::move(merged);
    }
  }
  pending.contributed[c.rank] = true;
  ++pending.count;
  QPARAMS_RETURN_IF_ERROR(ApplyComplete(apply));
  return Outcome{/*duplicate=*/false, last_applied_};
}

absl::Status StepMerge::Close(int64_t step, Apply apply) {
  while (last_applied_ < step) {
    auto it = pending_.find(last_applied_ + 1);
    Pending* pending = it == pending_.end() ? nullptr : &it->second;
    IncompleteStep closed{last_applied_ + 1, pending == nullptr ? 0 : pending->world_size, {}};
    if (pending != nullptr) {
      for (int32_t r = 0; r < pending->world_size; ++r) {
        if (!pending->contributed[r]) closed.missing_ranks.push_back(r);
      }
    }
    if (pending == nullptr || !closed.missing_ranks.empty()) {
      incomplete_.push_back(std::move(closed));
      if (incomplete_.size() > kKeptIncomplete) incomplete_.pop_front();
    }
    QPARAMS_RETURN_IF_ERROR(ApplyNext(pending, apply));
    if (it != pending_.end()) pending_.erase(it);
  }
  return ApplyComplete(apply);
}

absl::Status StepMerge::ApplyComplete(Apply apply) {
  for (auto it = pending_.find(last_applied_ + 1);
       it != pending_.end() && it->second.count == it->second.world_size;
       it = pending_.find(last_applied_ + 1)) {
    QPARAMS_RETURN_IF_ERROR(ApplyNext(&it->second, apply));
    pending_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status StepMerge::ApplyNext(Pending* pending, Apply apply) {
  const int64_t step = last_applied_ + 1;
  QPARAMS_ASSIGN_OR_RETURN(QParams qparams,
                           apply(step, pending == nullptr ? std::nullopt : pending->merged));
  applied_.push_back(Applied{step, pending == nullptr ? std::vector<bool>() : pending->contributed,
                             std::move(qparams)});
  if (applied_.size() > kKeptSteps) applied_.pop_front();
  last_applied_ = step;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<QParams>> StepMerge::AsOf(int64_t step) const {
  if (step > last_applied_) return std::nullopt;
  for (const Applied& applied : applied_) {
    if (applied.step == step) return std::optional<QParams>(applied.qparams);
  }
  return absl::FailedPreconditionError(absl::StrCat("step ", step, " is older than the last ",
                                                    kKeptSteps, " steps kept (the last applied is ",
                                                    last_applied_, ")"));
}

std::optional<QParams> StepMerge::latest() const {
  if (applied_.empty()) return std::nullopt;
  return applied_.back().qparams;
}

std::vector<int64_t> StepMerge::pending_steps() const {
  std::vector<int64_t> steps;
  for (const auto& [step, pending] : pending_) steps.push_back(step);
  return steps;
}

}  // namespace qparams
