"""A forked child's calls, made by a helper process it starts.

gRPC's core keeps process-wide state (pollers, wakeup file descriptors). A child
forked after its parent used gRPC inherits that state half-dead: without gRPC's fork
support every new channel fails with "Socket operation on non-socket", and gRPC's fork
support ($GRPC_ENABLE_FORK_SUPPORT=1) re-initialises the child but, with Debian's
grpcio 1.51 on Python 3.11, its handler sometimes waits forever for the GIL (about 1
fork in 80 in our runs, in any forked child, whether or not it uses gRPC). qparams
turns neither on. Instead, a Client in a forked child whose parent ran gRPC's core
(inherited from the parent or made in the child: a DataLoader worker_init_fn, a
multiprocessing function) starts this module as a fresh interpreter (`python -m
qparams._fork_proxy`, fork and exec: no gRPC state inherited) and hands it every
call over a pipe: the helper holds the channel, the child holds stubs with the same
calling convention (ProxyStub). The helper exits when the pipe closes, i.e. when the
child closes its client or exits.

Whether the parent ran gRPC's core is read at each fork, in the parent, from the
names of its threads: the core starts named threads (timer, executor, resolver,
event engine) at its first call, and a process where they never ran forks a child
that opens channels as usual (creating a channel object alone starts none). A fork
made before qparams was imported is not seen: a child of a process that used gRPC
before importing qparams must import it before forking, or use "spawn".

The protocol: pickles on the helper's stdin and stdout. First the arguments of the
child's channel (target, TLS files, message size: qparams/_channel.py opens it);
then, per call, (service, method, request or list of requests, timeout, metadata),
answered by ("ok", response or list of responses, None) or ("error", responses so
far, (code name, details, trailing metadata)). Streams are sent and answered whole:
a forked child's observe_many is not pipelined.
"""

from __future__ import annotations

import glob
import os
import pickle
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import grpc
from grpc._cython import cygrpc

from qparams._channel import channel_settings, open_channel
from qparams._health.v1 import health_pb2_grpc
from qparams.v1 import qparams_pb2_grpc as pb_grpc

__all__ = ["ForkProxy", "needs_proxy"]

_SERVICES = ("qparams.v1.QParamsService", "grpc.health.v1.Health", "qparams.v1.ClusterAdmin")


#: The names (as /proc/PID/task/TID/comm cuts them, 15 characters) of the threads
#: gRPC's core starts at its first call.
_GRPC_THREADS = frozenset(("grpc_global_tim", "default-executo", "resolver-execut",
                           "timer_manager", "event_engine"))
# Whether this process is a forked child of one that ran gRPC's core (or of such a
# child); set in the child by _after_fork_in_child from what _before_fork saw.
_inherited_grpc = False
_parent_ran_grpc = False


def fork_support_enabled() -> bool:
    """True when gRPC's fork support was on at its import ($GRPC_ENABLE_FORK_SUPPORT=1):
    a forked child then opens channels itself."""
    return bool(cygrpc.is_fork_support_enabled())


def _grpc_threads_run() -> bool:
    """Whether any thread of this process is one of gRPC's core."""
    for comm in glob.glob(f"/proc/{os.getpid()}/task/*/comm"):
        try:
            with open(comm) as f:
                if f.read().strip() in _GRPC_THREADS:
                    return True
        except OSError:
            continue  # a thread that ended meanwhile
    return False


def _before_fork() -> None:
    global _parent_ran_grpc
    _parent_ran_grpc = _inherited_grpc or _grpc_threads_run()


def _after_fork_in_child() -> None:
    global _inherited_grpc
    _inherited_grpc = _parent_ran_grpc


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def needs_proxy() -> bool:
    """Whether a channel opened in this process would fail: it is a forked child of
    a process that ran gRPC's core, and gRPC's fork support is off."""
    return _inherited_grpc and not fork_support_enabled()


class ProxyRpcError(grpc.RpcError):
    """A failed call as the helper saw it, with grpc.Call's code(), details() and
    trailing_metadata(), so that error_from_rpc reads it as it reads gRPC's."""

    def __init__(self, code: grpc.StatusCode, details: str,
                 trailing: tuple[tuple[str, str], ...]) -> None:
        super().__init__(details)
        self._code, self._details, self._trailing = code, details, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


