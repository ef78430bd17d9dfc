"""Step-merged sessions from the client's side (docs/qat.md): Client.step, one Step
call per rank per training step carrying that rank's contributions and its reads
"as of a step", and Client.resume_steps, which restarts sessions from a job's
checkpoint.

Sessions may be sharded over replicas: a call is split into one Step per owning
replica (by the topology the Client's Router read), made concurrently, since each
blocks until the steps its reads wait for are applied. Items refused naming
another owner are sent there (the topology read again); items (or whole calls)
that fail with UNAVAILABLE or UNKNOWN are sent again under the client's retry
policy: a repeated (session, step, rank) contribution is answered `duplicate` and
applied once, and a read changes nothing, so a retry is always safe.
DEADLINE_EXCEEDED is not sent again: it is a read's answer once `timeout` is over
(as in the C++ client, include/qparams/client.h). Client's thin methods (qparams/_client_steps.py)
delegate here; the Client makes no Step call itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

import grpc
import numpy as np

from qparams._errors import (QParamsError, Unavailable, Unknown, error_from_rpc,
                             error_from_status)
from qparams._results import QParams
from qparams._tensors import (TensorLike, check_reduce, is_torch_tensor, range_request,
                              tensor_request)
from qparams.v1 import qparams_pb2 as pb

if TYPE_CHECKING:
    from qparams._client_core import ClientCore, Metadata

__all__ = ["StepContribution", "StepRead", "StepContributionResult", "StepReadResult",
           "StepResult", "step", "resume_steps"]


@dataclasses.dataclass(frozen=True)
class StepContribution:
    """One rank's contribution to step `step` of the step-merged session `name`.

    Attributes:
        name: the session.
        step: the training step, >= 0 (at most 1024 past the session's last applied
            step; the server judges).
        x: what the rank observed in that step: a tensor (numpy array or torch
            tensor; reduced to its block minima and maxima where it lives, as
            Client.observe reduces, or sent whole: see `reduce`), a
            qparams.pb.RangeObservation already reduced (e.g. the union of several
            forwards), or None: "nothing", the rank did not run the module in that
            step (the step still needs it to complete).
    """

    name: str
    step: int
    x: Union[TensorLike, pb.RangeObservation, None] = None


@dataclasses.dataclass(frozen=True)
class StepRead:
    """A read of session `name`'s qparams as of step `step`: the state after that step
    was applied. None: the latest applied step. `checkpoint` also asks for the
    session's whole state (StepReadResult.checkpoint, for resume_steps), which the
    server gives only as of the session's last applied step."""

    name: str
    step: int | None = None
    checkpoint: bool = False


@dataclasses.dataclass(frozen=True)
class StepContributionResult:
    """How the server took a contribution.

    Attributes:
        name, step: the contribution's.
        duplicate: (name, step, rank) had contributed before (a retry): nothing was
            applied now.
        last_applied_step: the session's last applied step after it (-1: none).
    """

    name: str
    step: int
    duplicate: bool
    last_applied_step: int


@dataclasses.dataclass(frozen=True)
class StepReadResult:
    """A session's qparams as of a step.

    Attributes:
        name: the session.
        step: the step the qparams follow (-1: none applied).
        initialized: False while the session holds no range (no step carried one and
            no calibration before the first step): qparams is then empty and a
            fake-quantize passes its input through.
        qparams: the qparams (numpy arrays; .to_torch() for tensors), of shape N.
        checkpoint: with StepRead.checkpoint, the session's whole state, opaque, for
            Client.resume_steps (empty for a session restarting uninitialized).
    """

    name: str
    step: int
    initialized: bool
    qparams: QParams
    checkpoint: bytes = b""


@dataclasses.dataclass(frozen=True)
class StepResult:
    """The answer of Client.step: one result per contribution and per read, in the
    order they were given."""

    contributions: tuple[StepContributionResult, ...]
    reads: tuple[StepReadResult, ...]


ContributionLike = Union[StepContribution, tuple]
ReadLike = Union[StepRead, tuple, str]


