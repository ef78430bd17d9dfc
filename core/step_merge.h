// The steps of one step-merged session (shared/docs/qat.md, docs/qat.md): each of W
// ranks contributes its range of step t (or nothing), the step's ranges are merged
// exactly, and the calculator is applied once per step, in step order, so that the
// state after step t is what one process computes on the concatenation of all the
// ranks' step-t inputs, whatever the arrival order.
//
// StepMerge holds the bookkeeping only: the steps not applied yet and their merged
// ranges, which ranks contributed, the qparams after each recent step, the steps
// closed incomplete. The caller holds the calculator and applies a step through the
// Apply callback; it also owns the clock (Close, for a step that timed out). A value
// type: a caller that must not change anything on a failure works on a copy. Pure:
// no clock, no I/O, no locks; its whole state exports as a StepState for a record.
//
// Thread safety: none; the session's lock guards it.

#ifndef QPARAMS_CORE_STEP_MERGE_H_
#define QPARAMS_CORE_STEP_MERGE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/qparams.h"
#include "core/qparams_calculator.h"
#include "core/range.h"

namespace qparams {

using ReducedRange = StatefulQParamsCalculatorBase::ReducedRange;

// One rank's contribution to one step.
struct StepContribution {
  int64_t step = 0;
  int32_t rank = 0;
  int32_t world_size = 1;
  std::optional<ReducedRange> range;  // unset: "nothing" (the rank skipped the module)
};

// A step closed by its timeout before every rank contributed.
struct IncompleteStep {
  int64_t step = 0;
  int32_t world_size = 0;
  std::vector<int32_t> missing_ranks;  // ascending
};

// Everything a StepMerge holds, as plain values (for a session's record).
struct StepState {
  struct Pending {
    int64_t step = 0;
    int32_t world_size = 0;
    std::vector<bool> contributed;  // by rank, world_size of them
    std::optional<ReducedRange> merged;
  };
  struct Applied {
    int64_t step = 0;
    QParams qparams;  // after the step
  };
  int64_t last_applied = -1;
  std::vector<Pending> pending;            // ascending steps, all after last_applied
  std::vector<Applied> applied;            // ascending, the last of them last_applied
  std::vector<IncompleteStep> incomplete;  // ascending steps
};

class StepMerge {
 public:
  // How far ahead of the last applied step a contribution may be.
  static constexpr int64_t kMaxStepsAhead = 1024;
  // How many applied steps stay readable (AsOf).
  static constexpr int kKeptSteps = 8;
  // How many incomplete steps are remembered (the most recent).
  static constexpr int kKeptIncomplete = 64;
  static constexpr int32_t kMaxWorldSize = 65536;

  // Applies one step: `range` is the step's merged range (unset: no rank carried
  // one, and the state must not change). Returns the qparams after the step; an
  // error stops the applying (the caller then drops its copy).
  using Apply = absl::FunctionRef<absl::StatusOr<QParams>(
      int64_t step, const std::optional<ReducedRange>& range)>;

  struct Outcome {
    bool duplicate = false;  // (step, rank) had contributed: nothing was added
    int64_t last_applied = -1;
  };

  // Adds `c` and applies every step that is then complete, in order. A repeated
  // (step, rank) is a retry: Outcome::duplicate, nothing added, whatever it carries.
  // INVALID_ARGUMENT for a rank outside [0, world_size), a world size outside
  // [1, kMaxWorldSize], a negative step; FAILED_PRECONDITION for a step more than
  // kMaxStepsAhead ahead of the last applied one, a world size other than the one
  // the step's first contribution declared, a range of another dtype or block count
  // than the step's others, a step already applied that was closed without the rank
  // (of the last kKeptIncomplete closed incomplete): each checked before anything
  // changes, so such a refusal changes nothing. Apply's error as it is (the steps
  // applied before it stay applied: a caller that must not change then works on a
  // copy).
  absl::StatusOr<Outcome> Contribute(StepContribution c, Apply apply);

  // Whether contributing `c` may apply a step (it may complete the step after the
  // last applied one). One that may not changes only its own step's open entry, so
  // a caller can add it in place and take it back with Restore(Save(c.step)) rather
  // than work on a copy of the whole merge (W - 1 of every W contributions).
  bool MayApply(const StepContribution& c) const;
  // Step `step`'s open entry as it is now (none if it is not open), for Restore.
  class SavedStep {
   private:
    friend class StepMerge;
    struct Entry;
    int64_t step = 0;
    std::shared_ptr<const Entry> entry;  // null: the step was not open
  };
  SavedStep Save(int64_t step) const;
  // Puts the saved entry back (removes the step's entry if it was not open). Valid
  // only while no step has been applied since Save.
  void Restore(const SavedStep& saved);

  // Closes every step up to `step` that is not applied yet with what it has (the
  // timeout: IncompleteStep records the missing ranks; a step nobody contributed to
  // misses them all) and applies them in order, then any complete steps after.
  absl::Status Close(int64_t step, Apply apply);

  // The qparams after step `step`: unset if it is not applied yet;
  // FAILED_PRECONDITION if it is older than the kept steps.
  absl::StatusOr<std::optional<QParams>> AsOf(int64_t step) const;

  int64_t last_applied() const { return last_applied_; }
  // The qparams after the last applied step (unset before the first).
  std::optional<QParams> latest() const;
  // The step with a contribution not applied yet, lowest first.
  std::vector<int64_t> pending_steps() const;
  std::optional<int64_t> first_pending() const {
    return pending_.empty() ? std::nullopt : std::optional<int64_t>(pending_.begin()->first);
  }
  const std::deque<IncompleteStep>& incomplete() const { return incomplete_; }
  bool started() const { return last_applied_ >= 0 || !pending_.empty(); }

  StepState ExportState() const;
  // A merge that continues `state` bit-identically; INVALID_ARGUMENT naming what is
  // inconsistent (steps out of order, a rank map of another size than its world,
  // more kept steps than kept here, merged ranges that are not alike).
  static absl::StatusOr<StepMerge> FromState(StepState state);

 private:
  struct Pending {
    int32_t world_size = 0;
    std::vector<bool> contributed;  // by rank
    int32_t count = 0;
    std::optional<ReducedRange> merged;
  };
  using Applied = StepState::Applied;

  // Applies step last_applied_ + 1 from `pending` (or with nothing, if null).
  absl::Status ApplyNext(Pending* pending, Apply apply);
  // Applies the complete steps that follow the last applied one.
  absl::Status ApplyComplete(Apply apply);

  int64_t last_applied_ = -1;
  std::map<int64_t, Pending> pending_;
  std::deque<Applied> applied_;  // the last kKeptSteps, oldest first
  std::deque<IncompleteStep> incomplete_;
};

}  // namespace qparams

#endif  // QPARAMS_CORE_STEP_MERGE_H_
