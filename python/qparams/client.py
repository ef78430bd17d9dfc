"""qparams.Client: one object for the whole qparams.v1 service, one method per RPC.

Modelled on tritonclient's gRPC client: a typed result per call, exceptions named
after the gRPC codes (qparams.NotFound, ...) carrying the server's message unchanged,
and streaming helpers (observe_many over one stream; observe_async, batched by a
background thread).

The class is composed of the calls of one concern each, in qparams/_client_*.py,
over the connection, routing and session layouts of qparams/_client_core.py.
"""

from __future__ import annotations

from typing import Any

from qparams._client_admin import ServerCalls
from qparams._client_core import DEFAULT_TARGET
from qparams._client_export import ExportCalls
from qparams._client_groups import ScaleGroupCalls
from qparams._client_observe import ObserveCalls
from qparams._client_sessions import SessionCalls
from qparams._client_steps import StepCalls
# Metadata and the headers stay importable from here, where they were defined.
from qparams._client_core import Metadata
from qparams._routing import REPLICA_HEADER, SESSION_HEADER

__all__ = ["Client", "DEFAULT_TARGET"]


class Client(SessionCalls, ObserveCalls, StepCalls, ExportCalls, ScaleGroupCalls, ServerCalls):
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

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"qparams.Client({self.target!r})"