def _int(value: Any, what: str) -> int:
    """value as an int; TypeError for a bool, float or anything else (the server
    judges the value itself)."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__} {value!r}")
    return value


def _as_contribution(item: ContributionLike) -> StepContribution:
    if isinstance(item, StepContribution):
        return item
    if isinstance(item, tuple) and len(item) in (2, 3):
        return StepContribution(*item)
    raise TypeError(f"a contribution is a qparams.StepContribution or a (name, step[, x]) "
                    f"tuple, not {item!r}")


def _as_read(item: ReadLike) -> StepRead:
    if isinstance(item, StepRead):
        return item
    if isinstance(item, str):
        return StepRead(item)
    if isinstance(item, tuple) and len(item) in (1, 2, 3):
        return StepRead(*item)
    raise TypeError(f"a read is a qparams.StepRead, a (name, step[, checkpoint]) tuple or "
                    f"a session name, not {item!r}")


def _contribution_message(client: "ClientCore", c: StepContribution, reduce: str
                          ) -> pb.StepContribution:
    """The wire contribution of `c`: its tensor reduced as Client.observe reduces one
    (by the session's spec, fetched once per name), or sent whole."""
    if not isinstance(c.name, str):
        raise TypeError(f"a contribution's session name must be a str, not {c.name!r}")
    message = pb.StepContribution(name=c.name, step=_int(c.step, f"step of {c.name!r}"))
    x = c.x
    if x is None:
        return message
    if isinstance(x, pb.RangeObservation):
        message.range.CopyFrom(x)
        return message
    if not (is_torch_tensor(x) or hasattr(x, "dtype") and hasattr(x, "shape")):
        raise TypeError(f"contribution to {c.name!r}: x must be an array, a tensor, a "
                        f"RangeObservation or None, not {type(x).__name__}")
    layout = None if reduce == "never" else client._layout(c.name)
    if layout is None or layout.histogram is not None:
        observation = tensor_request(c.name, x)  # the server reports what is wrong
    else:
        observation = range_request(c.name, x, layout.spec, reduce)
    if observation.HasField("range"):
        message.range.CopyFrom(observation.range)
    else:
        client._check_size(observation.tensor.data, reduce)
        message.tensor.CopyFrom(observation.tensor)
    return message


# ---------------------------------------------------------------------- delivery

# A batch of named items sent over one RPC per owning replica:
#   build(indexes) -> the request holding those items, in order;
#   answers(response, count) -> the items' answers, in the order sent (ValueError if
#       the response does not hold `count`);
#   status(answer) -> the answer's RpcStatus.
Build = Callable[[list[int]], Any]
Answers = Callable[[Any, int], list[Any]]


def _calls(client: "ClientCore", method: str, names: Sequence[str],
           groups: Mapping[Any, list[int]], build: Build, answers: Answers,
           status: Callable[[Any], pb.RpcStatus],
           timeout: float | None, metadata: "Metadata", follow: bool
           ) -> tuple[dict[int, Any], dict[str, list[int]]]:
    """One call per group (replica name, or None: unaddressed), made concurrently.
    Returns each item's answer or QParamsError by index and, if `follow`, the items
    refused naming another owner, by that owner (else those are errors too)."""
    stub = getattr(client._stub, method)

    def call(replica: Any) -> Callable[[], Any]:
        request = build(groups[replica])
        options = {"timeout": timeout or client.timeout,
                   "metadata": client._addressed(replica, metadata)}
        if len(groups) == 1:
            # One call: made blocking, which saves the thread a future starts.
            return lambda: stub(request, **options)
        return stub.future(request, **options).result

    results = {replica: call(replica) for replica in groups}
    out: dict[int, Any] = {}
    moved: dict[str, list[int]] = {}
    for replica, result in results.items():
        indexes = groups[replica]
        try:
            response = result()
        except grpc.RpcError as e:
            error = error_from_rpc(e, replica)
            for i in indexes:
                item = error_from_status(error.code, error.message)
                item.owner, item.session = error.owner, names[i]
                out[i] = item
            continue
        try:
            items = answers(response, len(indexes))
        except ValueError as e:
            where = f"replica {replica}: " if replica else ""
            raise QParamsError(f"{where}{method} {e}") from None
        for i, answer in zip(indexes, items):
            s = status(answer)
            if s.code == 0:
                out[i] = answer
            elif follow and client._follows(s) and replica != s.owner:
                moved.setdefault(s.owner, []).append(i)
            else:
                out[i] = error_from_status(s.code, s.message)
                out[i].session, out[i].owner = names[i], s.owner or None
    return out, moved


def _deliver(client: "ClientCore", method: str, names: Sequence[str], build: Build,
             answers: Answers, status: Callable[[Any], pb.RpcStatus],
             timeout: float | None, metadata: "Metadata") -> list[Any]:
    """Every item's answer or QParamsError (naming its session), in order: sent in one
    call per owning replica, the items refused naming another owner sent there, and
    the items that failed retryably sent again while the retry policy allows (the
    RPCs this serves are safe to repeat)."""
    outcomes: list[Any] = [None] * len(names)
    pending = list(range(len(names)))
    wait = client._retry.waits()
    while True:
        slot_map = client._router.slot_map()
        if slot_map is None:
            groups: dict[Any, list[int]] = {None: pending}
        else:
            groups = {replica: [pending[j] for j in part] for replica, part in
                      slot_map.split(names[i] for i in pending).items()}
        got, moved = _calls(client, method, names, groups, build, answers, status,
                            timeout, metadata, True)
        if moved:
            # The balancer's map or ours is older than the replica's: to the owner it
            # names, the topology read again for the next calls.
            try:
                client._router.refresh()
            except QParamsError:
                pass
            more, _ = _calls(client, method, names, moved, build, answers, status,
                             timeout, metadata, False)
            got.update(more)
        again = []
        for i in pending:
            outcomes[i] = got[i]
            if isinstance(got[i], (Unavailable, Unknown)):
                again.append(i)
        if not again or not wait():
            return outcomes
        pending = again


def _raise_first(outcomes: Sequence[Any]) -> None:
    for outcome in outcomes:
        if isinstance(outcome, QParamsError):
            raise outcome


# ---------------------------------------------------------------------- the calls


def step(client: "ClientCore", rank: int, world_size: int,
         contributions: Iterable[ContributionLike] = (), reads: Iterable[ReadLike] = (), *,
         step_timeout: float | None = None, reduce: str = "auto",
         timeout: float | None = None, metadata: "Metadata" = None) -> StepResult:
    """Client.step: see there."""
    check_reduce(reduce)
    rank = _int(rank, "rank")
    world_size = _int(world_size, "world_size")
    wanted = [_as_contribution(c) for c in contributions]
    asked = [_as_read(r) for r in reads]
    messages = [_contribution_message(client, c, reduce) for c in wanted]
    read_messages = []
    for r in asked:
        if not isinstance(r.name, str):
            raise TypeError(f"a read's session name must be a str, not {r.name!r}")
        read = pb.StepRead(name=r.name, checkpoint=bool(r.checkpoint))
        if r.step is None:
            read.latest = True
        else:
            read.step = _int(r.step, f"step of the read of {r.name!r}")
        read_messages.append(read)
    base = pb.StepRequest(rank=rank, world_size=world_size)
    if step_timeout is not None:
        base.step_timeout.FromNanoseconds(round(float(step_timeout) * 1e9))
    count = len(messages)
    names = [m.name for m in messages] + [r.name for r in read_messages]

    def build(indexes: list[int]) -> pb.StepRequest:
        request = pb.StepRequest()
        request.CopyFrom(base)
        # Contributions before reads, each in the order given: the server applies
        # the contributions first, then the reads wait.
        request.contributions.extend(messages[i] for i in indexes if i < count)
        request.reads.extend(read_messages[i - count] for i in indexes if i >= count)
        return request

    def answers(response: pb.StepResponse, n: int) -> list[Any]:
        items = list(response.contributions) + list(response.reads)
        if len(items) != n:
            raise ValueError(f"answered {len(items)} of {n} contributions and reads")
        return items

    outcomes = _deliver(client, "Step", names, build, answers, lambda a: a.status,
                        timeout, metadata)
    _raise_first(outcomes)
    return StepResult(
        tuple(StepContributionResult(c.name, c.step, a.duplicate, a.last_applied_step)
              for c, a in zip(messages, outcomes[:count])),
        tuple(StepReadResult(r.name, a.step, a.initialized,
                             QParams.from_proto(a.qparams, a.initialized), a.checkpoint)
              for r, a in zip(read_messages, outcomes[count:])))


def resume_steps(client: "ClientCore", checkpoints: Mapping[str, bytes], next_step: int, *,
                 timeout: float | None = None, metadata: "Metadata" = None) -> None:
    """Client.resume_steps: see there."""
    next_step = _int(next_step, "next_step")
    items = []
    for name, checkpoint in checkpoints.items():
        if not isinstance(name, str):
            raise TypeError(f"checkpoints' keys are session names (str), not {name!r}")
        if not isinstance(checkpoint, (bytes, bytearray)):
            raise TypeError(f"checkpoint of {name!r} must be bytes (a StepReadResult's "
                            f"checkpoint), not {type(checkpoint).__name__}")
        items.append(pb.ResumeItem(name=name, next_step=next_step, checkpoint=bytes(checkpoint)))

    def answers(response: pb.ResumeStepsResponse, n: int) -> list[Any]:
        if len(response.statuses) != n:
            raise ValueError(f"answered {len(response.statuses)} of {n} sessions")
        return list(response.statuses)

    outcomes = _deliver(client, "ResumeSteps", [item.name for item in items],
                        lambda indexes: pb.ResumeStepsRequest(items=[items[i] for i in indexes]),
                        answers, lambda status: status, timeout, metadata)
    _raise_first(outcomes)
