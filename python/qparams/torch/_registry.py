"""The process-wide state of qparams.torch: the clients observers share, the sessions
they opened, the default run name, and the time the process started (what tells an
earlier run's sessions from this one's).

Thread safety: every function may be called from any thread; `lock` guards the dicts.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from qparams._errors import NotFound
from qparams.client import DEFAULT_TARGET, Client

lock = threading.Lock()
clients: dict[tuple, Client] = {}
# The sessions opened (created, or found and checked) in this process, each as
# (client key, session name, what was asked for).
opened: set[tuple] = set()
counter = itertools.count()
_generated_run: str | None = None
# Moves whenever the registry drops its clients, so that observers holding one let go.
generation = 0


def _process_start_time() -> float:
    """This process's start, in seconds since the epoch (Linux: from /proc; else now)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # starttime, field 22 of proc(5), in clock ticks since boot
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


#: When this process (or the parent it was forked from) started: sessions created
#: before it belong to an earlier run (RemoteObserver's if_exists).
STARTED = _process_start_time()


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork time stays held in the child. The
    # clients themselves survive (each opens a channel of its own in the child), and
    # so does STARTED: a forked worker belongs to its parent's run.
    global lock
    lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def resolve_server(server: str | None) -> str:
    """`server`, else $QPARAMS_TARGET, else the default target."""
    return server or os.environ.get("QPARAMS_TARGET") or DEFAULT_TARGET


def client_key(server: str, client_options: Mapping[str, Any]) -> tuple:
    """The registry key of a shared client."""
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
    server = resolve_server(server)
    options = dict(client_options or {})
    if "target" in options:
        raise ValueError("client_options must not hold target; pass server= instead")
    key = client_key(server, options)
    with lock:
        client = clients.get(key)
        if client is None:
            client = clients[key] = Client(server, **options)
        return client


def flush_all(timeout: float | None = None) -> None:
    """Waits until every observation of every shared client of this process is
    answered, and raises the first failure not raised yet (see Client.flush)."""
    with lock:
        shared = list(clients.values())
    for client in shared:
        client.flush(timeout)


def close_clients() -> None:
    """Closes the shared clients of this process, after sending what their background
    queues still hold (their errors are not raised: flush first to see them).
    Observers open new clients on their next call. Runs at exit too.
    """
    global generation
    with lock:
        shared = list(clients.values())
        clients.clear()
        opened.clear()
        generation += 1
    for client in shared:
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
    with lock:
        if _generated_run is None:
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            _generated_run = f"calib-{stamp}-{os.getpid()}"
        return _generated_run


def delete_run(run: str, *, server: str | None = None,
               client_options: Mapping[str, Any] | None = None) -> int:
    """Deletes every session of the run `run` (named "run/..."), so that the run can
    start afresh; returns how many were deleted. Call it from one process before the
    ranks of a data-parallel calibration start observing.

    Raises:
        ValueError: an empty run name.
        QParamsError: a failed listing or deletion (those before it stay deleted).
    """
    if not run:
        raise ValueError("run must be a non-empty session-name prefix")
    client = shared_client(server, client_options)
    names = [session.name for session in client.list_sessions(run + "/")]
    for name in names:
        try:
            client.delete_session(name)
        except NotFound:
            pass  # deleted meanwhile, by another process
    with lock:
        for entry in [e for e in opened if e[1] in names]:
            opened.discard(entry)
    return len(names)
