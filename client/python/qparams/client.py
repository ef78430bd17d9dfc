"""qparams.Client: one object for the whole qparams.v1 service, one method per RPC.

Modelled on tritonclient's gRPC client: a typed result per call, exceptions named
after the gRPC codes (qparams.NotFound, ...) carrying the server's message unchanged,
and streaming helpers (observe_many over one stream; observe_async, batched by a
background thread).
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import queue as queue_module
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import grpc

from qparams._background import ObserveQueue
from qparams._export import (decode_compressed_tensors, decode_modelopt, refine_export_error,
                             require_torch)
from qparams._errors import (Aborted, FailedPrecondition, IncompleteListing, InvalidArgument,
                             NotFound, QParamsError, error_from_rpc)
from qparams._fork_proxy import ForkProxy, needs_proxy
from qparams._health.v1 import health_pb2, health_pb2_grpc
from qparams._histogram import (Histogram, HistogramParamsLike, histogram_params,
                                histogram_request)
from qparams._retry import Keys, RetryPolicy, retryable_error
from qparams._results import (SHARES, GroupQParams, ObserveResult, QParams, ScaleGroup,
                              stream_outcome)
# The headers stay importable from here, where they were defined.
from qparams._routing import REPLICA_HEADER, SESSION_HEADER
from qparams._routing import (Router, SlotMap, merge_by_name, replica_header, session_header,
                              valid_replica)
from qparams._spec import GranularityLike, SpecLike, granularity, quant_spec
from qparams import _steps
from qparams._steps import StepContribution, StepRead, StepResult
from qparams._tensors import TensorLike, fill_tensor, range_request, tensor_request
from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    import torch

__all__ = ["Client", "DEFAULT_TARGET"]

#: Where a Client connects without a target argument or $QPARAMS_TARGET (`make run`).
DEFAULT_TARGET = "127.0.0.1:50051"
_REDUCE = ("auto", "always", "never")

#: A call's own metadata: (key, value) pairs, sent after the client's.
Metadata = Sequence[tuple[str, str]] | None
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")


def _check_metadata(metadata: Metadata) -> tuple[tuple[str, str], ...]:
    """`metadata` as a tuple; ValueError for a pair gRPC would refuse mid-call."""
    if not metadata:
        return ()
    pairs = tuple(metadata)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)
                and isinstance(pair[1], (str, bytes))):
            raise ValueError(f"metadata must be (key, value) pairs of strings, not {pair!r}")
        key = pair[0]
        if not _METADATA_KEY.fullmatch(key) or key.startswith("grpc-"):
            raise ValueError(f"metadata key {key!r} must be lowercase [0-9a-z_.-] and not "
                             "start with grpc-")
        if key.endswith("-bin") != isinstance(pair[1], bytes):
            raise ValueError(f"metadata key {key!r}: a value is bytes exactly when the key "
                             "ends in -bin")
    return pairs


def _joined(base: tuple[tuple[str, str], ...] | None,
            metadata: Metadata) -> tuple[tuple[str, str], ...] | None:
    """`base` (the client's metadata, or None) followed by a call's own."""
    return base if not metadata else (base or ()) + _check_metadata(metadata)


def check_reduce(reduce: str) -> None:
    """ValueError unless `reduce` is one of auto, always, never."""
    if reduce not in _REDUCE:
        raise ValueError(f"reduce {reduce!r} is not one of {', '.join(_REDUCE)}")


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what} {path!r} cannot be read: {e.strerror}") from None


def _failed_item(error: QParamsError) -> pb.ObserveResponse:
    """The response of an observation whose call failed with `error`."""
    return pb.ObserveResponse(status=pb.RpcStatus(code=error.code.value[0], message=error.message))


def _merged(replicas: Sequence[str], read: Callable[[str], Iterator[Any]]) -> Iterator[Any]:
    """The named items of read(replica) for every replica, merged in name order. A
    replica that cannot be read (Unavailable, DeadlineExceeded, Unknown) ends its
    part, and IncompleteListing names it after the last item of the others; any
    other error is raised as it comes."""
    missing: dict[str, QParamsError] = {}

    def part(replica: str) -> Iterator[Any]:
        try:
            yield from read(replica)
        except QParamsError as e:
            if not retryable_error(e):
                raise
            missing[replica] = e

    yield from merge_by_name(part(replica) for replica in replicas)
    if missing:
        raise IncompleteListing(missing)


class _Layout(NamedTuple):
    """What reducing a tensor for a session needs to know of it."""

    spec: pb.QuantSpec
    histogram: pb.HistogramParams | None  # histogram sessions only

    @classmethod
    def of(cls, session: pb.Session) -> "_Layout":
        return cls(session.spec,
                   session.histogram if session.HasField("histogram") else None)


class Client:
    """A client of a qparams server. Thread-safe; a context manager that closes it.

    Sharded deployments (replicas behind HAProxy, docs/sharding.md): a call naming
    one session carries it in the x-qparams-session header, on which the balancer
    routes it to the owner. Calls over many sessions (observe_many, observe_batch,
    observe_async, step, resume_steps) and over all of them (list_sessions, read_sessions,
    list_scale_groups) are split into one call per owning replica, addressed by the
    x-qparams-replica header, using the
    topology read once with GetTopology at the first such call (qparams/_routing.py
    decides; the client makes the calls). Against one server
    (no slot map) or one replica they make the single call they always did. Clients
    follow online moves (docs/sharding.md): a call or an item a replica refuses
    naming another owner is sent there, the topology read again; an owner that
    cannot be reached yet is retried as an Unavailable call is (see retry_total).
    GetTopology goes to any healthy replica through the balancer, else to each
    replica of the topology read before.

    Args:
        target: "host:port" or any gRPC target; default $QPARAMS_TARGET, else
            127.0.0.1:50051.
        token: a bearer token sent on every qparams call (not on health); default
            $QPARAMS_TOKEN, else none. Use TLS beyond loopback.
        tls: connect with TLS and the system's roots (implied by tls_ca/tls_cert).
        tls_ca: PEM file of the roots the server's certificate must chain to.
        tls_cert, tls_key: PEM files of a client certificate and its key (mutual TLS).
        tls_server_name: the name the server's certificate must carry, if not the
            target's host (e.g. "localhost" while connecting to 127.0.0.1).
        timeout: the deadline of each unary call, in seconds.
        max_message_bytes: the largest message sent or received (a tensor travels in
            one message; the server's default limit is 64 MiB).
        replica: in a sharded deployment, address every call to this replica (its
            name in the slot map), through the balancer or straight to it, instead
            of routing each: e.g. to list one replica's sessions. The replica
            refuses calls if it is another. Default: route.
        metadata: (key, value) pairs sent with every call, the background
            observations' included (each method also takes `metadata=` for its own
            calls, sent after these).
        idempotency_keys: every observation carries this client's random
            `client_id` and the next sequence of its session, so that the server
            applies it at most once (docs/retries.md). False: no keys, no retries.
        retry_total: observations (observe, observe_histogram, observe_batch,
            observe_many, observe_async's batches) that fail with Unavailable,
            DeadlineExceeded or Unknown (a call a proxy reset, docs/retries.md), as a
            call or as an item, or that a replica refuses
            naming an owner that then fails so, are sent again with the same key
            while the next attempt would start within this many seconds of the
            first; each attempt has its own `timeout`. 0: no retry.
        retry_initial_backoff, retry_max_backoff: the wait before the first retry
            (jittered in its upper half), doubling up to the maximum, in seconds.

    Every method that makes calls takes `timeout=` (seconds; default the client's)
    and `metadata=`. After fork(), the parent's client works on, and so does the
    child's copy, and so does a Client the child creates (a DataLoader
    worker_init_fn, a multiprocessing function): when the parent had made calls,
    gRPC cannot open channels in the child, so the child's first call starts a
    helper process that makes its calls (see qparams/_fork_proxy.py; its streams
    are then sent whole, not pipelined). What the parent had queued stays the
    parent's. A "spawn" or "forkserver" child makes clients of its own (a
    RemoteObserver pickled to it does so by itself).

    Raises:
        ValueError: a bad argument (timeout <= 0, retry_total < 0,
            retry_initial_backoff <= 0 or above retry_max_backoff, only one of tls_cert/tls_key, an
            unreadable TLS file, a token metadata cannot carry, a replica name that is
            not 1 to 64 characters of [a-zA-Z0-9._-]).
    """

    def __init__(self, target: str | None = None, *, token: str | None = None,
                 tls: bool = False, tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, tls_server_name: str | None = None,
                 timeout: float = 30.0, max_message_bytes: int = 64 << 20,
                 replica: str | None = None,
                 metadata: Metadata = None, idempotency_keys: bool = True,
                 retry_total: float = 30.0, retry_initial_backoff: float = 0.05,
                 retry_max_backoff: float = 5.0) -> None:
        self.target = target or os.environ.get("QPARAMS_TARGET") or DEFAULT_TARGET
        # What a forked child's helper process builds its own client from (_after_fork).
        self._kwargs = dict(target=self.target, token=token, tls=tls, tls_ca=tls_ca,
                            tls_cert=tls_cert, tls_key=tls_key,
                            tls_server_name=tls_server_name, timeout=timeout,
                            max_message_bytes=max_message_bytes, replica=replica,
                            metadata=metadata, idempotency_keys=idempotency_keys,
                            retry_total=retry_total, retry_initial_backoff=retry_initial_backoff,
                            retry_max_backoff=retry_max_backoff)
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        if max_message_bytes <= 0:
            raise ValueError(f"max_message_bytes must be > 0, not {max_message_bytes!r}")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together (a client certificate and its key)")
        token = token if token is not None else os.environ.get("QPARAMS_TOKEN", "")
        if token and not (len(token) <= 4096 and token.isascii() and token.isprintable()
                          and " " not in token):
            raise ValueError("token must be 1 to 4096 printable ASCII characters without spaces")
        if replica is not None and not valid_replica(replica):
            raise ValueError(f"replica {replica!r} is not 1 to 64 characters of [a-zA-Z0-9._-]")
        self.timeout = timeout
        self.replica = replica
        self._retry = RetryPolicy(retry_total, retry_initial_backoff, retry_max_backoff)
        self._keys = Keys(idempotency_keys)
        extra = _check_metadata(metadata)
        # Every qparams call's metadata; health sends only the replica's header.
        self._health_metadata = replica_header(replica) + extra or None
        self._metadata = ((("authorization", f"Bearer {token}"),) if token else ()) + (
            self._health_metadata or ()) or None

        self.max_message_bytes = max_message_bytes
        self._options = [("grpc.max_send_message_length", max_message_bytes),
                         ("grpc.max_receive_message_length", max_message_bytes)]
        self._credentials = None
        if tls or tls_ca or tls_cert:
            self._credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca, "tls_ca") if tls_ca else None,
                private_key=_read(tls_key, "tls_key") if tls_key else None,
                certificate_chain=_read(tls_cert, "tls_cert") if tls_cert else None)
            if tls_server_name:
                self._options.append(("grpc.ssl_target_name_override", tls_server_name))
        elif tls_server_name:
            raise ValueError("tls_server_name needs TLS (tls, tls_ca or tls_cert)")
        self._connect()
        # How to reduce tensors for each session this client reduced tensors for, by
        # name: its resolved spec and, for a histogram session, its histogram params.
        self._specs: dict[str, _Layout] = {}
        self._specs_lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._queue: ObserveQueue | None = None
        self._router = Router(replica, self._read_topology)

    # ------------------------------------------------------------------ lifecycle

    def _connect(self) -> None:
        """Opens the channel of this process (see _stub): through a helper process
        in a forked child whose parent ran gRPC (see qparams/_fork_proxy.py)."""
        if needs_proxy():
            proxy = ForkProxy(self._kwargs)
            self._channel = proxy
            self._service = proxy.stub("qparams.v1.QParamsService")
            self._health = proxy.stub("grpc.health.v1.Health")
        else:
            if self._credentials is not None:
                channel = grpc.secure_channel(self.target, self._credentials, self._options)
            else:
                channel = grpc.insecure_channel(self.target, self._options)
            self._channel = channel
            self._service = pb_grpc.QParamsServiceStub(channel)
            self._health = health_pb2_grpc.HealthStub(channel)
        self._pid = os.getpid()

    @property
    def _stub(self) -> pb_grpc.QParamsServiceStub:
        """The service stub of this process: after fork() a child calls through a
        helper process of its own (see _fork_proxy.py) and drops the parent's
        background queue, whose observations the parent sends."""
        self._in_this_process()
        return self._service

    def _in_this_process(self) -> None:
        """After fork(), in the child: this client's own channel and queue."""
        if self._pid != os.getpid():
            self._after_fork()

    @property
    def client_id(self) -> str:
        """The random id this client keys its observations with in this process
        (a forked child's is its own): 22 characters of [A-Za-z0-9_-]."""
        return self._keys.client_id

    def _after_fork(self) -> None:
        # Locks held by the parent's threads at fork time stay held in the child:
        # every one this client uses is replaced, not acquired.
        self._queue_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._queue = None
        self._specs_lock = threading.Lock()
        self._router.after_fork()
        self._connect()

    def close(self) -> None:
        """Sends what observe_async queued, then closes the channel."""
        if self._pid != os.getpid():
            return  # the parent's channel and queue, which the parent closes
        with self._queue_lock:
            queue, self._queue = self._queue, None
        if queue is not None:
            queue.close()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"qparams.Client({self.target!r})"

    def _call(self, method: str, request: Any, timeout: float | None = None,
              metadata: Metadata = None, replica: str | None = None, *,
              route: str | None = None) -> Any:
        """A unary call of the stub's `method`, routed by the session (or group) its
        request names, or by `route` if given, or addressed to `replica` (whose name
        then starts the error's message); `metadata` is the caller's, sent after the
        client's."""
        if route is None:
            route = getattr(request, "name", "")
        sent = (self._routed(route, metadata) if replica is None
                else self._addressed(replica, metadata))
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                               metadata=sent)
        except grpc.RpcError as e:
            error = error_from_rpc(e, replica)
        owner = self._owner_to_retry(error, route if replica is None else "")
        if owner is None:
            raise error
        # The balancer's map or this client's topology is older than the replica's:
        # once more, addressed to the owner the refusal names.
        try:
            return getattr(self._stub, method)(
                request, timeout=timeout or self.timeout,
                metadata=self._addressed(owner, metadata) + session_header(route))
        except grpc.RpcError as e:
            retried = error_from_rpc(e, owner)
        # Refused as addressed to another replica (no owner named): this client reached
        # one replica straight, not a balancer; the first refusal says more.
        if isinstance(retried, FailedPrecondition) and not retried.owner:
            raise error
        raise retried

    def _owner_to_retry(self, error: QParamsError, session: str) -> str | None:
        """The replica to retry a call naming `session` at, after `error`: the owner a
        FailedPrecondition names, once the topology was read again; None when the call
        is not to be retried (another error, no session, a client pinned to a replica)."""
        if (not isinstance(error, FailedPrecondition) or not error.owner or not session
                or self.replica is not None):
            return None
        try:
            self._router.refresh()
        except QParamsError:
            pass  # the retry goes by the refusal's owner either way
        return error.owner

    def _follows(self, status: pb.RpcStatus) -> bool:
        """Whether an item refused with `status` is sent again to the owner it names:
        a refusal naming one, and a client not pinned to a replica."""
        return (status.code == FailedPrecondition.code.value[0] and bool(status.owner)
                and self.replica is None)

    def _observe_outcome(self, request: pb.ObserveRequest, name: str,
                         metadata: Metadata) -> ObserveResult | QParamsError:
        """One stream item observed in a unary call, as observe makes it (routed,
        following a refusal's owner, retried if keyed): its result, or its error
        naming `name`."""
        try:
            response = self._observe_call(request, None, metadata)
        except QParamsError as e:
            e.session = name
            return e
        return ObserveResult.from_response(response)

    def _rerouted(self, response: pb.ObserveResponse, request: pb.ObserveRequest, name: str,
                  metadata: Metadata) -> ObserveResult | QParamsError:
        """The outcome of one stream item: `response`'s, or, refused naming another
        owner, or failed retryably with a key (a slot frozen by a move), the outcome
        of observing it again as observe does (the owner may be down yet: retried
        while the retry policy allows). Items of one session are observed again one
        at a time, in order."""
        outcome = stream_outcome(response, name)
        if self._follows(response.status) or (request.client_id and retryable_error(outcome)):
            return self._observe_outcome(request, name, metadata)
        return outcome

    def _reroute_batch(self, request: pb.ObserveBatchRequest, response: pb.ObserveBatchResponse,
                       failed: dict[str, QParamsError], timeout: float | None,
                       metadata: Metadata) -> pb.ObserveBatchResponse:
        """`response` with the observations refused naming another owner sent again in
        one ObserveBatch per owner, addressed to it (the topology read again first);
        their answers replace the refusals, in order. A retry call that fails makes
        its error each of its observations' status (retryable if the call's error
        is: the owner may be down yet) and is kept in `failed` by owner."""
        moved: dict[str, list[int]] = {}
        for i, r in enumerate(response.responses):
            if self._follows(r.status):
                moved.setdefault(r.status.owner, []).append(i)
        if not moved:
            return response
        try:
            self._router.refresh()
        except QParamsError:
            pass
        for owner, indexes in sorted(moved.items()):
            part = pb.ObserveBatchRequest(observations=[request.observations[i] for i in indexes])
            try:
                answer = self._stub.ObserveBatch(part, timeout=timeout or self.timeout,
                                                 metadata=self._addressed(owner, metadata))
            except grpc.RpcError as e:
                failed[owner] = error_from_rpc(e, owner)
                for i in indexes:
                    response.responses[i].CopyFrom(_failed_item(failed[owner]))
                continue
            if len(answer.responses) == len(indexes):
                for i, r in zip(indexes, answer.responses):
                    response.responses[i].CopyFrom(r)
        return response

    def _addressed(self, replica: str | None,
                   metadata: Metadata = None) -> tuple[tuple[str, str], ...] | None:
        """The call's metadata: the token, the client's and the caller's metadata,
        and the header addressing it to `replica` (None: unaddressed)."""
        return (_joined(self._metadata, metadata) or ()) + replica_header(replica) or None

    def _routed(self, session: str,
                metadata: Metadata = None) -> tuple[tuple[str, str], ...] | None:
        """The call's metadata: as _addressed, and the routing header of the session
        it names, on which a balancer in front of sharded replicas routes."""
        return (_joined(self._metadata, metadata) or ()) + session_header(session) or None

    # ------------------------------------------------------------------ the RPCs

    def list_calculators(self, *,
                         timeout: float | None = None, metadata: Metadata = None
                        ) -> list[pb.CalculatorInfo]:
        """The calculator registry (key, stateful, description), sorted by key."""
        return list(self._call("ListCalculators", pb.ListCalculatorsRequest(), timeout,
                               metadata).calculators)

    def compute(self, x: TensorLike, spec: SpecLike | None = None, *, calculator: str = "",
                reduce: str = "auto", timeout: float | None = None, metadata: Metadata = None,
                **spec_fields: Any) -> QParams:
        """The qparams of one tensor, stateless: calculator "" (= dynamic), "dynamic"
        or "static". The spec is a mapping or QuantSpec and/or keywords (see
        qparams.quant_spec), e.g. compute(x, dtype="int8", granularity="per_channel:0").

        reduce: as for observe: "auto" (default) sends the block minima and maxima
        when they are smaller than x, so a tensor of any size can be computed (the
        qparams are bit for bit those of x); "never" sends x, which must then fit in
        max_message_bytes. Compute's calculators take no symmetric_with_clipping
        qscheme and no float_range unless calculator="static" (the server refuses
        them with InvalidArgument).

        Raises:
            TypeError: x is not a float32/float16/float64 array or supported tensor.
            ValueError: a malformed spec value (see quant_spec) or reduce, or x sent
                whole over max_message_bytes (before any call).
            InvalidArgument: a spec or tensor the server refuses (non-finite values...).
        """
        check_reduce(reduce)
        request = pb.ComputeRequest(calculator=calculator, spec=quant_spec(spec, **spec_fields))
        observation = (tensor_request("", x) if reduce == "never" else
                       range_request("", x, request.spec, reduce))
        if observation.HasField("range"):
            request.range.CopyFrom(observation.range)
        else:
            self._check_size(observation.tensor.data, reduce)
            request.tensor.CopyFrom(observation.tensor)
        return QParams.from_proto(self._call("Compute", request, timeout, metadata).qparams)

    def create_session(self, name: str, spec: SpecLike | None = None, *, calculator: str = "",
                       averaging_constant: float | None = None,
                       histogram: HistogramParamsLike = None,
                       timeout: float | None = None, metadata: Metadata = None,
                       **spec_fields: Any) -> pb.Session:
        """Creates the session `name` and returns it (its spec resolved).

        calculator: "static", "moving_average", "global_minmax", the histogram
        calculators "percentile", "entropy", "mse", or "" for the default (static for
        weights, moving_average for activations). Choosing an observer as a torch.ao
        user: global_minmax matches MinMaxObserver/PerChannelMinMaxObserver bit for bit;
        moving_average averages the zero-clamped range (coreai_opt), not torch.ao's raw
        one, and can differ from MovingAverage*MinMaxObserver by up to 0.5% per channel;
        percentile, entropy and mse choose a clipping range (per-tensor only) from a
        histogram of |x| that gives the same result whatever the batch order or the split
        of the data across ranks (torch.ao's HistogramObserver depends on both); each
        clips some kinds of outliers and keeps others (entropy's defaults keep the full
        range when the outliers lie more than about 32x beyond the bulk): see
        docs/histograms.md, "Choosing a calibrator".
        histogram: the histogram calculators' parameters, a dict (or a
            qparams.pb.HistogramParams) with any of num_bins (a power of two in
            [256, 65536], default 4096), percentile ((0, 100], default 99.99; percentile
            only), start_bin and stride (entropy and mse only; defaults 128 and 1),
            skip_zeros (False) and nonfinite ("reject", the default, or "ignore").

        Raises:
            ValueError: no target, or a malformed spec value or histogram key, before any
                call.
            AlreadyExists: the name is taken. InvalidArgument: a bad name, spec or
                histogram parameter.
            ResourceExhausted: the server's session limit.
        """
        request = pb.CreateSessionRequest(name=name, calculator=calculator,
                                          spec=quant_spec(spec, **spec_fields))
        if histogram is not None:  # present even when empty: every default
            request.histogram.SetInParent()
            request.histogram.MergeFrom(histogram_params(histogram))
        if request.spec.target == pb.TARGET_UNSPECIFIED:
            raise ValueError(
                "create_session needs target=\"weight\" or target=\"activation\" (in the spec "
                "or as a keyword): the two resolve to different defaults (weight: "
                "symmetric, calculator static; activation: calculator moving_average), so "
                "the client does not guess")
        if averaging_constant is not None:
            request.averaging_constant = averaging_constant
        session = self._call("CreateSession", request, timeout, metadata)
        self._remember(session)
        return session

    def get_session(self, name: str, *,
                    timeout: float | None = None, metadata: Metadata = None) -> pb.Session:
        """The session `name` (NotFound if there is none)."""
        session = self._call("GetSession", pb.GetSessionRequest(name=name), timeout, metadata)
        self._remember(session)
        return session

    def list_sessions(self, prefix: str = "", *, page_size: int = 0,

                      timeout: float | None = None, metadata: Metadata = None
                     ) -> Iterator[pb.Session]:
        """Every session whose name starts with `prefix`, in name order, fetching page
        after page (page_size 0: the server's default of 50; at most 1000). Sharded:
        each replica's pages, merged in name order.

        Raises:
            IncompleteListing: sharded, some replicas could not be read (Unavailable,
                DeadlineExceeded, Unknown): raised after the sessions of the others.
        """
        slot_map = self._router.slot_map()
        if slot_map is None:
            yield from self._list_pages(prefix, page_size, None, timeout, metadata)
            return
        yield from _merged(slot_map.replicas, lambda replica: self._list_pages(
            prefix, page_size, replica, timeout, metadata))

    def _list_pages(self, prefix: str, page_size: int, replica: str | None,
                    timeout: float | None, metadata: Metadata) -> Iterator[pb.Session]:
        """The sessions of one server or replica, page after page."""
        token = ""
        while True:
            page = self._call("ListSessions", pb.ListSessionsRequest(
                page_size=page_size, page_token=token, filter=prefix), timeout, metadata,
                replica)
            yield from page.sessions
            token = page.next_page_token
            if not token:
                return

    def read_sessions(self, prefix: str = "", *,

                      timeout: float | None = None, metadata: Metadata = None
                     ) -> Iterator[pb.Session]:
        """Every session whose name starts with `prefix`, in name order, streamed by the
        server in one call (ReadSessions), each read whole under its own lock: for
        exports and reports of many sessions. A session created or deleted meanwhile
        may or may not appear. The call's deadline is `timeout` (default: the
        client's); closing the iterator early cancels the call.

        Sharded: one stream from each replica, merged in name order.

        Raises:
            InvalidArgument: a prefix with characters no session name holds.
            IncompleteListing: sharded, some replicas could not be read (Unavailable,
                DeadlineExceeded, Unknown): raised after the sessions of the others.
        """
        slot_map = self._router.slot_map()
        replicas = [None] if slot_map is None else slot_map.replicas
        calls = [self._stub.ReadSessions(pb.ReadSessionsRequest(prefix=prefix),
                                         timeout=timeout or self.timeout,
                                         metadata=self._addressed(replica, metadata))
                 for replica in replicas]

        def read(call: Any, replica: str | None) -> Iterator[pb.Session]:
            try:
                yield from call
            except grpc.RpcError as e:
                raise error_from_rpc(e, replica) from None

        try:
            if len(calls) == 1:
                yield from read(calls[0], replicas[0])
            else:
                streams = dict(zip(replicas, calls))
                yield from _merged(replicas, lambda replica: read(streams[replica], replica))
        finally:
            for call in calls:
                call.cancel()

    def export(self, prefix: str, format: str, *, allow_uninitialized: bool = False,
               tensor_names: Mapping[str, str] | None = None,
               timeout: float | None = None, metadata: Metadata = None) -> str:
        """The sessions under `prefix` rendered by the server (ExportSessions) in a
        deployment format, as one JSON document (docs/exports.md).

        Args:
            prefix: the sessions' name prefix, stripped from the exported names.
            format: "aimet" (AIMET encodings 1.0.0), "onnx" (QuantizeLinear inputs),
                "compressed-tensors" or "modelopt" (NVFP4 scales and
                hf_quant_config.json); the server judges it.
            allow_uninitialized: leave sessions that never saw data out instead of
                failing.
            tensor_names: the exported name of a session's tensor, by the session's
                name without the prefix, e.g. qparams.torch.onnx_tensor_names(model,
                example) for an ONNX graph's names; others keep their names.
            timeout: the call's deadline in seconds (default: the client's).

        Returns:
            The document, decoded from UTF-8.

        Raises:
            TypeError: prefix or format is not a str.
            FailedPrecondition: uninitialized sessions under the prefix (named in the
                message), unless allow_uninitialized.
            FusedGlobalScalesDiffer: (a FailedPrecondition) NVFP4 fused siblings whose
                global scales differ, no GLOBAL_AMAX group covering them; `.members`
                names their sessions.
            UncalibratedGroup: (a FailedPrecondition) a GLOBAL_AMAX group of an
                exported session has members that never saw data (`.uncalibrated`).
            InvalidArgument: an unknown format, a bad prefix, or a session the format
                cannot express (named in the message).
            NotFound: no session under the prefix.
            Aborted: sharded, the slot map kept changing during the export (a move).
            ValueError: the server sent bytes that are not UTF-8.

        Sharded: one document of every replica's sessions, byte for byte a single
        server's (RenderExport over each replica's export items; docs/sharding.md).
        The replicas must serve one slot map epoch before and after their shares are
        read (else a session could be missed or read twice while a slot move
        switches); an export that saw it change is made again on the new topology,
        within the client's retry_total, then raises Aborted.
        """
        for what, value in (("prefix", prefix), ("format", format)):
            if not isinstance(value, str):
                raise TypeError(f"{what} must be a str, not {type(value).__name__}")
        request = pb.ExportSessionsRequest(prefix=prefix, format=format,
                                           allow_uninitialized=bool(allow_uninitialized),
                                           tensor_names=dict(tensor_names or {}))
        # A sharded export that saw the slot map change raises Aborted before any of
        # the document is read: again, on the newer topology, while retry_total allows.
        wait = self._retry.waits()
        while (slot_map := self._router.slot_map()) is not None:
            try:
                return self._export_sharded(request, slot_map.replicas, timeout, metadata)
            except Aborted:
                if not wait():
                    raise
        call = self._stub.ExportSessions(request, timeout=timeout or self.timeout,
                                         metadata=self._addressed(None, metadata))
        try:
            data = b"".join(chunk.data for chunk in call)
        except grpc.RpcError as e:
            raise refine_export_error(error_from_rpc(e)) from None
        finally:
            call.cancel()
        return data.decode("utf-8")

    def _export_sharded(self, request: pb.ExportSessionsRequest, replicas: list[str],
                        timeout: float | None, metadata: Metadata) -> str:
        """export() of a sharded deployment: each replica's share (ExportSessions with
        items, the replicas in name order, one after the other) forwarded into one
        RenderExport call, which checks and renders them all, so that the document
        (and any refusal) is a single server's. A replica's refusal is raised as it
        is (UNAVAILABLE and DEADLINE_EXCEEDED naming the replica), else the
        render's."""
        share = pb.ExportSessionsRequest()
        share.CopyFrom(request)
        share.items = True
        refused: list[tuple[str, grpc.RpcError]] = []
        changed: list[QParamsError] = []  # the epochs' check after the shares
        calls: list[Any] = []
        started = threading.Event()  # calls holds the render

        def requests() -> Iterator[pb.RenderExportRequest]:
            yield pb.RenderExportRequest(options=request)
            for replica in replicas:
                call = self._stub.ExportSessions(share, timeout=timeout or self.timeout,
                                                 metadata=self._addressed(replica, metadata))
                try:
                    for chunk in call:
                        yield pb.RenderExportRequest(items=chunk.items)
                except grpc.RpcError as e:
                    refused.append((replica, e))
                    started.wait()
                    calls[0].cancel()  # the render must not finish without this share
                    return
                finally:
                    call.cancel()
            # The shares hold each session once only if no slot changed owner while
            # they were read: the epoch every replica serves is still the one before.
            try:
                after = self._common_epoch(replicas, timeout, metadata)
                if after != epoch:
                    raise Aborted(f"the slot map changed during the export (epoch {epoch} "
                                  f"-> {after}); export again")
            except QParamsError as e:
                changed.append(e)
                started.wait()
                calls[0].cancel()

        epoch = self._common_epoch(replicas, timeout, metadata)
        render = self._stub.RenderExport(requests(), timeout=timeout or self.timeout,
                                         metadata=self._addressed(replicas[0], metadata))
        calls.append(render)
        started.set()
        def share_error() -> QParamsError:
            # A replica that cannot answer is named; its refusals read as one server's.
            replica, error = refused[0]
            unreachable = error.code() in (grpc.StatusCode.UNAVAILABLE,
                                           grpc.StatusCode.DEADLINE_EXCEEDED)
            return refine_export_error(error_from_rpc(error, replica if unreachable else None))

        try:
            data = b"".join(chunk.data for chunk in render)
        except grpc.RpcError as e:
            if changed:
                raise changed[0] from None
            raise (share_error() if refused else refine_export_error(error_from_rpc(e))) from None
        finally:
            render.cancel()
        if changed:
            raise changed[0] from None
        if refused:
            raise share_error() from None
        return data.decode("utf-8")

    def _common_epoch(self, replicas: list[str], timeout: float | None,
                      metadata: Metadata) -> int:
        """The slot map epoch every replica of `replicas` serves (GetTopology of each,
        offered to the router). Raises Aborted naming each one's when they differ (a
        slot move is switching), a replica's error naming it."""
        epochs = []
        for replica in replicas:
            topology = self._call("GetTopology", pb.GetTopologyRequest(), timeout, metadata,
                                  replica)
            self._router.offer(topology)  # the newest map routes the next attempt
            epochs.append(topology.epoch)
        if len(set(epochs)) > 1:
            seen = ", ".join(f"{r} epoch {e}" for r, e in zip(replicas, epochs))
            raise Aborted(f"the replicas serve different slot maps ({seen}): a slot move "
                          f"is switching; export again")
        return epochs[0]

    def export_compressed_tensors(self, prefix: str, *, allow_uninitialized: bool = False,
                                  tensor_names: Mapping[str, str] | None = None,
                                  timeout: float | None = None, metadata: Metadata = None
                                  ) -> tuple[dict[str, "torch.Tensor"], dict[str, Any]]:
        """The sessions under `prefix` as compressed-tensors' scale tensors and
        quantization_config: export(prefix, "compressed-tensors") decoded, for the
        caller to save with their own tooling (e.g. safetensors and config.json).

        Args:
            prefix, allow_uninitialized, tensor_names, timeout, metadata: as for
                export.

        Returns:
            (state_dict, quantization_config): the tensors by name (e.g.
            "fc1.weight_scale", float32; "fc1.weight_zero_point", int8; for NVFP4
            sessions "fc1.weight_scale" as a torch.uint8 tensor of float8_e4m3fn
            bytes, for which qparams.is_e4m3 is true) as torch tensors of the
            exported dtypes and shapes, and the quantization_config object as parsed
            from JSON.

        Raises:
            ImportError: torch is not installed (checked before the call).
            TypeError, FailedPrecondition, InvalidArgument, NotFound: as for export.
            ValueError: a document that is not compressed-tensors' JSON.
        """
        require_torch()
        return decode_compressed_tensors(self.export(
            prefix, "compressed-tensors", allow_uninitialized=allow_uninitialized,
            tensor_names=tensor_names, timeout=timeout, metadata=metadata))

    def export_modelopt(self, prefix: str, *, allow_uninitialized: bool = False,
                        tensor_names: Mapping[str, str] | None = None,
                        timeout: float | None = None, metadata: Metadata = None
                        ) -> tuple[dict[str, "torch.Tensor"], dict[str, Any]]:
        """The NVFP4 sessions (convention modelopt) under `prefix` as ModelOpt's scale
        tensors and hf_quant_config.json content: export(prefix, "modelopt") decoded.

        Args:
            prefix, allow_uninitialized, tensor_names, timeout, metadata: as for
                export.

        Returns:
            (state_dict, hf_quant_config): the tensors by name ("fc1.weight_scale", a
            torch.uint8 tensor of float8_e4m3fn bytes for which qparams.is_e4m3 is
            true; "fc1.weight_scale_2" and "fc1.input_scale", float32 scalars), and
            the hf_quant_config object as parsed from JSON.

        Raises:
            ImportError: torch is not installed (checked before the call).
            TypeError, FailedPrecondition, InvalidArgument, NotFound: as for export.
            ValueError: a document that is not a modelopt export's JSON.
        """
        require_torch()
        return decode_modelopt(self.export(
            prefix, "modelopt", allow_uninitialized=allow_uninitialized,
            tensor_names=tensor_names, timeout=timeout, metadata=metadata))

    def topology(self, *, timeout: float | None = None, metadata: Metadata = None) -> pb.Topology:
        """Which replica owns which slots (GetTopology): slot_count, the answering
        replica_id, the slot ranges and the replicas. A session's slot is
        zlib.crc32(part.encode()) % slot_count, the part being the name's hash tag
        (between its first "{" and the next "}", if not empty) or else the whole
        name. An unsharded server is one replica "" owning every slot. `epoch` is the
        slot map's (0 without one); a newer one than this client routes by replaces
        its routing."""
        topology = self._read_topology(self._router.replicas(), timeout=timeout,
                                       metadata=metadata)
        self._router.offer(topology)
        return topology

    def _read_topology(self, replicas: Sequence[str] = (), *, timeout: float | None = None,
                       metadata: Metadata = None) -> pb.Topology:
        """GetTopology through the balancer, which any healthy replica answers; if
        that fails as a transport does (Unavailable, DeadlineExceeded, Unknown),
        addressed to each of `replicas` in turn (the balancer may not have seen one
        die yet): the first answer, else the balancer's error. For the router, which
        holds its lock while it reads."""
        request = pb.GetTopologyRequest()
        try:
            return self._call("GetTopology", request, timeout, metadata, route="")
        except QParamsError as e:
            if not retryable_error(e) or self.replica is not None:
                raise
            first = e
        for replica in replicas:
            try:
                return self._call("GetTopology", request, timeout, metadata, replica)
            except QParamsError:
                continue  # down too, or a replica reached straight refusing the address
        raise first

    def set_slot_map(self, slot_map: str, *, timeout: float | None = None,
                     metadata: Metadata = None) -> pb.Topology:
        """Admin: gives the replica this client reaches (its `replica`, through a
        balancer) the slot map `slot_map`, a slot map file's text ("# epoch N"
        included), and returns that replica's topology after it (SetSlotMap,
        docs/sharding.md). Raises InvalidArgument for a map that does not parse,
        FailedPrecondition for an older epoch or a server without sharding,
        Unauthenticated without a valid token, PermissionDenied with a tenant's
        token or on a server without --admin_tokens_file (docs/security.md)."""
        topology = self._call("SetSlotMap", pb.SetSlotMapRequest(map=slot_map), timeout,
                              metadata)
        self._router.offer(topology)
        return topology

    def delete_session(self, name: str, *,
                       timeout: float | None = None, metadata: Metadata = None) -> None:
        """Deletes the session `name` (NotFound if there is none)."""
        with self._specs_lock:
            self._specs.pop(name, None)
        self._call("DeleteSession", pb.DeleteSessionRequest(name=name), timeout, metadata)

    def observe(self, name: str, x: TensorLike, *, reduce: str = "auto",
                omit_qparams: bool = False,
                timeout: float | None = None, metadata: Metadata = None) -> ObserveResult:
        """One forward of the session `name` on x.

        reduce: "always" sends each block's min and max, computed where x lives (its
        torch device), "never" sends x itself, "auto" whichever is smaller. The results
        are bit-identical either way, errors included (a tensor the server would refuse,
        e.g. one holding NaN, is sent whole so that the error is the tensor's own).
        Reducing needs the session's spec: the first observation of a name fetches it
        (retried as the observation is).
        omit_qparams: the result's qparams is None (the server does not send them),
        for a caller that reads them later with get_qparams.

        Raises:
            TypeError: x is not a supported array or tensor. ValueError: a bad reduce.
            NotFound, InvalidArgument, FailedPrecondition...: as the server answers.
        """
        check_reduce(reduce)
        cached = reduce != "never" and name in self._specs
        request = self._request(name, x, reduce, omit_qparams)
        try:
            response = self._observe_call(request, timeout, metadata)
        except (InvalidArgument, FailedPrecondition) as e:
            # A spec cached before another client replaced the session (or changed its
            # granularity) reduces to the wrong blocks (or bins): fetch it again once and
            # resend.
            if not (cached and request.WhichOneof("observation") in ("range", "histogram")):
                raise
            old = self._specs.get(name)
            try:
                changed = _Layout.of(self.get_session(name)) != old
            except QParamsError:
                changed = False
            if not changed:
                raise e from None
            response = self._observe_call(self._request(name, x, reduce, omit_qparams),
                                          timeout, metadata)
        return ObserveResult.from_response(response)

    def _observe_call(self, request: pb.ObserveRequest, timeout: float | None,
                      metadata: Metadata) -> pb.ObserveResponse:
        """One Observe call, retried as the client's retry policy says if keyed."""
        return self._retry.call(bool(request.client_id),
                                lambda: self._call("Observe", request, timeout, metadata))

    def observe_many(self, items: Iterable[tuple[str, TensorLike]], *, reduce: str = "auto",
                     omit_qparams: bool = False,
                     timeout: float | None = None, metadata: Metadata = None
                     ) -> Iterator[ObserveResult | QParamsError]:
        """Observes every (name, tensor) of `items`, on one or many sessions, over one
        ObserveStream: requests are sent as fast as the stream takes them, not one round
        trip each. Yields, in order, one ObserveResult or one QParamsError (the item's
        refusal, with its `session`) per item; the stream goes on past a refused item.
        reduce and omit_qparams: as for observe.

        `items` is read lazily, so it may be a generator. `timeout` bounds the whole
        stream (default: none). A TypeError/ValueError of an item ends the stream after
        the items before it and is raised; so is the stream's own failure. On one
        server, a stream that fails with Unavailable or DeadlineExceeded is opened
        again (the retry policy of the class) with the keyed items it had not
        answered, then the rest.

        Sharded: one stream per owning replica, opened at its first item, the items
        read by a background thread at most 64 ahead of the answers yielded. When a
        replica's stream fails retryably (Unavailable, DeadlineExceeded, Unknown),
        its keyed items not answered yet, and every later item of that replica, are
        observed one at a time as observe does (retried), still in order; an unkeyed item it had
        taken gets the stream's error (its message naming the replica).
        """
        check_reduce(reduce)
        slot_map = self._router.slot_map()
        if slot_map is not None:
            yield from self._observe_streams(slot_map, items, reduce, omit_qparams, timeout,
                                             metadata)
            return
        yield from self._observe_stream(items, reduce, omit_qparams, timeout, metadata)

    def _observe_stream(self, items: Iterable[tuple[str, TensorLike]], reduce: str,
                        omit_qparams: bool, timeout: float | None,
                        metadata: Metadata) -> Iterator[ObserveResult | QParamsError]:
        """observe_many over one ObserveStream, opened again after a retryable failure
        (as the retry policy says) with the keyed requests sent but not answered,
        then the rest of `items`.

        gRPC's thread reads requests() while this generator reads the answers. `lock`
        guards `sent` (taken and unanswered, with their sessions' names), `carry`
        (taken by a stream replaced meanwhile, for the next one) and `generation`
        (the current stream's); `source_lock` makes one thread at a time read `items`
        (a stream being replaced may still be reading it). Lock order: `source_lock`,
        then `lock`; this generator takes only `lock`.
        """
        source = iter(items)
        sent: collections.deque[tuple[str, pb.ObserveRequest]] = collections.deque()
        carry: collections.deque[tuple[str, pb.ObserveRequest]] = collections.deque()
        failure: list[BaseException] = []
        lock, source_lock = threading.Lock(), threading.Lock()
        generation = [0]

        def take(mine: int) -> pb.ObserveRequest | None:
            """The stream `mine`'s next request, recorded in `sent`; None at the end."""
            with lock:
                if generation[0] != mine or failure:
                    return None
                if carry:
                    sent.append(carry.popleft())
                    return sent[-1][1]
            with source_lock:
                try:
                    name, x = next(source)
                    request = self._request(name, x, reduce, omit_qparams)
                except StopIteration:
                    return None
                except BaseException as e:  # raised below, after the answers before it
                    failure.append(e)
                    return None
                with lock:
                    if generation[0] != mine:
                        carry.append((name, request))
                        return None
                    sent.append((name, request))
            return request

        def requests(mine: int, resend: list[pb.ObserveRequest]) -> Iterator[pb.ObserveRequest]:
            yield from resend
            while (request := take(mine)) is not None:
                yield request

        wait = self._retry.waits()
        resend: list[pb.ObserveRequest] = []
        while True:
            call = self._stub.ObserveStream(requests(generation[0], resend), timeout=timeout,
                                            metadata=self._addressed(None, metadata))
            try:
                for response in call:
                    with lock:
                        name, request = sent.popleft()
                    yield self._rerouted(response, request, name, metadata)
                break
            except grpc.RpcError as e:
                if failure:
                    raise failure[0]
                with lock:
                    generation[0] += 1
                    resend = [request for _, request in sent]
                if not (resend and all(r.client_id for r in resend) and retryable_error(e)
                        and wait()):
                    raise error_from_rpc(e) from None
            finally:
                call.cancel()
        if failure:
            raise failure[0]

    def _observe_streams(self, slot_map: SlotMap, items: Iterable[tuple[str, TensorLike]],
                         reduce: str, omit_qparams: bool, timeout: float | None,
                         metadata: Metadata) -> Iterator[ObserveResult | QParamsError]:
        """observe_many over one ObserveStream per owning replica.

        A dispatcher thread reads `items`, reduces each and queues it on its owner's
        stream (opening it at the first), and records (replica, name) in `order`; this
        generator reads each stream's answers in item order. Once a replica's stream
        failed retryably (`broken`), the dispatcher queues its items for this
        generator alone (replica None in `order`), which observes them unary, so that
        every item of a session is still applied in order. `credit` bounds how far
        the dispatcher runs ahead. Lock order: only `lock` (guards `streams`,
        `broken`, `stopped`).
        """
        # (replica or None for a unary call, name, request); None at the end
        order: queue_module.Queue = queue_module.Queue()
        streams: dict[str, tuple[queue_module.Queue, Any]] = {}
        broken: set[str] = set()
        failure: list[BaseException] = []
        credit = threading.Semaphore(64)
        lock = threading.Lock()
        stopped = [False]

        def requests(pending: queue_module.Queue) -> Iterator[pb.ObserveRequest]:
            while (request := pending.get()) is not None:
                yield request

        def dispatch() -> None:
            try:
                for name, x in items:
                    credit.acquire()
                    request = self._request(name, x, reduce, omit_qparams)
                    replica = slot_map.owner(name)
                    with lock:
                        if stopped[0]:
                            return
                        if replica in broken:
                            order.put((None, name, request))
                            continue
                        if replica not in streams:
                            pending: queue_module.Queue = queue_module.Queue()
                            streams[replica] = (pending, self._stub.ObserveStream(
                                requests(pending), timeout=timeout,
                                metadata=self._addressed(replica, metadata)))
                        streams[replica][0].put(request)
                    order.put((replica, name, request))
            except BaseException as e:  # raised by the reader, after the answers before it
                failure.append(e)
            finally:
                with lock:
                    for pending, _ in streams.values():
                        pending.put(None)
                order.put(None)

        threading.Thread(target=dispatch, name="qparams-observe-many", daemon=True).start()
        try:
            while (entry := order.get()) is not None:
                replica, name, request = entry
                credit.release()
                if replica is None:
                    yield self._observe_outcome(request, name, metadata)
                    continue
                with lock:
                    call = streams[replica][1]
                try:
                    response = next(call)
                except StopIteration:
                    raise QParamsError(f"replica {replica} answered fewer observations "
                                       "than were sent") from None
                except grpc.RpcError as e:
                    # A failed stream raises its error again at each next(): every item
                    # it had taken comes here, in order.
                    error = error_from_rpc(e, replica)
                    if not retryable_error(error):
                        raise error from None
                    with lock:
                        broken.add(replica)
                    if request.client_id:
                        yield self._observe_outcome(request, name, metadata)
                    else:  # it may have been applied: only a key makes resending safe
                        error.session = name
                        yield error
                    continue
                yield self._rerouted(response, request, name, metadata)
        finally:
            with lock:
                stopped[0] = True
                for pending, call in streams.values():
                    pending.put(None)
                    call.cancel()
            credit.release()  # a dispatcher waiting for credit sees `stopped`
        if failure:
            raise failure[0]

    def _observe_batch_by_owner(self, slot_map: SlotMap, request: pb.ObserveBatchRequest,
                                failed: dict[str, QParamsError], timeout: float | None,
                                metadata: Metadata) -> pb.ObserveBatchResponse:
        """ObserveBatch split into one call per owning replica, made concurrently, the
        answers put back in order. A failed call makes its error the status of each
        of its observations' responses and is kept in `failed` by replica."""
        parts = slot_map.split(observation.name for observation in request.observations)
        calls = {}
        for replica, indexes in parts.items():
            part = pb.ObserveBatchRequest(observations=[request.observations[i] for i in indexes])
            calls[replica] = self._stub.ObserveBatch.future(
                part, timeout=timeout or self.timeout,
                metadata=self._addressed(replica, metadata))
        responses: list[pb.ObserveResponse | None] = [None] * len(request.observations)
        for replica, call in calls.items():
            indexes = parts[replica]
            try:
                answer = call.result()
            except grpc.RpcError as e:
                failed[replica] = error_from_rpc(e, replica)
                for i in indexes:
                    responses[i] = _failed_item(failed[replica])
                continue
            if len(answer.responses) != len(indexes):
                raise QParamsError(f"replica {replica}: ObserveBatch answered "
                                   f"{len(answer.responses)} of {len(indexes)} observations")
            for i, response in zip(indexes, answer.responses):
                responses[i] = response
        return pb.ObserveBatchResponse(responses=responses)

    def _batch_attempt(self, request: pb.ObserveBatchRequest, failed: dict[str, QParamsError],
                       timeout: float | None, metadata: Metadata) -> pb.ObserveBatchResponse:
        """One attempt at `request`: one ObserveBatch (raised if it fails), or one per
        owning replica by the topology read last, then the observations refused
        naming another owner sent there. `failed` is emptied, then holds the calls
        of this attempt that failed, by replica (their observations' status is the
        error)."""
        failed.clear()
        slot_map = self._router.slot_map()
        if slot_map is None:
            response = self._call("ObserveBatch", request, timeout, metadata)
        else:
            response = self._observe_batch_by_owner(slot_map, request, failed, timeout,
                                                    metadata)
        return self._reroute_batch(request, response, failed, timeout, metadata)

    def _send_batch(self, request: pb.ObserveBatchRequest) -> pb.ObserveBatchResponse:
        """observe_async's sender: the attempts of observe_batch (a failed call fails
        only its own observations)."""
        return self._retry.batch(request, lambda part: self._batch_attempt(part, {}, None, None))

    def observe_batch(self, items: Iterable[tuple[str, TensorLike]], *, reduce: str = "auto",
                      omit_qparams: bool = False,
                      timeout: float | None = None, metadata: Metadata = None
                      ) -> list[ObserveResult | QParamsError]:
        """Observes every (name, tensor) of `items`, on one or many sessions, in one
        ObserveBatch call (at most 4096 items, within the message size limit); returns,
        in order, one ObserveResult or one QParamsError (the item's refusal, with its
        `session`) per item. reduce and omit_qparams: as for observe.

        Raises:
            TypeError, ValueError: a bad item or argument, before any call.
            ResourceExhausted: more than 4096 items (nothing is observed).
            Unavailable, DeadlineExceeded...: the call failed (after the retries of
                keyed items, see the class); without keys, the server may or may not
                have applied the items. Sharded: one call
                per owning replica; the first failed one (by replica name) is raised,
                and the other replicas applied theirs.
        """
        check_reduce(reduce)
        names, request = [], pb.ObserveBatchRequest()
        for name, x in items:
            names.append(name)
            request.observations.append(self._request(name, x, reduce, omit_qparams))
        failed: dict[str, QParamsError] = {}
        response = self._retry.batch(
            request, lambda part: self._batch_attempt(part, failed, timeout, metadata))
        if failed:  # the last attempt's calls that failed
            raise failed[min(failed)]
        return [stream_outcome(r, name) for r, name in zip(response.responses, names)]

    def observe_async(self, name: str, x: TensorLike, *, reduce: str = "auto",
                      omit_qparams: bool = False) -> concurrent.futures.Future:
        """Queues one forward of the session `name` on x for the client's background
        sender and returns at once with a Future of its ObserveResult.

        x is reduced (see observe) and copied before this returns, so the caller may
        change it. A background thread sends what is queued in ObserveBatch calls of
        up to 64 observations, once 64 wait, or the oldest has waited 50 ms, or flush()
        asks, or someone waits on a Future; observations of one client are applied in
        the order they were queued.
        At most 256 observations wait at once; beyond that this blocks. The first
        refused observation is also raised by the next observe_async or flush.
        Sharded: each batch is split into one ObserveBatch per owning replica; a
        replica's failed call fails only its own observations.
        reduce and omit_qparams: as for observe.
        """
        check_reduce(reduce)
        request = self._request(name, x, reduce, omit_qparams, key=False)
        self._in_this_process()
        with self._queue_lock:
            if self._queue is None:
                self._queue = ObserveQueue(self._send_batch)
            queue = self._queue
        # Keyed in the order of the queue, which the server applies: sequences keyed
        # apart from it would reach a session out of order, beyond its window.
        with self._submit_lock:
            return queue.submit(self._keys.key(request))

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every observe_async observation is answered; raises the first
        failure among them not raised yet (a QParamsError with its `session`)."""
        self._in_this_process()
        with self._queue_lock:
            queue = self._queue
        if queue is not None:
            queue.flush(timeout)

    def get_qparams(self, name: str, *,
                    timeout: float | None = None, metadata: Metadata = None) -> QParams:
        """The cached qparams of the session `name`, as get_qparams: before the first
        forward, empty with `initialized` False. A histogram session's carry its
        calibration (qparams.calibration: amax, bin_index, ...), computed now if its
        histogram changed since the last search."""
        response = self._call("GetQParams", pb.GetQParamsRequest(name=name), timeout, metadata)
        return QParams.from_proto(
            response.qparams, response.initialized,
            response.calibration if response.HasField("calibration") else None)

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

    def get_histogram(self, name: str, *,
                      timeout: float | None = None, metadata: Metadata = None) -> Histogram:
        """The histogram of |x| the histogram session `name` holds (percentile, entropy
        or mse): its occupied bins, exponent, side counts and exact extrema.

        Raises:
            NotFound: no such session. InvalidArgument: not a histogram session.
        """
        return Histogram.from_proto(
            self._call("GetHistogram", pb.GetHistogramRequest(name=name), timeout, metadata))

    def observe_histogram(self, name: str, histogram: Histogram | pb.HistogramObservation, *,
                          omit_qparams: bool = False, timeout: float | None = None,
                          metadata: Metadata = None) -> ObserveResult:
        """Merges `histogram` (local_histogram's, a merge of several, e.g. across
        data-parallel ranks, or a HistogramObservation message built elsewhere) into the
        histogram session `name`: the same state as observing the values it counts, bit
        for bit.

        Raises:
            InvalidArgument: a histogram breaking a rule of histogram.md 3.2 (num_bins not
                the session's, a wrong exponent, ...), or a session of another kind.
            ResourceExhausted: the session would hold 2^62 values or more.
        """
        request = pb.ObserveRequest(name=name, omit_qparams=omit_qparams)
        request.histogram.CopyFrom(histogram if isinstance(histogram, pb.HistogramObservation)
                                   else histogram.to_proto())
        self._keys.key(request)
        return ObserveResult.from_response(self._observe_call(request, timeout, metadata))

    def set_export_mode(self, name: str, enabled: bool = True, *,
                        timeout: float | None = None, metadata: Metadata = None) -> pb.Session:
        """Freezes (enabled) or unfreezes the qparams of the session `name`."""
        return self._call("SetExportMode", pb.SetExportModeRequest(name=name, enabled=enabled),
                          timeout, metadata)

    def set_granularity(self, name: str, value: GranularityLike, *,
                        timeout: float | None = None, metadata: Metadata = None) -> pb.Session:
        """Changes the session's granularity (FailedPrecondition once it computed a
        forward). ValueError for a malformed granularity, before any call."""
        session = self._call("SetGranularity", pb.SetGranularityRequest(
            name=name, granularity=granularity(value)), timeout, metadata)
        self._remember(session)
        return session

    # ------------------------------------------------------------------ scale groups

    def create_scale_group(self, name: str, members: Sequence[str], share: str = "global_amax",
                           *, fill_uncalibrated: bool = False,
                           timeout: float | None = None, metadata: Metadata = None
                           ) -> ScaleGroup:
        """Creates the scale group `name` over the sessions `members` (in this order)
        and returns it; the members are not changed (docs/scale_groups.md).

        Args:
            name: the group's name, in the session name alphabet. Sharded: the group
                and its members must hash to one slot, so name them with one hash
                tag ("{layer0}.qkv" over "{layer0}.q_proj", ...).
            members: 1 to 1024 distinct session names of one resolved spec.
            share: "global_amax" (NVFP4 sessions: one global scale from the largest
                amax) or "union_range" (per_tensor, not NVFP4: one qparams from the
                union of the ranges); case-insensitive.
            fill_uncalibrated: global_amax: once one member is calibrated, the
                uncalibrated ones take the group's global scale instead of leaving the
                group uninitialized.

        Raises:
            TypeError: members is a str, or holds something else than str.
            ValueError: share is not global_amax or union_range (before any call).
            AlreadyExists: the name is taken. NotFound: a member session is missing.
            InvalidArgument: a bad name, empty or repeated members, members whose
                specs differ, a share their spec does not allow, or (sharded)
                members in another slot than the group.
        """
        if isinstance(members, (str, bytes)):
            raise TypeError("members must be a sequence of session names, not a single "
                            f"{type(members).__name__}")
        members = list(members)
        for member in members:
            if not isinstance(member, str):
                raise TypeError(f"members must be session names (str), not "
                                f"{type(member).__name__} {member!r}")
        wire_share = SHARES.get(share.lower()) if isinstance(share, str) else None
        if wire_share is None:
            raise ValueError(f"share {share!r} is not one of {', '.join(SHARES)}")
        request = pb.CreateScaleGroupRequest(group=pb.ScaleGroup(
            name=name, members=members, share=wire_share,
            fill_uncalibrated=bool(fill_uncalibrated)))
        return ScaleGroup.from_proto(
            self._call("CreateScaleGroup", request, timeout, metadata, route=name))

    def get_scale_group(self, name: str, *,
                        timeout: float | None = None, metadata: Metadata = None) -> ScaleGroup:
        """The scale group `name` (NotFound if there is none)."""
        return ScaleGroup.from_proto(self._call(
            "GetScaleGroup", pb.GetScaleGroupRequest(name=name), timeout, metadata))

    def list_scale_groups(self, prefix: str = "", *, page_size: int = 0,
                          timeout: float | None = None, metadata: Metadata = None
                          ) -> Iterator[ScaleGroup]:
        """Every scale group whose name starts with `prefix`, in name order, fetching
        page after page (page_size 0: the server's default of 50; at most 1000).
        Sharded: each replica's pages, merged in name order.

        Raises:
            InvalidArgument: a negative page_size or one above 1000.
            IncompleteListing: sharded, some replicas could not be read (Unavailable,
                DeadlineExceeded, Unknown): raised after the groups of the others.
        """
        slot_map = self._router.slot_map()
        if slot_map is None:
            yield from self._group_pages(prefix, page_size, None, timeout, metadata)
            return
        yield from _merged(slot_map.replicas, lambda replica: self._group_pages(
            prefix, page_size, replica, timeout, metadata))

    def _group_pages(self, prefix: str, page_size: int, replica: str | None,
                     timeout: float | None, metadata: Metadata) -> Iterator[ScaleGroup]:
        """The scale groups of one server or replica, page after page."""
        token = ""
        while True:
            page = self._call("ListScaleGroups", pb.ListScaleGroupsRequest(
                page_size=page_size, page_token=token, filter=prefix), timeout, metadata,
                replica)
            for group in page.groups:
                yield ScaleGroup.from_proto(group)
            token = page.next_page_token
            if not token:
                return

    def delete_scale_group(self, name: str, *,
                           timeout: float | None = None, metadata: Metadata = None) -> None:
        """Deletes the scale group `name`, never its members (NotFound if there is
        none)."""
        self._call("DeleteScaleGroup", pb.DeleteScaleGroupRequest(name=name), timeout, metadata)

    def get_group_qparams(self, name: str, *,
                          timeout: float | None = None, metadata: Metadata = None
                          ) -> GroupQParams:
        """The shared result of the scale group `name`, computed now from its members'
        current ranges: while a member is uncalibrated (and not filled), `initialized`
        False with the `uncalibrated` members, as get_qparams before the first forward.

        Raises:
            NotFound: no such group.
            FailedPrecondition: a member was deleted, the members' specs no longer
                agree, their input dtypes differ, or a histogram member is
                calibrated (the message names it).
        """
        return GroupQParams.from_proto(self._call(
            "GetGroupQParams", pb.GetGroupQParamsRequest(name=name), timeout, metadata))

    def health(self, service: str = "", *,
               timeout: float | None = None, metadata: Metadata = None) -> str:
        """The serving status of `service` ("" = the server; "qparams.v1.QParamsService"):
        "SERVING" or "NOT_SERVING". Sends no token."""
        self._in_this_process()
        sent = _joined(self._health_metadata, metadata)
        try:
            response = self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                  timeout=timeout or self.timeout, metadata=sent)
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    # ------------------------------------------------------------------ helpers

    def _remember(self, session: pb.Session) -> None:
        with self._specs_lock:
            self._specs[session.name] = _Layout.of(session)

    def _layout(self, name: str) -> "_Layout | None":
        with self._specs_lock:
            layout = self._specs.get(name)
        if layout is None:
            try:
                # Part of the observation: retried as it is (a read, safe to repeat).
                self._retry.call(self._keys.enabled, lambda: self.get_session(name))
            except NotFound:
                return None  # the observation itself reports it
            with self._specs_lock:
                layout = self._specs.get(name)
        return layout

    def _request(self, name: str, x: TensorLike, reduce: str, omit_qparams: bool,
                 key: bool = True) -> pb.ObserveRequest:
        """The ObserveRequest of x (reduced as `reduce` says), with this client's next
        key of its session unless `key` is False (the caller keys it)."""
        layout = None if reduce == "never" else self._layout(name)
        if layout is None:
            request = tensor_request(name, x)
        elif layout.histogram is not None:
            request = histogram_request(name, x, layout.histogram, reduce)
        else:
            request = range_request(name, x, layout.spec, reduce)
        if request.HasField("tensor"):
            self._check_size(request.tensor.data, reduce)
        request.omit_qparams = omit_qparams
        return self._keys.key(request) if key else request

    def _check_size(self, data: bytes, reduce: str) -> None:
        """ValueError for a tensor whose bytes alone exceed the message limit: gRPC
        would refuse it only after serialising it (seconds for a large one)."""
        if len(data) <= self.max_message_bytes - 1024:  # room for the rest of the message
            return
        hint = ('reduce="auto" (the default) or "always" sends its block minima and maxima '
                'instead' if reduce == "never" else
                "it could not be reduced (its values are not all finite, or the "
                "granularity does not fit its shape)")
        raise ValueError(f"tensor of {len(data)} bytes exceeds max_message_bytes "
                         f"({self.max_message_bytes}); {hint}, or raise max_message_bytes "
                         "here and the server's --max_message_bytes")
