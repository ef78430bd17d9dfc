"""QATRun: a training loop's RemoteFakeQuantize modules driven through step-merged
sessions, one Step call per rank per training step (docs/qat.md)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from qparams._errors import AlreadyExists, FailedPrecondition
from qparams._steps import StepContribution, StepRead, StepReadResult
from qparams.client import Client
from qparams.torch import _naming, _registry
from qparams.torch._fake_quantize import RemoteFakeQuantize, range_observation
from qparams.torch._observer import already_exists_with_another_spec, spec_differences
from qparams.v1 import qparams_pb2 as pb

__all__ = ["QATRun"]

#: Reads of a step older than the last 8 applied are refused (docs/qat.md).
MAX_LAG = 8


def _weight_parents() -> tuple[type, ...]:
    """The QAT modules whose forward fake-quantizes their own `weight` parameter as it
    is (weight_fake_quant(self.weight)): nn.qat Linear and Conv, and the
    nn.intrinsic.qat LinearReLU and ConvReLU that derive from them. ConvBn and
    LinearBn fake-quantize a weight scaled by the batch norm, which only their
    forward computes."""
    import torch.nn.qat as nnqat
    return tuple(getattr(nnqat, name) for name in ("Linear", "Conv1d", "Conv2d", "Conv3d")
                 if hasattr(nnqat, name))


def _distributed() -> tuple[int, int] | None:
    """(rank, world size) of an initialized torch.distributed group, else None."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


