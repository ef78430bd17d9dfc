"""The step-merged session calls of qparams.Client (docs/qat.md): step and
resume_steps, which qparams/_steps.py makes (one call per owning replica)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from qparams import _steps
from qparams._client_core import ClientCore, Metadata
from qparams._steps import StepContribution, StepRead, StepResult

__all__ = ["StepCalls"]


class StepCalls(ClientCore):
    """qparams.Client's Step and ResumeSteps calls."""

    def step(self, rank: int, world_size: int,
             contributions: Iterable[StepContribution | tuple] = (),
             reads: Iterable[StepRead | tuple | str] = (), *,
             step_timeout: float | None = None, reduce: str = "auto",
             timeout: float | None = None, metadata: Metadata = None) -> StepResult:
        """One training step's worth of step-merged sessions (docs/qat.md) for rank
        `rank` of `world_size`: its contributions, then its reads "as of a step", in
        one Step call (one per owning replica when sharded, made concurrently).

        The server applies the contributions first, in order (a step applies once
        all `world_size` ranks contributed to it and the step before is applied),
        then each read waits until its step is applied: the state after it, the same
        bits on every rank. A read of a step older than the last 8 applied is
        FailedPrecondition. qparams.torch.QATRun makes these calls for a model.

        Args:
            rank: this rank, in [0, world_size).
            world_size: the ranks of the step (1 to 65536), the same for every
                contribution to a step.
            contributions: StepContribution(name, step, x) or (name, step, x) tuples:
                x a tensor (reduced as observe reduces it, see `reduce`), a
                RangeObservation, or None ("nothing": the rank did not run the
                module in that step).
            reads: StepRead(name, step, checkpoint), (name, step[, checkpoint])
                tuples, or names (the latest applied step).
            step_timeout: seconds the first contribution to a session's lowest open
                step waits for the other ranks before the step closes without them
                (1 ms to 24 h); None: the server's --step_timeout. Keep `timeout`
                above it, or a read of a step a rank never contributes to runs out.
            reduce: as for observe ("auto", "always", "never").
            timeout: the deadline of each call, reads' waits included (default: the
                client's). A call that fails with Unavailable or Unknown, or whose
                items do, is sent again while retry_total allows: a repeated
                contribution is answered `duplicate` and applied once, a read changes
                nothing. DeadlineExceeded is raised, not retried: a read's step was
                not applied in time (a rank late or gone until its step timeout);
                what was contributed stays, and the same call made again is safe.

        Returns:
            A StepResult: a StepContributionResult per contribution (duplicate,
            last_applied_step) and a StepReadResult per read (step, initialized,
            qparams, checkpoint), in the order given.

        Raises:
            TypeError: a malformed item, or rank, world_size or step not an int.
            ValueError: a bad reduce, or a tensor sent whole over max_message_bytes.
            QParamsError: the first refused item (contributions first), its
                `session` set and its message the server's, naming the field
                (InvalidArgument: a rank outside [0, world_size), a negative step,
                non-finite values; FailedPrecondition: another shape or dtype than
                the session's, a step too far ahead or too old to read, a histogram
                session; NotFound), or the call's failure after the retries.
        """
        return _steps.step(self, rank, world_size, contributions, reads,
                           step_timeout=step_timeout, reduce=reduce, timeout=timeout,
                           metadata=metadata)

    def resume_steps(self, checkpoints: Mapping[str, bytes], next_step: int, *,
                     timeout: float | None = None, metadata: Metadata = None) -> None:
        """Restarts step-merged sessions from a job's checkpoint (docs/qat.md,
        "Restarting from a checkpoint"): each session takes the state its checkpoint
        holds (a StepReadResult.checkpoint read as of step next_step - 1; b"": the
        session restarts uninitialized), its open steps are discarded, and the next
        step it applies is `next_step`. Call it from one process, before any rank
        contributes to next_step (qparams.torch.QATRun.resume does, then a barrier).

        Sharded: one ResumeSteps per owning replica; retried as step is.

        Raises:
            TypeError: a key that is not a str, a checkpoint that is not bytes, or a
                next_step that is not an int.
            QParamsError: the first refused session (its `session` set): NotFound;
                FailedPrecondition for a checkpoint of another session (or of one since
                re-created with another spec); InvalidArgument for bytes that are no
                checkpoint or a negative next_step.
        """
        _steps.resume_steps(self, checkpoints, next_step, timeout=timeout, metadata=metadata)