class _Answer:
    """A stream's responses, or a unary future's, as the helper returned them."""

    def __init__(self, responses: Any, error: ProxyRpcError | None) -> None:
        self._responses, self._error = responses, error

    def __iter__(self) -> Iterator[Any]:
        yield from self._responses
        if self._error is not None:
            raise self._error

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._responses

    def cancel(self) -> bool:
        return False  # answered whole: nothing left to cancel


class _ProxyMethod:
    def __init__(self, proxy: "ForkProxy", service: str, method: str) -> None:
        self._proxy, self._service, self._method = proxy, service, method

    def __call__(self, request: Any, timeout: float | None = None,
                 metadata: Any = None) -> Any:
        streaming_request = not hasattr(request, "SerializeToString")
        payload = list(request) if streaming_request else request  # before the lock
        responses, error = self._proxy.call(self._service, self._method, payload, timeout,
                                            metadata)
        if isinstance(responses, list):  # a server stream
            return _Answer(responses, error)
        if error is not None:
            raise error
        return responses

    def future(self, request: Any, timeout: float | None = None, metadata: Any = None) -> _Answer:
        responses, error = self._proxy.call(self._service, self._method, request, timeout,
                                            metadata)
        return _Answer(responses, error)


class ProxyStub:
    """A stub whose methods (called, or .future) go through the helper."""

    def __init__(self, proxy: "ForkProxy", service: str) -> None:
        self._proxy, self._service = proxy, service

    def __getattr__(self, method: str) -> _ProxyMethod:
        return _ProxyMethod(self._proxy, self._service, method)


class ForkProxy:
    """The helper process of a forked child's Client: `stub(service)` gives its
    stubs, `close()` ends it. Calls are serialised (one pipe).

    Args:
        channel_args: the channel the helper opens: `target` and the keyword
            arguments of qparams._channel.channel_settings.

    Raises:
        OSError: the helper could not be started.
    """

    def __init__(self, channel_args: dict[str, Any]) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "qparams._fork_proxy"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env)
        self._lock = threading.Lock()
        pickle.dump(channel_args, self._process.stdin)
        self._process.stdin.flush()

    def stub(self, service: str) -> ProxyStub:
        return ProxyStub(self, service)

    def call(self, service: str, method: str, payload: Any, timeout: float | None,
             metadata: Any) -> tuple[Any, ProxyRpcError | None]:
        """(responses, error) of one call made by the helper."""
        with self._lock:
            try:
                pickle.dump((service, method, payload, timeout, metadata), self._process.stdin)
                self._process.stdin.flush()
                kind, responses, failure = pickle.load(self._process.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as e:
                return None, ProxyRpcError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the helper process of this forked child failed ({e!r}; exit code "
                    f"{self._process.poll()})", ())
        if kind == "ok":
            return responses, None
        code, details, trailing = failure
        return responses, ProxyRpcError(grpc.StatusCode[code], details, trailing)

    def close(self) -> None:
        """Ends the helper (it exits when its stdin closes) and waits for it."""
        with self._lock:
            try:
                self._process.stdin.close()
            except OSError:
                pass
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process.stdout.close()


def _serve() -> None:
    """The helper: a channel opened from the first pickle (the child's channel_args);
    then each call on its stubs."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    args = pickle.load(stdin)
    target = args.pop("target")
    channel = open_channel(target, *channel_settings(**args))
    stubs = {_SERVICES[0]: pb_grpc.QParamsServiceStub(channel),
             _SERVICES[1]: health_pb2_grpc.HealthStub(channel),
             _SERVICES[2]: pb_grpc.ClusterAdminStub(channel)}
    while True:
        try:
            service, method, payload, timeout, metadata = pickle.load(stdin)
        except EOFError:
            break
        responses: Any = None
        try:
            answer = getattr(stubs[service], method)(
                iter(payload) if isinstance(payload, list) else payload,
                timeout=timeout, metadata=metadata)
            if hasattr(answer, "SerializeToString"):  # unary
                responses = answer
            else:  # a server stream: answered whole, or as far as it got
                responses = []
                for response in answer:
                    responses.append(response)
            message: tuple = ("ok", responses, None)
        except grpc.RpcError as e:
            message = ("error", responses,
                       (e.code().name, e.details() or "", tuple(e.trailing_metadata() or ())))
        pickle.dump(message, stdout)
        stdout.flush()
    channel.close()


if __name__ == "__main__":
    _serve()
