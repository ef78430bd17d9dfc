"""PyTorch observers backed by qparams sessions, for torch.ao.quantization.

A RemoteObserver is a torch.ao observer (an nn.Module with `forward` and
`calculate_qparams`) whose statistics live in a named session on a qparams server
instead of in the module: `forward` reduces each tensor where it lives (its min and
max per block) and queues it for the client's background thread, which sends the
queue in ObserveBatch calls, so that the training step does not wait on the network; `calculate_qparams` reads the session's qparams, which
are those coreai_opt computes, bit for bit.

Recipe (eager mode; FX's prepare_fx/convert_fx with a QConfigMapping take the same
QConfig):

    import torch
    from torch.ao.quantization import QConfig, prepare, convert
    from qparams.torch import RemoteObserver, name_observers

    run = "exp1"                                  # the session-name prefix of this run
    qconfig = QConfig(
        activation=RemoteObserver.with_args(run=run, dtype=torch.quint8,
                                            qscheme=torch.per_tensor_affine),
        weight=RemoteObserver.with_args(run=run, dtype=torch.qint8,
                                        qscheme=torch.per_channel_symmetric, target="weight"))
    model.qconfig = qconfig
    prepared = prepare(model)
    name_observers(prepared, run)       # sessions named "exp1/fc1.activation_post_process", ...
    with torch.no_grad():
        for batch in calibration_data:
            prepared(batch)
    quantized = convert(prepared)       # flushes, then reads every session's qparams

Call `name_observers` right after `prepare`: until then each observer carries the
name it got at construction, f"{run}/observer.{k}" with k a per-process counter.
Observers that torch.ao creates inside `convert` (eager weight observers, made by
`from_float` from `qconfig.weight()`) keep those counter names. A run name is a
namespace: observing again under a run whose sessions exist adds to their statistics
(global_minmax keeps the extremes of both), so give each calibration its own run.

Choosing a calculator (`calculator=`):
  * "global_minmax" (the default) keeps the running min and max of everything
    observed. It gives the same scales and zero points as torch.ao's MinMaxObserver
    and PerChannelMinMaxObserver, bit for bit (torch 1.13, int8 and uint8), and its
    result does not depend on how the data was split or in which order it came.
  * "moving_average" averages the range over observations (`averaging_constant`,
    default 0.01). It differs from torch.ao's MovingAverage(PerChannel)MinMaxObserver
    by design: coreai_opt averages the zero-clamped range, torch.ao the raw one (up to
    0.5% per channel).
  * "static" keeps the qparams of the latest observation only (coreai_opt's default
    for weights).

Data-parallel calibration: ranks that use the same `run` and build the same model
observe into the same sessions (the first rank to get there creates each session, the
others find it and check its spec). With global_minmax the qparams do not depend on
which rank saw which shard, nor in which order. The pattern:

    # On every rank: the same run name, the same model (its qconfig made with
    # RemoteObserver.with_args(run="exp1", ...)), its own shard of the data.
    from qparams.torch import flush_all
    prepared = prepare(model)
    name_observers(prepared, "exp1")
    with torch.no_grad():
        for batch in my_shard:
            prepared(batch)
    flush_all()                      # this rank's observations are applied...
    torch.distributed.barrier()      # ... and so are every other rank's
    if rank == 0:                    # any one rank (or another process) reads the result
        quantized = convert(prepared)

A process that observed nothing may convert as well: its observers find the sessions
the ranks filled (tests/python/test_data_parallel.py does exactly that).

Errors: an observation the server refuses (NaN values, a deleted session, a shape
that does not fit the granularity, ...) or a failed call is kept and raised by the
next `forward`, `flush` or `calculate_qparams` of an observer using the same client,
exactly once (a `forward` that raises it observes nothing), and later calls work again
once the cause is fixed. The error names its session (`error.session`).

Observers share one qparams.Client (and so one background queue) per server address
and client options in a process. A copy (copy.deepcopy, pickle) keeps the session
name and finds the shared client of its own process again. `flush_all()` waits for
all of a process's observations; `close_clients()` sends what is queued and closes
the clients (also at exit).
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.ao.quantization.observer import ObserverBase

from qparams._errors import AlreadyExists
from qparams._results import QParams
from qparams._spec import GranularityLike
from qparams._spec import granularity as _granularity
from qparams._spec import granularity_text
from qparams._spec import quant_spec
from qparams.client import DEFAULT_TARGET, Client, check_reduce
from qparams.v1 import qparams_pb2 as pb

__all__ = ["RemoteObserver", "name_observers", "shared_client", "flush_all", "close_clients",
           "default_run"]

# ---------------------------------------------------------------------- process registry

_lock = threading.Lock()
_clients: dict[tuple, Client] = {}
# The sessions opened (created, or found and checked) in this process, each as
# (client key, session name, what was asked for: spec, calculator, averaging constant).
_opened: set[tuple] = set()
_counter = itertools.count()
_generated_run: str | None = None
# Moves whenever the registry drops its clients, so that observers holding one let go.
_generation = 0


def _after_fork_in_child() -> None:
    # A gRPC channel does not survive fork: a child builds its own clients. The parent's
    # objects are dropped, not closed (closing would act on the parent's channel).
    global _lock, _generation
    _lock = threading.Lock()
    _clients.clear()
    _opened.clear()
    _generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _resolve_server(server: str | None) -> str:
    return server or os.environ.get("QPARAMS_TARGET") or DEFAULT_TARGET


def _client_key(server: str, client_options: Mapping[str, Any]) -> tuple:
    return (server, tuple(sorted(client_options.items())))


def shared_client(server: str | None = None,
                  client_options: Mapping[str, Any] | None = None) -> Client:
    """The qparams.Client this process's observers share for `server` and
    `client_options` (created on first use, closed at exit).

    Args:
        server: the server's address; default $QPARAMS_TARGET, else 127.0.0.1:50051.
        client_options: keyword arguments of qparams.Client (token, tls_ca, timeout...).

    Raises:
        ValueError: client_options names `target` (pass `server`) or a bad option value.
    """
    server = _resolve_server(server)
    options = dict(client_options or {})
    if "target" in options:
        raise ValueError("client_options must not hold target; pass server= instead")
    key = _client_key(server, options)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = Client(server, **options)
        return client


def flush_all(timeout: float | None = None) -> None:
    """Waits until every observation of every shared client of this process is
    answered, and raises the first failure not raised yet (see Client.flush)."""
    with _lock:
        clients = list(_clients.values())
    for client in clients:
        client.flush(timeout)


def close_clients() -> None:
    """Closes the shared clients of this process, after sending what their background
    queues still hold (their errors are not raised: flush first to see them).
    Observers open new clients on their next call. Runs at exit too.
    """
    global _generation
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
        _opened.clear()
        _generation += 1
    for client in clients:
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closing must reach every client
            pass


atexit.register(close_clients)


def default_run() -> str:
    """The session-name prefix observers use without `run`: $QPARAMS_RUN, else one
    generated once per process, like "calib-20261201T125400-4242" (UTC time, pid)."""
    global _generated_run
    run = os.environ.get("QPARAMS_RUN")
    if run:
        return run
    with _lock:
        if _generated_run is None:
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            _generated_run = f"calib-{stamp}-{os.getpid()}"
        return _generated_run


# ---------------------------------------------------------------------- spec helpers

_TORCH_QSCHEMES = (
    # (torch qscheme, qparams qscheme, per channel)
    (torch.per_tensor_affine, "asymmetric", False),
    (torch.per_tensor_symmetric, "symmetric", False),
    (torch.per_channel_affine, "asymmetric", True),
    (torch.per_channel_symmetric, "symmetric", True),
)
_QSCHEME_NAMES = ("symmetric", "asymmetric", "symmetric_with_clipping")
_OWN_KEYS = ("dtype", "qscheme", "granularity", "target", "quant_min", "quant_max")
_DTYPE_ALIASES = {"float8_e4m3": "float8_e4m3fn", "float4_e2m1fn": "float4_e2m1fn_x2"}
_SCALE_ALIASES = {"float8_e8m0": "float8_e8m0fnu"}


def _canonical_dtype(name: str) -> str:
    name = name or "int8"
    return _DTYPE_ALIASES.get(name, name)


def _same_axis(a: int, b: int, rank: int | None) -> bool:
    if a == b:
        return True
    return rank is not None and -rank <= a < rank and -rank <= b < rank and a % rank == b % rank


def _same_granularity(want: pb.Granularity, have: pb.Granularity, rank: int | None) -> bool:
    kind = want.WhichOneof("kind") or "per_tensor"
    if kind != (have.WhichOneof("kind") or "per_tensor"):
        return False
    if kind == "per_channel":
        return _same_axis(want.per_channel.axis, have.per_channel.axis, rank)
    if kind == "per_block":
        w, h = want.per_block, have.per_block
        if w.HasField("axis") != h.HasField("axis") or list(w.block_size) != list(h.block_size):
            return False
        return not w.HasField("axis") or _same_axis(w.axis, h.axis, rank)
    return True


def _describe_spec(spec: pb.QuantSpec) -> str:
    parts = [f"dtype={_canonical_dtype(spec.dtype)}",
             f"qscheme={pb.QScheme.Name(spec.qscheme or pb.SYMMETRIC).lower()}",
             f"granularity={granularity_text(spec.granularity)}",
             f"target={pb.Target.Name(spec.target or pb.WEIGHT).lower()}"]
    if spec.HasField("quant_min"):
        parts.append(f"quant_range=({spec.quant_min:g}, {spec.quant_max:g})")
    if spec.HasField("float_range"):
        lo = spec.float_range.min if spec.float_range.HasField("min") else None
        hi = spec.float_range.max if spec.float_range.HasField("max") else None
        if lo is not None or hi is not None:
            parts.append(f"float_range=({lo}, {hi})")
    if spec.scale_dtype:
        parts.append(f"scale_dtype={spec.scale_dtype}")
    if spec.range_calculator:
        parts.append(f"range_calculator={spec.range_calculator}")
    return "{" + ", ".join(parts) + "}"


# ---------------------------------------------------------------------- the observer


class RemoteObserver(ObserverBase):
    """A torch.ao.quantization observer whose statistics live in a qparams session.

    Use it wherever torch.ao takes an observer, through `with_args`:
    `QConfig(activation=RemoteObserver.with_args(run="exp1"),
    weight=RemoteObserver.with_args(run="exp1", dtype=torch.qint8,
    qscheme=torch.per_channel_symmetric, target="weight"))`.

    The session is created on the first `forward` (or read), as
    `client.create_session(session_name, spec, calculator=..., averaging_constant=...)`.
    If it exists already (another data-parallel rank made it, or a rerun), it is used
    after checking that its calculator, dtype, qscheme, granularity, target (and the
    other spec fields given here) are the requested ones; a difference raises
    qparams.AlreadyExists naming the field.

    Args (all keyword, all optional):
        dtype: torch.quint8 (default) or torch.qint8 ("uint8" and "int8"), or a
            qparams dtype name: "int8", "uint8", "int4", "float8_e4m3fn", ...
        qscheme: a torch qscheme, torch.per_tensor_affine (default; qparams
            "asymmetric", per_tensor), per_tensor_symmetric ("symmetric"),
            per_channel_affine / per_channel_symmetric (per_channel:ch_axis); or a
            qparams qscheme name, "symmetric", "asymmetric" or
            "symmetric_with_clipping" (per_tensor unless `granularity` says otherwise).
        ch_axis: the channel axis of the per_channel qschemes (default 0; may be
            negative).
        granularity: a qparams granularity ("per_channel:1", "per_block:1:32", a
            mapping...) that replaces the one the qscheme gives.
        calculator: "global_minmax" (default; matches MinMaxObserver and
            PerChannelMinMaxObserver bit for bit), "moving_average" (differs from
            torch.ao's moving-average observers by design, up to 0.5% per channel:
            coreai_opt averages the zero-clamped range), "static" or "default".
        target: "activation" (default) or "weight".
        quant_min, quant_max: the integer range, both or neither (default: the dtype's).
        spec: further qparams spec fields, e.g. {"scale_dtype": "float8_e8m0fnu"} or
            {"float_range": (None, 6.0)} (see qparams.quant_spec); not the fields above.
        averaging_constant: moving_average's constant (server default 0.01).
        run: the session-name prefix (default: qparams.torch.default_run()).
        name: the full session name; default f"{run}/observer.{k}", k counting the
            observers made in this process (see name_observers).
        reduce: how forward sends a tensor (Client.observe): "auto" (default),
            "always" (block minima and maxima), "never" (the tensor itself).
        server: the server's address; default $QPARAMS_TARGET, else 127.0.0.1:50051.
        client_options: keyword arguments of qparams.Client (token, tls_ca, ...).

    Attributes read by torch.ao's convert: `dtype` (torch.qint8 or torch.quint8; also
    for other qparams dtypes, signed or floating-point ones as qint8, unsigned as
    quint8, so that prepare inserts the observer; their calculate_qparams refuses),
    `qscheme` (the torch qscheme of the spec), `ch_axis`, `quant_min`, `quant_max`
    (as given, else, for int8/uint8, the session's resolved range once the session
    is opened by the first forward or read) and `reduce_range` (False).
    Also `last_observation`: the concurrent.futures.Future of the latest observation
    `forward` queued (its qparams.ObserveResult, without qparams: calculate_qparams
    reads them; or the error the server answered), or None; waiting on it does not
    take the error that the next call raises.

    Raises:
        ValueError, TypeError: an argument with no qparams meaning (a malformed
            granularity, an unknown qscheme, target or reduce, a torch dtype other
            than qint8/quint8, spec keys that have their own argument...). The server
            judges the rest at the first forward (qparams.InvalidArgument).
    """

    def __init__(self, *, dtype: torch.dtype | str = torch.quint8,
                 qscheme: torch.qscheme | str = torch.per_tensor_affine, ch_axis: int = 0,
                 granularity: GranularityLike | None = None,
                 calculator: str = "global_minmax", target: str = "activation",
                 quant_min: int | None = None, quant_max: int | None = None,
                 spec: Mapping[str, Any] | None = None,
                 averaging_constant: float | None = None, run: str | None = None,
                 name: str | None = None, reduce: str = "auto", server: str | None = None,
                 client_options: Mapping[str, Any] | None = None) -> None:
        # dtype, as qparams names it
        if isinstance(dtype, torch.dtype):
            if dtype == torch.qint8:
                qdtype = "int8"
            elif dtype == torch.quint8:
                qdtype = "uint8"
            else:
                raise ValueError(f"dtype {dtype} has no qparams counterpart; use torch.qint8, "
                                 "torch.quint8 or a qparams dtype name such as \"int4\"")
        elif isinstance(dtype, str) and dtype:
            qdtype = dtype
        else:
            raise TypeError(f"dtype must be torch.qint8, torch.quint8 or a qparams dtype "
                            f"name, not {dtype!r}")
        # qscheme, and the granularity it implies
        per_channel = False
        if isinstance(qscheme, str):
            if qscheme not in _QSCHEME_NAMES:
                raise ValueError(f"qscheme {qscheme!r} is not one of {', '.join(_QSCHEME_NAMES)}"
                                 " or a torch qscheme")
            qqscheme = qscheme
        else:
            for torch_qscheme, qqscheme, per_channel in _TORCH_QSCHEMES:
                if qscheme == torch_qscheme:
                    break
            else:
                raise ValueError(f"qscheme {qscheme} is not supported; use per_tensor_affine, "
                                 "per_tensor_symmetric, per_channel_affine, "
                                 "per_channel_symmetric or a qparams qscheme name")
        if not isinstance(ch_axis, int) or isinstance(ch_axis, bool):
            raise TypeError(f"ch_axis must be an int, not {ch_axis!r}")
        if granularity is not None:
            g = _granularity(granularity)
        elif per_channel:
            g = pb.Granularity(per_channel=pb.PerChannel(axis=ch_axis))
        else:
            g = pb.Granularity(per_tensor=pb.PerTensor())
        if (quant_min is None) != (quant_max is None):
            raise ValueError("quant_min and quant_max go together (both or neither)")
        check_reduce(reduce)
        if spec is not None and not isinstance(spec, Mapping):
            raise TypeError(f"spec must be a mapping of qparams spec fields, "
                            f"not {type(spec).__name__}")
        own = sorted(set(spec or {}) & set(_OWN_KEYS))
        if own:
            raise ValueError(f"spec must not hold {own}: pass them as RemoteObserver's own "
                             "arguments")
        if not isinstance(calculator, str):
            raise TypeError(f"calculator must be a string, not {calculator!r}")
        full = quant_spec(dict(spec or {}), dtype=qdtype, qscheme=qqscheme, granularity=g,
                          target=target, quant_min=quant_min, quant_max=quant_max)
        canonical = _canonical_dtype(full.dtype)

        super().__init__(dtype=torch.quint8 if canonical.startswith("u") else torch.qint8)
        symmetric = full.qscheme in (pb.SYMMETRIC, pb.SYMMETRIC_WITH_CLIPPING)
        if g.WhichOneof("kind") == "per_channel":
            self.qscheme = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
            self.ch_axis = g.per_channel.axis
        else:
            self.qscheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
            self.ch_axis = ch_axis
        # Unset ones are the server's to resolve: the session's spec fills them in (_open),
        # before torch.ao reads them (convert clamps weights to them after observing).
        self.quant_min = None if quant_min is None else int(quant_min)
        self.quant_max = None if quant_max is None else int(quant_max)
        self.reduce_range = False

        self.calculator = calculator
        self.averaging_constant = averaging_constant
        self.reduce = reduce
        self.server = _resolve_server(server)
        self.client_options = dict(client_options or {})
        if "target" in self.client_options:
            raise ValueError("client_options must not hold target; pass server= instead")
        self._client_key = _client_key(self.server, self.client_options)
        self.run = run if run is not None else default_run()
        if name is None:
            with _lock:
                k = next(_counter)
            name = f"{self.run}/observer.{k}"
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string, not {name!r}")
        self._spec = full
        self._request_key = (full.SerializeToString(deterministic=True), calculator,
                             averaging_constant)
        self._name = name
        self._used_name: str | None = None   # the name this observer opened its session as
        self._client: Client | None = None
        self._client_generation = -1
        #: The Future of the latest observation forward sent (its ObserveResult, or the
        #: error the server answered); None before the first one.
        self.last_observation: Any = None

    # ------------------------------------------------------------------ properties

    @property
    def session_name(self) -> str:
        """The name of this observer's session."""
        return self._name

    @property
    def quant_spec(self) -> pb.QuantSpec:
        """The qparams.v1.QuantSpec this observer asks for (a copy; the server fills in
        the defaults of what is unset)."""
        spec = pb.QuantSpec()
        spec.CopyFrom(self._spec)
        return spec

    @property
    def client(self) -> Client:
        """The qparams.Client this observer uses, shared by the observers of this
        process with the same server and client options (see shared_client)."""
        if self._client is None or self._client_generation != _generation:
            generation = _generation
            self._client = shared_client(self.server, self.client_options)
            self._client_generation = generation
        return self._client

    # ------------------------------------------------------------------ observer API

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Observes x and returns it unchanged (the same object).

        x (float32, float16, bfloat16 or float64, any device and strides) is detached,
        reduced to its block minima and maxima where it lives (see `reduce`), and queued
        for the client's background sender; this returns without waiting for the
        server. An empty x is skipped, as torch.ao's observers skip it. The session is
        created (or checked) on the first call.

        Raises:
            QParamsError: the first failure of an earlier observation of the shared
                client, not raised yet (x is then not observed), or a failure to create
                or check the session.
            TypeError: x is not a tensor of a supported dtype.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"RemoteObserver observes torch tensors, not {type(x).__name__}")
        if x.numel() == 0:
            return x
        self._open(x.dim())
        # Each observation's qparams would only be discarded: calculate_qparams reads
        # the session's.
        self.last_observation = self.client.observe_async(self._name, x.detach(),
                                                          reduce=self.reduce, omit_qparams=True)
        return x

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every queued observation of the shared client (this observer's
        and the others') is answered; raises the first failure among them not raised
        yet (a qparams.QParamsError naming its session), once.

        Raises:
            TimeoutError: observations still unanswered after `timeout` seconds.
        """
        self.client.flush(timeout)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Flushes, then returns the session's (scale, zero_point) as torch.ao expects:
        a float32 scale and a zero point of shape [1] (per-tensor) or [C]
        (per-channel, C the size of the channel axis; ch_axis is normalised to a
        non-negative axis here), int32 for an affine qscheme and int64 for a symmetric
        one, as torch.ao's MinMaxObserver and PerChannelMinMaxObserver return them. A
        session that never saw data warns and gives
        ([1.0], [0]), as torch.ao's observers do.

        Only int8/uint8 specs with a per-tensor or per-channel granularity and float32
        scales have this form; for the others (per_block, int4, fp8, fp4, e8m0 scales...)
        this raises ValueError, and get_qparams() reads their qparams.

        Raises:
            ValueError: a spec torch.ao cannot convert.
            QParamsError: a failure of an earlier observation, or of the read.
        """
        self.flush()
        refusal = self._torch_refusal()
        if refusal:
            raise ValueError(
                f"RemoteObserver {self._name!r}: torch.ao.quantization cannot convert the "
                f"spec {_describe_spec(self._spec)}: {refusal}. The session calibrates all "
                "the same; read its qparams with get_qparams() and apply them yourself.")
        q = self._read()
        if not q.initialized:
            warnings.warn(f"session {self._name!r} has observed no data: run the observer "
                          "before calculate_qparams; returning the default scale 1.0 and "
                          "zero point 0")
            return torch.tensor([1.0]), torch.tensor([0])
        if q.zero_point is None:  # the checks above exclude it; the server decides
            raise ValueError(f"RemoteObserver {self._name!r}: session has no zero point, "
                             "which torch.ao.quantization needs; use get_qparams()")
        if self._spec.granularity.WhichOneof("kind") == "per_channel":
            rank = len(q.shape)
            axis = self._spec.granularity.per_channel.axis
            if not -rank <= axis < rank:
                raise ValueError(f"RemoteObserver {self._name!r}: channel axis {axis} does not "
                                 f"fit qparams of rank {rank}")
            axis %= rank
            self.ch_axis = axis
            count = q.shape[axis]
        else:
            count = 1
        scale = torch.from_numpy(np.ascontiguousarray(q.scale, np.float32).reshape(count))
        # torch.ao's own dtypes: int32 for the affine schemes, int64 for the symmetric.
        affine = self.qscheme in (torch.per_tensor_affine, torch.per_channel_affine)
        zero_point = torch.from_numpy(
            q.zero_point.astype(np.int32 if affine else np.int64).reshape(count))
        return scale, zero_point

    def get_qparams(self) -> QParams:
        """Flushes, then returns the session's qparams (scale, zero_point, minval as
        torch tensors of shape `shape`, the blocks per input dim), for every spec.
        Before any data, they are empty with `initialized` False."""
        self.flush()
        return self._read().to_torch()

    def extra_repr(self) -> str:
        """The module's repr: session name, calculator and requested spec."""
        calculator = self.calculator or "default"
        text = f"session={self._name!r}, calculator={calculator!r}"
        if self.averaging_constant is not None:
            text += f", averaging_constant={self.averaging_constant}"
        return f"{text}, spec={_describe_spec(self._spec)}"

    # ------------------------------------------------------------------ copies

    def __getstate__(self) -> dict[str, Any]:
        """The state copy.deepcopy and pickle take: all but the client and the Future."""
        state = self.__dict__.copy()
        # The client (a gRPC channel) and the Future are this process's; a copy finds
        # the shared client again on first use.
        state["_client"] = None
        state["_client_generation"] = -1
        state["last_observation"] = None
        return state

    # ------------------------------------------------------------------ helpers

    def _resolved_calculator(self) -> str:
        if self.calculator in ("", "default"):
            return "static" if self._spec.target == pb.WEIGHT else "moving_average"
        return self.calculator

    def _torch_refusal(self) -> str:
        reasons = []
        dtype = _canonical_dtype(self._spec.dtype)
        if dtype not in ("int8", "uint8"):
            reasons.append(f"dtype {dtype} is not int8 or uint8, the dtypes torch.ao converts")
        if self._spec.scale_dtype:
            reasons.append(f"scale_dtype {self._spec.scale_dtype} has no zero point, and "
                           "torch.ao takes float32 scales with integer zero points")
        if self._spec.granularity.WhichOneof("kind") == "per_block":
            reasons.append(f"granularity {granularity_text(self._spec.granularity)} is "
                           "per-block, and torch.ao takes per-tensor or per-channel qparams")
        return "; ".join(reasons)

    def _read(self) -> QParams:
        self._open(None)
        return self.client.get_qparams(self._name)

    def _open(self, rank: int | None) -> None:
        """Creates the session, or checks the one that exists, once per process."""
        key = (self._client_key, self._name, self._request_key)
        if key in _opened:
            self._used_name = self._name
            return
        client = self.client
        try:
            session = client.create_session(self._name, self._spec, calculator=self.calculator,
                                            averaging_constant=self.averaging_constant)
        except AlreadyExists:
            session = client.get_session(self._name)
            if rank is None and session.initialized:
                rank = len(session.qparams.shape)
            self._check(session, rank)
        if _canonical_dtype(session.spec.dtype) in ("int8", "uint8"):
            self.quant_min = int(session.spec.quant_min)
            self.quant_max = int(session.spec.quant_max)
        with _lock:
            _opened.add(key)
        self._used_name = self._name

    def _check(self, session: pb.Session, rank: int | None) -> None:
        """Raises AlreadyExists if the existing `session` is not the one asked for."""
        want, have = self._spec, session.spec
        diffs: list[tuple[str, Any, Any]] = []
        calculator = self._resolved_calculator()
        if session.calculator != calculator:
            diffs.append(("calculator", session.calculator, calculator))
        if have.dtype != _canonical_dtype(want.dtype):
            diffs.append(("dtype", have.dtype, _canonical_dtype(want.dtype)))
        if have.qscheme != (want.qscheme or pb.SYMMETRIC):
            diffs.append(("qscheme", pb.QScheme.Name(have.qscheme).lower(),
                          pb.QScheme.Name(want.qscheme or pb.SYMMETRIC).lower()))
        if not _same_granularity(want.granularity, have.granularity, rank):
            diffs.append(("granularity", granularity_text(have.granularity),
                          granularity_text(want.granularity)))
        if have.target != (want.target or pb.WEIGHT):
            diffs.append(("target", pb.Target.Name(have.target).lower(),
                          pb.Target.Name(want.target or pb.WEIGHT).lower()))
        if want.HasField("quant_min") and \
                (have.quant_min, have.quant_max) != (want.quant_min, want.quant_max):
            diffs.append(("quant_min/quant_max", (have.quant_min, have.quant_max),
                          (want.quant_min, want.quant_max)))
        if want.float_range != have.float_range:
            diffs.append(("float_range", str(have.float_range).strip() or "unset",
                          str(want.float_range).strip() or "unset"))
        if want.scale_dtype and _SCALE_ALIASES.get(want.scale_dtype, want.scale_dtype) \
                != have.scale_dtype:
            diffs.append(("scale_dtype", have.scale_dtype or "unset", want.scale_dtype))
        if want.range_calculator and want.range_calculator != have.range_calculator:
            diffs.append(("range_calculator", have.range_calculator, want.range_calculator))
        if calculator == "moving_average" and self.averaging_constant is not None \
                and session.averaging_constant != float(self.averaging_constant):
            diffs.append(("averaging_constant", session.averaging_constant,
                          self.averaging_constant))
        if diffs:
            text = "; ".join(f"{field} is {h!r}, not the requested {w!r}" for field, h, w in diffs)
            error = AlreadyExists(
                f"session {self._name!r} already exists with another spec: {text}. Delete it "
                "(Client.delete_session), or give this observer another name or run")
            error.session = self._name
            raise error


def name_observers(model: torch.nn.Module, run: str | None = None) -> dict[str, RemoteObserver]:
    """Names the session of every RemoteObserver in `model` after its module:
    f"{run}/{qualified_name}", e.g. "exp1/fc1.activation_post_process".

    Call it right after torch.ao's `prepare` (or `prepare_fx`), before calibrating, so
    that the sessions carry module names; data-parallel ranks that prepare the same
    model get the same names.

    Args:
        model: the prepared model.
        run: the prefix; default each observer's own `run`.

    Returns:
        {session name: observer}, in `model.named_modules()` order.

    Raises:
        RuntimeError: an observer already created or used its session under another
            name (nothing is renamed then).
    """
    names: dict[str, RemoteObserver] = {}
    for qualified, module in model.named_modules():
        if not isinstance(module, RemoteObserver):
            continue
        prefix = run if run is not None else module.run
        new = f"{prefix}/{qualified or 'observer'}"
        if module._used_name is not None and module._used_name != new:
            raise RuntimeError(
                f"observer {qualified or '(the model)'} already uses its session "
                f"{module._used_name!r}; name_observers must run before it observes "
                f"(right after prepare), not after (it would become {new!r})")
        names[new] = module
    for new, module in names.items():
        module._name = new
    return names
