#include "core/step_merge.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/observation.h"
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
    // A retry, unless the step was closed without this rank.
    for (const IncompleteStep& closed : incomplete_) {
      if (closed.step == c.step &&
          (closed.world_size == 0 ||
           std::binary_search(closed.missing_ranks.begin(), closed.missing_ranks.end(), c.rank))) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step ", c.step, " was closed without rank ", c.rank,
            " (its step timeout expired); contribute to step ", last_applied_ + 1, " or later"));
      }
    }
    return Outcome{/*duplicate=*/true, last_applied_};
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
  if (c.range.has_value() && !pending.merged.has_value()) {
    // Alike the ranges of the other open steps too: one of another dtype or N would
    // be refused only once its step applies, and hold back every step after it.
    for (const auto& [other_step, other] : pending_) {
      if (!other.merged.has_value()) continue;
      if (absl::Status alike = MergeBlockRanges(other.merged->range, c.range->range).status();
          !alike.ok()) {
        if (fresh) pending_.erase(it);
        return absl::FailedPreconditionError(absl::StrCat(
            "range of step ", c.step, ": ", alike.message(), " (those of step ", other_step,
            "; every step of a session has the session's dtype and shape)"));
      }
      break;
    }
  }
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

struct StepMerge::SavedStep::Entry {
  StepMerge::Pending pending;
};

bool StepMerge::MayApply(const StepContribution& c) const {
  if (c.step != last_applied_ + 1) return false;  // later steps wait for this one
  auto it = pending_.find(c.step);
  return it == pending_.end() ? c.world_size <= 1 : it->second.count + 1 >= it->second.world_size;
}

StepMerge::SavedStep StepMerge::Save(int64_t step) const {
  SavedStep saved;
  saved.step = step;
  if (auto it = pending_.find(step); it != pending_.end()) {
    saved.entry = std::make_shared<const SavedStep::Entry>(SavedStep::Entry{it->second});
  }
  return saved;
}

void StepMerge::Restore(const SavedStep& saved) {
  if (saved.entry == nullptr) {
    pending_.erase(saved.step);
  } else {
    pending_[saved.step] = saved.entry->pending;
  }
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
  applied_.push_back(Applied{step, std::move(qparams)});
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

StepState StepMerge::ExportState() const {
  StepState state;
  state.last_applied = last_applied_;
  for (const auto& [step, pending] : pending_) {
    state.pending.push_back({step, pending.world_size, pending.contributed, pending.merged});
  }
  state.applied.assign(applied_.begin(), applied_.end());
  state.incomplete.assign(incomplete_.begin(), incomplete_.end());
  return state;
}

absl::StatusOr<StepMerge> StepMerge::FromState(StepState state) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("steps: ", parts...));
  };
  StepMerge merge;
  if (state.last_applied < -1) return invalid("last_applied is ", state.last_applied);
  merge.last_applied_ = state.last_applied;
  if (state.applied.size() > kKeptSteps) {
    return invalid(state.applied.size(), " applied steps kept; at most ", kKeptSteps);
  }
  for (size_t i = 0; i < state.applied.size(); ++i) {
    const int64_t expected =
        state.last_applied - static_cast<int64_t>(state.applied.size() - 1 - i);
    if (state.applied[i].step != expected) {
      return invalid("applied step ", state.applied[i].step, " where ", expected,
                     " belongs (the kept steps end at last_applied, one by one)");
    }
  }
  merge.applied_.assign(state.applied.begin(), state.applied.end());
  int64_t previous = state.last_applied;
  for (StepState::Pending& p : state.pending) {
    if (p.step <= previous || p.step > state.last_applied + kMaxStepsAhead) {
      return invalid("pending step ", p.step, " is out of order or beyond the window");
    }
    previous = p.step;
    if (p.world_size < 1 || p.world_size > kMaxWorldSize ||
        static_cast<int32_t>(p.contributed.size()) != p.world_size) {
      return invalid("pending step ", p.step, ": world_size ", p.world_size, " and ",
                     p.contributed.size(), " ranks");
    }
    Pending pending{p.world_size, std::move(p.contributed), 0, std::move(p.merged)};
    for (bool contributed : pending.contributed) pending.count += contributed ? 1 : 0;
    if (pending.count == 0) return invalid("pending step ", p.step, " has no contribution");
    if (pending.merged.has_value()) {
      // Checked as a range observation is: alike, whole, finite, min <= max.
      const BlockRange& r = pending.merged->range;
      absl::StatusOr<TensorView> min =
          TensorView::Create(r.min.dtype, r.min.shape, r.min.data.view());
      absl::StatusOr<TensorView> max =
          TensorView::Create(r.max.dtype, r.max.shape, r.max.data.view());
      if (!min.ok() || !max.ok()) {
        return invalid("pending step ", p.step, ": its range is not whole");
      }
      Shape ones(r.min.shape.size(), 1);
      absl::Status checked = Observation::FromRange(r.min.shape, *min, *max).Range(ones).status();
      if (!checked.ok()) return invalid("pending step ", p.step, ": ", checked.message());
    }
    merge.pending_.emplace(p.step, std::move(pending));
  }
  if (state.incomplete.size() > kKeptIncomplete) {
    return invalid(state.incomplete.size(), " incomplete steps; at most ", kKeptIncomplete);
  }
  merge.incomplete_.assign(state.incomplete.begin(), state.incomplete.end());
  return merge;
}

}  // namespace qparams
