"""fork() and gRPC: whether a forked child can open channels.

gRPC's core keeps process-wide state (pollers, wakeup file descriptors). A child
forked after its parent used gRPC inherits that state half-dead: without gRPC's fork
support every new channel fails with "Socket operation on non-socket", and reusing
the parent's channel would share its connection. gRPC's fork support
($GRPC_ENABLE_FORK_SUPPORT=1, read when grpc is first imported) re-initialises the
child, but with Debian's grpcio 1.51 on Python 3.11 its handler in the child
sometimes waits forever for the GIL (about 1 fork in 80 in our runs, any child
process, whether or not it uses gRPC), so qparams does not turn it on: a forked child
that calls the server is told to use "spawn" or "forkserver" instead.
"""

from __future__ import annotations

from grpc._cython import cygrpc


def fork_support_enabled() -> bool:
    """True when gRPC's fork support was on at its import."""
    return bool(cygrpc.is_fork_support_enabled())


def check_fork_support() -> None:
    """In a forked child, before opening a channel: RuntimeError unless gRPC's fork
    support is on.

    Raises:
        RuntimeError: the child cannot open a channel.
    """
    if not fork_support_enabled():
        raise RuntimeError(
            "qparams: this process was forked after its parent used gRPC, and a forked "
            "child cannot open a gRPC channel; start processes that call the server with "
            "the 'spawn' or 'forkserver' multiprocessing context (a RemoteObserver "
            "pickled to them works there), or opt in to gRPC's fork support with "
            "GRPC_ENABLE_FORK_SUPPORT=1 before grpc is imported (with grpcio 1.51 on "
            "Python 3.11 its handler can hang a forked child, see qparams/_fork.py)")