class QATRun:
    """The step-merged sessions of one model's RemoteFakeQuantize modules on one rank
    of a data-parallel training job, and the hook its training loop calls at the
    start of every step. The name is the specification's: a *run* groups the sessions
    trained together and declares the world size W and the lag L (reference/qat.md
    §2).

        run = QATRun(client, prepared, prefix="job42/")    # rank and W: torch.distributed's
        for s, (x, y) in enumerate(batches):
            run.step(s)             # contributions of step s-1, reads as of s-L: ONE call
            loss_fn(prepared(x), y).backward()
            optimizer.step(); optimizer.zero_grad()
        run.finish()                # the last step's ranges; buffers as of the last step
        quantized = convert(prepared.eval())

    Construction names every RemoteFakeQuantize after its layer, as name_observers
    names observers (prefix + "fc1.output" for an eager module's output, "fc2.input"
    for an FX observer feeding fc2, "fc1.weight" for a weight), so that
    Client.export(prefix, ...) writes encodings by layer name; and creates the
    sessions, or checks those another rank (or a calibration before training)
    created: an existing session with the same spec is shared.

    step(s) makes one Client.step call for all modules: each activation module's
    range of step s-1 (the union of its forwards, or "nothing" if it did not run),
    each weight's range for step s (the parent's current `weight`, identical on every
    rank), reads of the activations as of step s - lag and of the weights as of step s;
    then it sets every module's scale and zero_point buffers. With lag L >= 1 the only
    wait is for the slowest rank's contributions to step s - L (and every rank's
    weights of step s); for s - L < 0 the activations keep the state their sessions
    had before the run (a calibration), or pass their inputs through. lag 0 makes
    each activation module contribute and read inside its forward, one Step call
    (and one cross-rank wait) per module per step: torch.ao's order, for
    verification, not speed. A module called several times in a step contributes
    the union of its forwards (lag 0: its first forward's range, and a warning if a
    later one falls outside it).

    Weights: the weight fake-quant of nn.qat Linear/Conv and nn.intrinsic.qat
    LinearReLU/ConvReLU quantizes its parent's `weight`, so the hook reduces that at
    lag 0. ConvBn and LinearBn fake-quantize a batch-norm-scaled weight that only
    their forward computes: their weight modules are observed in forward and lag L
    behind, as activations are.

    Restarting (qat.md §6): every rank calls state_dict() at the end of step s-1
    (before step(s)) and the job saves one rank's result beside its model; after a
    restart, resume(state) resets the sessions (rank 0) and waits at a barrier, and
    the loop continues with step(s), bit-identical to a job that never stopped.

    Args:
        client: the qparams.Client (default: the shared client of $QPARAMS_TARGET).
        model: the model prepare_qat or prepare_qat_fx returned (or its
            DistributedDataParallel wrapper).
        prefix: prepended to every session name, e.g. "job42/" (Client.export's
            prefix).
        world_size, rank: this job's (default: torch.distributed's if initialized,
            else 1 and 0).
        lag: L, 0 to 8 (default 1).
        step_timeout: seconds a step waits for a missing rank before the server
            closes it without it (None: the server's --step_timeout); the steps it
            closed that way are in Client.get_session(name).steps.incomplete.
        timeout: the deadline of each Step call in seconds (default: the client's);
            keep it above step_timeout.

    Raises:
        ValueError: a bad lag, rank or world size.
        RuntimeError: two modules would get one session name, or no module is a
            RemoteFakeQuantize.
        AlreadyExists: a session exists with another spec.
    """

    def __init__(self, client: Client | None, model: torch.nn.Module, prefix: str, *,
                 world_size: int | None = None, rank: int | None = None, lag: int = 1,
                 step_timeout: float | None = None, timeout: float | None = None) -> None:
        if isinstance(lag, bool) or not isinstance(lag, int) or not 0 <= lag <= MAX_LAG:
            raise ValueError(f"lag must be an int in [0, {MAX_LAG}], not {lag!r}: reads of a "
                             f"step older than the last {MAX_LAG} applied are refused")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
        group = _distributed()
        self.world_size = world_size if world_size is not None else (group[1] if group else 1)
        self.rank = rank if rank is not None else (group[0] if group else 0)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, world_size {self.world_size})")
        self.client = client if client is not None else _registry.shared_client()
        self.prefix = prefix
        self.lag = lag
        self.step_timeout = step_timeout
        self.timeout = timeout
        #: The step the modules observe into (set by step(); None before and after).
        self.current_step: int | None = None
        self._next: int | None = None       # the step step() takes next
        self._first: int | None = None      # the first step of this process
        self._resumed: dict[str, Any] | None = None
        self._finished = False
        self._contributed: dict[str, int] = {}   # activation session -> last step sent
        self._sent: dict[str, Any] = {}          # lag 0: the range sent for the step
        self._warned_lag0: set[str] = set()
        self._initial: dict[str, pb.QParams | None] = {}
        # After resume(): the activations' qparams as of the steps before the one the
        # checkpoint holds (a lag >= 2 reads them after the restart), by session and
        # step; the server restores only the checkpoint's step, `_floor`.
        self._history: dict[str, dict[int, bytes]] = {}
        self._floor: int | None = None
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        self.model = model
        self.activations: dict[str, RemoteFakeQuantize] = {}
        self.weights: dict[str, tuple[RemoteFakeQuantize, torch.nn.Module]] = {}
        self._targets: dict[str, str] = {}
        self._discover(model)
        self._open()

    # ------------------------------------------------------------------ setup

    def _discover(self, model: torch.nn.Module) -> None:
        """Names every RemoteFakeQuantize after its layer and gives it its role."""
        modules = dict(model.named_modules())
        fx_names = (_naming.fx_names(model, RemoteFakeQuantize)
                    if isinstance(model, torch.fx.GraphModule) else {})
        parents = _weight_parents()
        found: dict[str, tuple[RemoteFakeQuantize, str, torch.nn.Module | None]] = {}
        for path, module in modules.items():
            if not isinstance(module, RemoteFakeQuantize):
                continue
            owner, _, last = path.rpartition(".")
            parent = modules.get(owner) if last == "weight_fake_quant" else None
            if parent is not None:
                relative, target = f"{_naming.layer_path(owner, modules)}.weight", "weight"
            elif id(module) in fx_names:
                relative, target = fx_names[id(module)], "activation"
            else:
                relative, target = _naming.eager_name(path), "activation"
            name = module.session_name if not module._auto_name else self.prefix + relative
            if name in found and found[name][0] is not module:
                raise RuntimeError(f"two fake-quantize modules would both use the session "
                                   f"{name!r} ({path} and another)")
            weight = parent if isinstance(parent, parents) else None
            found[name] = (module, target, weight)
        if not found:
            raise RuntimeError("the model holds no RemoteFakeQuantize module: prepare it with "
                               "prepare_qat / prepare_qat_fx and a QConfig of "
                               "RemoteFakeQuantize.with_args(...)")
        for name, (module, target, weight) in found.items():
            module._name = name
            module._run = self
            module._role = "weight" if weight is not None else "activation"
            module._pending = None
            self._targets[name] = target
            if weight is not None:
                self.weights[name] = (module, weight)
            else:
                self.activations[name] = module

    def _modules(self) -> dict[str, RemoteFakeQuantize]:
        out: dict[str, RemoteFakeQuantize] = dict(self.activations)
        out.update((name, module) for name, (module, _) in self.weights.items())
        return out

    def _open(self) -> None:
        """Creates the sessions, or checks the ones that exist."""
        for name, module in self._modules().items():
            spec = module.quant_spec(self._targets[name])
            try:
                self.client.create_session(name, spec, calculator=module.calculator,
                                           averaging_constant=self._constant(module))
                continue
            except AlreadyExists:
                session = self.client.get_session(name)
            per_channel = module.is_per_channel
            diffs = spec_differences(session, spec, module.calculator, self._constant(module),
                                     None, None if per_channel else 1)
            if diffs:
                raise already_exists_with_another_spec(name, diffs)

    @staticmethod
    def _constant(module: RemoteFakeQuantize) -> float | None:
        """The averaging constant of a moving_average module's session (else none)."""
        return module.averaging_constant if module.calculator == "moving_average" else None

    def _start(self, s: int) -> None:
        """The first step of this process: the activations' state before the run (for
        the steps before s - lag >= 0), checked to be this run's."""
        if self._resumed is not None:
            if s != self._resumed["next_step"]:
                raise ValueError(f"resumed at step {self._resumed['next_step']}, so the first "
                                 f"step is {self._resumed['next_step']}, not {s}")
            initial = self._resumed.get("initial", {})
            self._initial = {name: pb.QParams.FromString(initial[name]) if name in initial
                             else None for name in self.activations}
        else:
            if s != 0:
                raise ValueError(f"a run's first step is 0 (a session applies its steps in "
                                 f"order from 0), or the one resume() names, not {s}")
            sessions = {session.name: session for session in self.client.read_sessions(
                self.prefix) if session.name in self._targets}
            for name, session in sessions.items():
                created = session.create_time.seconds + session.create_time.nanos / 1e9
                if session.HasField("steps") and created < _registry.STARTED:
                    raise FailedPrecondition(
                        f"session {name!r} took steps (up to "
                        f"{session.steps.last_applied_step}) of a run from before this "
                        "process started: continue that run with QATRun.resume(state) from "
                        "its checkpoint, or delete its sessions (qparams.torch.delete_run) "
                        "or use another prefix", session=name)
            self._initial = {name: sessions[name].qparams
                             if name in sessions and sessions[name].initialized else None
                             for name in self.activations}
        self._first = s
        for name, module in self.activations.items():
            module._pending = None  # forwards before the run belong to no step
            self._contributed[name] = s - 1
            if s - self.lag < 0:
                self._set(module, self._initial[name])

    # ------------------------------------------------------------------ the hook

    def step(self, s: int) -> None:
        """The hook of training step `s`, called at its start (before the forward):
        one Step call with this rank's contributions of step s-1 (activations) and s
        (weights) and the reads as of s - lag (activations) and s (weights); then
        every module's buffers are set. Steps increase by one from the first (0, or
        the step resume() named).

        Raises:
            ValueError: a step that does not follow the previous one.
            RuntimeError: after finish().
            QParamsError: a refused contribution or read (naming its session), or the
                call's failure after the client's retries.
        """
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"a step is an int >= 0, not {s!r}")
        if self._finished:
            raise RuntimeError("the run is finished; a new run needs a new QATRun")
        if self._next is None:
            self._start(s)
        elif s != self._next:
            raise ValueError(f"step {s} after step {self._next - 1}: steps increase by one")
        contributions = self._activation_ranges(s - 1)
        for name, (module, parent) in self.weights.items():
            observed = None
            if module.observer_enabled[0] == 1:
                reduced = module._reduce(parent.weight)
                observed = None if reduced is None else range_observation(reduced)
            contributions.append(StepContribution(name, s, observed))
        reads = [StepRead(name, s) for name in self.weights]
        if self.lag >= 1 and s - self.lag >= 0:
            reads += self._activation_reads(s - self.lag)
        self._call(contributions, reads)
        self.current_step, self._next = s, s + 1

    def finish(self) -> None:
        """After the last training step: contributes its ranges and reads the
        activations as of it, so that every module's buffers hold the state after the
        last step (the weights' already do); then convert. Later forwards observe
        nothing into the sessions."""
        if self._finished or self.current_step is None:
            self._finished = True
            return
        s = self.current_step
        self._call(self._activation_ranges(s), [StepRead(name, s) for name in self.activations])
        self.current_step = None
        self._finished = True

    def _activation_reads(self, step: int) -> list[StepRead]:
        """The reads of the activations as of `step`; after a restart, a step before
        the checkpoint's is set from the saved history instead (no read)."""
        if self._floor is None or step >= self._floor:
            return [StepRead(name, step) for name in self.activations]
        for name, module in self.activations.items():
            saved = self._history.get(name, {}).get(step)
            if saved is None:
                raise RuntimeError(f"{name}: step {step} is before the checkpoint's and not "
                                   "in the state resume() took")
            self._set(module, pb.QParams.FromString(saved) if saved else None)
        return []

    def _activation_ranges(self, step: int) -> list[StepContribution]:
        """The activations' contributions to `step` not sent yet (from the first step
        of this process on): each module's union of forwards, or nothing."""
        out = []
        for name, module in self.activations.items():
            observed = module._take_range()
            if step >= (self._first or 0) and self._contributed[name] < step:
                out.append(StepContribution(name, step, observed))
                self._contributed[name] = step
        return out

    def _call(self, contributions: list[StepContribution], reads: list[StepRead]) -> list[
            StepReadResult]:
        """One Client.step call; sets the buffers of every module read."""
        if not contributions and not reads:
            return []
        result = self.client.step(self.rank, self.world_size, contributions, reads,
                                  step_timeout=self.step_timeout, timeout=self.timeout)
        modules = self._modules()
        for read in result.reads:
            self._set(modules[read.name], read.qparams.to_proto() if read.initialized else None)
        return list(result.reads)

    @staticmethod
    def _set(module: RemoteFakeQuantize, q: pb.QParams | None) -> None:
        """A module's buffers from the qparams `q` (None: uninitialized, pass through)."""
        if q is None or not q.scale:
            module.scale.resize_(0)
            module.zero_point.resize_(0)
            return
        if len(q.scale) == 1 and len(q.zero_point) == 1 and module.scale.numel() == 1:
            # Per tensor, in place: a module's buffers change every step.
            module.scale.fill_(q.scale[0])
            module.zero_point.fill_(q.zero_point[0])
            return
        module.set_qparams(torch.from_numpy(np.asarray(q.scale, np.float32)),
                           torch.from_numpy(np.asarray(q.zero_point, np.int32)))

    def _forward_at_lag_0(self, module: RemoteFakeQuantize, reduced: Any) -> None:
        """Lag 0, inside an activation module's forward in step s: contributes its range
        to step s and reads as of s (waiting for every rank), in one Step call."""
        name, s = module.session_name, self.current_step
        assert name is not None and s is not None
        if self._contributed[name] >= s:
            # A later forward of step s: step s is sent, so its range is not in it.
            lo, hi = self._sent[name][1], self._sent[name][2]
            if name not in self._warned_lag0 and not (
                    bool((reduced[1] >= lo).all()) and bool((reduced[2] <= hi).all())):
                self._warned_lag0.add(name)
                warnings.warn(f"{name}: a second forward in step {s} at lag 0 saw values "
                              "outside the step's contributed range, which the session does "
                              "not get; use lag >= 1 for modules that run several times per "
                              "step")
            return
        self._contributed[name] = s
        self._sent[name] = reduced
        self._call([StepContribution(name, s, range_observation(reduced))], [StepRead(name, s)])

    # ------------------------------------------------------------------ restarts

    def state_dict(self) -> dict[str, Any]:
        """The run's checkpoint at the end of step s-1, before step(s): every rank calls
        it (it contributes the activations' ranges of step s-1, as step(s) would have,
        and reads every session as of s-1 with its whole state). Returns a picklable
        {"next_step": s, "sessions": {name: bytes}} for the job to save beside the
        model's state_dict (with lag >= 2 also "history": the activations' qparams
        as of steps s-lag .. s-2, which the restarted loop reads and the server does
        not restore; while s < lag, "initial": their state before the run). The
        buffers are unchanged.

        Raises:
            RuntimeError: before the first step, or after finish().
            QParamsError: as step does (FailedPrecondition if a session applied a
                later step: a rank ran ahead past a step timeout).
        """
        if self._next is None or self._finished:
            raise RuntimeError("state_dict is taken at the end of a training step, between "
                               "run.step(s - 1) and run.step(s)")
        last = self._next - 1
        contributions = self._activation_ranges(last)
        reads = [StepRead(name, last, checkpoint=True) for name in self._modules()]
        # A lag L >= 2 reads steps s-L .. s-2 after the restart, which the server does
        # not restore: they travel in the state.
        older = range(max(0, self._next - self.lag), last)
        history: dict[str, dict[int, bytes]] = {name: {} for name in self.activations}
        for t in older:
            if self._floor is not None and t < self._floor:
                for name in self.activations:
                    history[name][t] = self._history[name][t]
            else:
                reads += [StepRead(name, t) for name in self.activations]
        result = self.client.step(self.rank, self.world_size, contributions, reads,
                                  step_timeout=self.step_timeout, timeout=self.timeout)
        sessions = {}
        for read in result.reads:
            if read.step == last and read.name not in sessions:
                sessions[read.name] = read.checkpoint
            else:
                history[read.name][read.step] = (read.qparams.to_proto().SerializeToString()
                                                 if read.initialized else b"")
        state: dict[str, Any] = {"next_step": self._next, "sessions": sessions}
        if any(history.values()):
            state["history"] = history
        if self._next < self.lag:
            state["initial"] = {name: q.SerializeToString()
                                for name, q in self._initial.items() if q is not None}
        return state

    def resume(self, state: Mapping[str, Any]) -> None:
        """Restarts the run from `state` (a state_dict() of the job before): rank 0
        resets every session to its checkpoint (Client.resume_steps: the steps the
        stopped job applied or opened after it are discarded), then every rank waits
        at torch.distributed.barrier() (W > 1), so that no rank contributes before
        the reset. The loop then continues with step(state["next_step"]); load the
        model's (and optimizer's) state saved with it first.

        Raises:
            ValueError: a state whose sessions are not this run's, or a run that
                already stepped.
            QParamsError: a refused reset (naming its session).
        """
        if self._next is not None:
            raise ValueError("resume before the first step of the run")
        sessions = dict(state["sessions"])
        next_step = state["next_step"]
        ours = set(self._targets)
        if set(sessions) != ours:
            missing, extra = sorted(ours - set(sessions)), sorted(set(sessions) - ours)
            raise ValueError(f"the state's sessions are not this run's: missing {missing}, "
                             f"not in the model {extra}")
        if self.rank == 0:
            self.client.resume_steps(sessions, next_step, timeout=self.timeout)
        if self.world_size > 1 and _distributed() is not None:
            torch.distributed.barrier()
        self._resumed = {"next_step": next_step, "initial": dict(state.get("initial", {}))}
        self._history = {name: dict(steps) for name, steps in state.get("history", {}).items()}
        self._floor = next_step - 1

    def __repr__(self) -> str:
        return (f"QATRun(prefix={self.prefix!r}, rank={self.rank}, world_size="
                f"{self.world_size}, lag={self.lag}, activations={len(self.activations)}, "
                f"weights={len(self.weights)}, next_step={self._next})")
