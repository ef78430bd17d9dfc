"""The core of qparams.Client, which qparams/client.py composes with the calls of
the qparams/_client_*.py modules: the connection and its life across fork() and
close(), the unary call routed to a session's owner (or addressed to a replica),
the GetTopology read the router asks for, and the layouts of sessions that reducing
a tensor needs. Every call of the other modules goes through these.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import grpc

from qparams._background import ObserveQueue
from qparams._channel import channel_settings, open_channel
from qparams._errors import (FailedPrecondition, IncompleteListing, NotFound, QParamsError,
                             error_from_rpc)
from qparams._fork_proxy import ForkProxy, needs_proxy
from qparams._health.v1 import health_pb2_grpc
from qparams._retry import Keys, RetryPolicy, retryable_error
from qparams._routing import Router, replica_header, session_header, valid_replica
from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc

__all__ = ["ClientCore", "DEFAULT_TARGET", "Layout", "Metadata", "joined"]

#: Where a Client connects without a target argument or $QPARAMS_TARGET (`make run`).
DEFAULT_TARGET = "127.0.0.1:50051"

#: A call's own metadata: (key, value) pairs, sent after the client's.
Metadata = Sequence[tuple[str, str]] | None
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")
# The methods of qparams.v1.ClusterAdmin (an admin token's calls, docs/security.md),
# from the proto so that a new admin call is routed to its service without an edit here.
_ADMIN_METHODS = frozenset(pb.DESCRIPTOR.services_by_name["ClusterAdmin"].methods_by_name)


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


def joined(base: tuple[tuple[str, str], ...] | None,
           metadata: Metadata) -> tuple[tuple[str, str], ...] | None:
    """`base` (the client's metadata, or None) followed by a call's own."""
    return base if not metadata else (base or ()) + _check_metadata(metadata)


class Layout(NamedTuple):
    """What reducing a tensor for a session needs to know of it."""

    spec: pb.QuantSpec
    histogram: pb.HistogramParams | None  # histogram sessions only

    @classmethod
    def of(cls, session: pb.Session) -> "Layout":
        """The layout of `session`, as the server resolved it."""
        return cls(session.spec,
                   session.histogram if session.HasField("histogram") else None)


class ClientCore:
    """What every call of a qparams.Client goes through: its connection, routing and
    session layouts. __init__ takes the Client's arguments (see Client)."""

    def __init__(self, target: str | None = None, *, token: str | None = None,
                 tls: bool = False, tls_ca: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None, tls_server_name: str | None = None,
                 timeout: float = 30.0, max_message_bytes: int = 64 << 20,
                 replica: str | None = None,
                 metadata: Metadata = None, idempotency_keys: bool = True,
                 retry_total: float = 30.0, retry_initial_backoff: float = 0.05,
                 retry_max_backoff: float = 5.0) -> None:
        self.target = target or os.environ.get("QPARAMS_TARGET") or DEFAULT_TARGET
        # The channel a forked child's helper process opens for it (_connect).
        self._channel_args = dict(target=self.target, tls=tls, tls_ca=tls_ca,
                                  tls_cert=tls_cert, tls_key=tls_key,
                                  tls_server_name=tls_server_name,
                                  max_message_bytes=max_message_bytes)
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
        self._credentials, self._options = channel_settings(
            tls, tls_ca, tls_cert, tls_key, tls_server_name, max_message_bytes)
        self._connect()
        # How to reduce tensors for each session this client reduced tensors for, by
        # name: its resolved spec and, for a histogram session, its histogram params.
        self._specs: dict[str, Layout] = {}
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
            proxy = ForkProxy(self._channel_args)
            self._channel = proxy
            self._service = proxy.stub("qparams.v1.QParamsService")
            self._admin = proxy.stub("qparams.v1.ClusterAdmin")
            self._health = proxy.stub("grpc.health.v1.Health")
        else:
            channel = open_channel(self.target, self._credentials, self._options)
            self._channel = channel
            self._service = pb_grpc.QParamsServiceStub(channel)
            self._admin = pb_grpc.ClusterAdminStub(channel)
            self._health = health_pb2_grpc.HealthStub(channel)
        self._pid = os.getpid()

    @property
    def _stub(self) -> pb_grpc.QParamsServiceStub:
        """The service stub of this process: after fork() a child calls through a
        helper process of its own (see _fork_proxy.py) and drops the parent's
        background queue, whose observations the parent sends."""
        self._in_this_process()
        return self._service

    def _stub_of(self, method: str) -> Any:
        """The stub that serves `method`: the cluster-administration calls are
        qparams.v1.ClusterAdmin's, every other one QParamsService's."""
        self._in_this_process()
        return self._admin if method in _ADMIN_METHODS else self._service

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

    # ------------------------------------------------------------------ calls

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
            return getattr(self._stub_of(method), method)(request, timeout=timeout or self.timeout,
                                               metadata=sent)
        except grpc.RpcError as e:
            error = error_from_rpc(e, replica)
        owner = self._owner_to_retry(error, route if replica is None else "")
        if owner is None:
            raise error
        # The balancer's map or this client's topology is older than the replica's:
        # once more, addressed to the owner the refusal names.
        try:
            return getattr(self._stub_of(method), method)(
                request, timeout=timeout or self.timeout,
                metadata=self._addressed(owner, metadata) + session_header(route))
        except grpc.RpcError as e:
            retried = error_from_rpc(e, owner)
        # Refused as addressed to another replica (no owner named): this client reached
        # one replica straight, not a balancer; the first refusal says more.
        if isinstance(retried, FailedPrecondition) and not retried.owner:
            raise error
        raise retried

    def _pages(self, method: str, request_of: Callable[[str], Any],
               items_of: Callable[[Any], Sequence[Any]], timeout: float | None,
               metadata: Metadata) -> Iterator[Any]:
        """The items of a listing's pages (ListSessions, ListScaleGroups), fetched page
        after page: `request_of(token)` is the request of the page after `token` ("" for
        the first), `items_of(page)` its items. Raises IncompleteListing, after every
        page's items, when some page names replicas the deployment could not read."""
        missing: list[str] = []
        token = ""
        while True:
            page = self._call(method, request_of(token), timeout, metadata)
            yield from items_of(page)
            missing += page.unreachable_replicas
            token = page.next_page_token
            if not token:
                break
        if missing:
            raise IncompleteListing.of(missing)

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

    def _addressed(self, replica: str | None,
                   metadata: Metadata = None) -> tuple[tuple[str, str], ...] | None:
        """The call's metadata: the token, the client's and the caller's metadata,
        and the header addressing it to `replica` (None: unaddressed)."""
        return (joined(self._metadata, metadata) or ()) + replica_header(replica) or None

    def _routed(self, session: str,
                metadata: Metadata = None) -> tuple[tuple[str, str], ...] | None:
        """The call's metadata: as _addressed, and the routing header of the session
        it names, on which a balancer in front of sharded replicas routes."""
        return (joined(self._metadata, metadata) or ()) + session_header(session) or None

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

    # ------------------------------------------------------------------ session layouts

    def _remember(self, session: pb.Session) -> None:
        """Keeps how to reduce tensors for `session`."""
        with self._specs_lock:
            self._specs[session.name] = Layout.of(session)

    def _fetch_session(self, name: str, timeout: float | None = None,
                       metadata: Metadata = None) -> pb.Session:
        """GetSession of `name`, its layout remembered: get_session's call, which
        reducing a tensor for a session not seen yet makes too."""
        session = self._call("GetSession", pb.GetSessionRequest(name=name), timeout, metadata)
        self._remember(session)
        return session

    def _layout(self, name: str) -> "Layout | None":
        """The layout of the session `name`, fetched at its first use; None if there
        is no such session."""
        with self._specs_lock:
            layout = self._specs.get(name)
        if layout is None:
            try:
                # Part of the observation: retried as it is (a read, safe to repeat).
                self._retry.call(self._keys.enabled, lambda: self._fetch_session(name))
            except NotFound:
                return None  # the observation itself reports it
            with self._specs_lock:
                layout = self._specs.get(name)
        return layout

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
