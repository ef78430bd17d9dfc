// Engine's step-merged sessions (shared/docs/qat.md): contributions under the same
// gates as observations, reads that wait for a step, and the step timeouts.

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/slot.h"
#include "core/status_macros.h"
#include "domain/engine.h"

namespace qparams {

absl::StatusOr<StepMerge::Outcome> Engine::Contribute(absl::string_view tenant,
                                                      absl::string_view name, int64_t step,
                                                      int32_t rank, int32_t world_size,
                                                      const std::optional<Observation>& x,
                                                      std::optional<absl::Duration> step_timeout) {
  const absl::Duration timeout = step_timeout.value_or(options_.step_timeout);
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step_timeout is ", absl::FormatDuration(timeout), "; it must be > 0"));
  }
  std::shared_ptr<Session> session;
  StepMerge::Outcome outcome;
  {
    const SlotOwnership::WriteAdmission admission(ownership_, name);
    QPARAMS_ASSIGN_OR_RETURN(session, Find(admission.read(), tenant));
    QPARAMS_RETURN_IF_ERROR(admission.CheckWritable());
    QPARAMS_ASSIGN_OR_RETURN(outcome, session->Contribute(step, rank, world_size, x));
  }
  if (!outcome.duplicate && options_.step_contributions != nullptr) {
    options_.step_contributions->Increment();
  }
  ArmFirstPending(session->key(), *session, timeout);
  session->RunReadyWaits();
  return outcome;
}

absl::StatusOr<std::optional<Engine::StepWait>> Engine::WhenStepApplied(
    absl::string_view tenant, absl::string_view name, int64_t step,
    std::function<void()> ready) const {
  std::shared_ptr<Session> session;
  {
    const SlotOwnership::ReadAdmission admission(ownership_, name);
    QPARAMS_ASSIGN_OR_RETURN(session, Find(admission, tenant));
  }
  const std::optional<uint64_t> id = session->WhenApplied(step, std::move(ready));
  if (!id.has_value()) return std::nullopt;
  return std::optional<StepWait>(StepWait(std::move(session), *id));
}

absl::StatusOr<std::string> Engine::CheckpointStep(absl::string_view tenant,
                                                   absl::string_view name, int64_t step) const {
  std::shared_ptr<Session> session;
  {
    const SlotOwnership::ReadAdmission admission(ownership_, name);
    QPARAMS_ASSIGN_OR_RETURN(session, Find(admission, tenant));
  }
  return session->Checkpoint(step);
}

absl::Status Engine::ResumeSteps(absl::string_view tenant, absl::string_view name,
                                 int64_t next_step, absl::string_view checkpoint) {
  std::shared_ptr<Session> session;
  {
    const SlotOwnership::WriteAdmission admission(ownership_, name);
    QPARAMS_ASSIGN_OR_RETURN(session, Find(admission.read(), tenant));
    QPARAMS_RETURN_IF_ERROR(admission.CheckWritable());
    QPARAMS_RETURN_IF_ERROR(session->Resume(next_step, checkpoint));
  }
  session->RunReadyWaits();
  return absl::OkStatus();
}

absl::StatusOr<Session::StepRead> Engine::ReadStep(absl::string_view tenant, absl::string_view name,
                                                   std::optional<int64_t> step,
                                                   absl::Time deadline) const {
  std::shared_ptr<Session> session;
  {
    const SlotOwnership::ReadAdmission admission(ownership_, name);
    QPARAMS_ASSIGN_OR_RETURN(session, Find(admission, tenant));
  }
  if (!step.has_value()) return session->ReadStep(std::nullopt);
  return session->AwaitStep(*step, deadline);
}

absl::StatusOr<std::optional<StepState>> Engine::Steps(absl::string_view tenant,
                                                       absl::string_view name) const {
  const SlotOwnership::ReadAdmission admission(ownership_, name);
  QPARAMS_ASSIGN_OR_RETURN(std::shared_ptr<Session> session, Find(admission, tenant));
  return session->Steps();
}

void Engine::ArmFirstPending(const SessionKey& key, Session& session, absl::Duration timeout) {
  // The timer's lock is taken only when the session's lowest open step changed.
  const std::optional<int64_t> first = session.FirstPendingStep();
  if (!session.ExchangeArmedStep(first)) return;
  if (first.has_value()) {
    step_timer_->Arm(key, *first, timeout);
  } else {
    step_timer_->Disarm(key);
  }
}

void Engine::ExpireStep(const SessionKey& key, int64_t step, absl::Duration timeout) {
  std::shared_ptr<Session> session;
  absl::StatusOr<int> closed = 0;
  {
    const SlotOwnership::WriteAdmission admission(ownership_, key.name);
    absl::StatusOr<std::shared_ptr<Session>> found = Find(admission.read(), key.tenant);
    if (!found.ok()) return;  // deleted, evicted or moved away: nothing to close
    session = *std::move(found);
    if (!admission.CheckWritable().ok()) {
      // Its slot is moving: the target closes it once it owns it, if still open.
      step_timer_->Arm(key, step, timeout);
      return;
    }
    closed = session->CloseSteps(step, options_.steps_closed_incomplete);
  }
  session->RunReadyWaits();
  if (!closed.ok()) {
    LogError(absl::StrCat("session ", key.name, ": step ", step,
                          " not closed at its timeout: ", closed.status().message()));
    return;
  }
  if (*closed > 0) {
    LogWarning(absl::StrCat("session ", key.name, " (tenant \"", key.tenant, "\"): ", *closed,
                            " step(s) up to ", step, " closed by their timeout (",
                            absl::FormatDuration(timeout), ") with ranks missing"));
  }
  ArmFirstPending(key, *session, timeout);
}

}  // namespace qparams
