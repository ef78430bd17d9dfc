"""fork() and gRPC: the check that a child process can open channels.

gRPC's core keeps process-wide state (pollers, wakeup file descriptors). Without its
fork support, a child of a process that used gRPC inherits that state half-dead and
every new channel fails with "Socket operation on non-socket". qparams/__init__.py
turns fork support on ($GRPC_ENABLE_FORK_SUPPORT) before grpc is imported; grpc reads
the variable once, at its import.
"""

from __future__ import annotations

from grpc._cython import cygrpc


def fork_support_enabled() -> bool:
    """True when gRPC's fork support was on at its import."""
    return bool(cygrpc.is_fork_support_enabled())


def check_fork_support() -> None:
    """In a forked child, before opening a channel: RuntimeError unless gRPC can
    serve this process.

    Raises:
        RuntimeError: grpc was imported before qparams with fork support off.
    """
    if not fork_support_enabled():
        raise RuntimeError(
            "this process was forked after its parent used gRPC, and gRPC's fork support "
            "is off (grpc was imported before qparams, with GRPC_ENABLE_FORK_SUPPORT unset "
            "or false), so no channel can be opened here; import qparams before grpc, set "
            "GRPC_ENABLE_FORK_SUPPORT=1 in the environment, or start children with the "
            "'spawn' or 'forkserver' multiprocessing context")
