"""The replica routing of a qparams.Client across sharded replicas behind a balancer
(docs/sharding.md): the headers that route or address a call, the topology (read
at the first split call through the GetTopology call the Client hands over, and
again when a replica refuses a call naming another owner, or a topology of a newer
epoch is seen), which replica owns each
session, and the splitting of calls over many sessions into one per owning replica.
Listings, reads and exports are one call, which the deployment answers for every
replica (server/fan_out.h). It makes no call of its own and knows nothing of
the Client, which composes it (as the C++ client composes client/replica_router.h).
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Callable, Iterable

from qparams._errors import Unimplemented
from qparams.v1 import qparams_pb2 as pb

__all__ = ["SESSION_HEADER", "REPLICA_HEADER", "Router", "SlotMap", "hashed_part", "slot_of",
           "valid_replica", "session_header", "replica_header"]

#: The metadata that carries a call's session name for routing (common/slot.h).
SESSION_HEADER = "x-qparams-session"
#: The metadata that addresses a call to one replica by name (common/slot.h).
REPLICA_HEADER = "x-qparams-replica"

_REPLICA_NAME = re.compile(r"[a-zA-Z0-9._-]{1,64}")

Headers = tuple[tuple[str, str], ...]


def valid_replica(name: str) -> bool:
    """Whether `name` is a replica name: 1 to 64 characters of [a-zA-Z0-9._-]."""
    return bool(_REPLICA_NAME.fullmatch(name))


def hashed_part(name: str) -> str:
    """The part of `name` hashed for its slot, Redis Cluster's hash-tag rule (as
    qparams::HashedPart in common/slot.h): the characters between the first "{" and
    the first "}" after it if there is at least one; otherwise the whole name."""
    start = name.find("{")
    if start < 0:
        return name
    end = name.find("}", start + 1)
    if end <= start + 1:
        return name
    return name[start + 1:end]


def slot_of(name: str, slot_count: int = 256) -> int:
    """crc32(hashed_part(name)) mod slot_count, the slot of the session `name`."""
    return zlib.crc32(hashed_part(name).encode("utf-8", "surrogatepass")) % slot_count


def session_header(session: str) -> Headers:
    """The header on which a balancer routes a call naming `session`; none for ""
    or a name no header can carry (the server refuses that name anyway)."""
    if not (session and session.isascii() and session.isprintable()):  # " " to "~"
        return ()
    return ((SESSION_HEADER, hashed_part(session)),)


def replica_header(replica: str | None) -> Headers:
    """The header addressing a call to `replica`; none for None or ""."""
    return ((REPLICA_HEADER, replica),) if replica else ()


class SlotMap:
    """Which replica owns each slot of a sharded deployment (from GetTopology)."""

    def __init__(self, topology: pb.Topology) -> None:
        self.epoch = topology.epoch
        self.slot_count = topology.slot_count
        self.replicas = sorted(topology.replicas)
        self._owners = [""] * topology.slot_count
        for r in topology.ranges:
            self._owners[r.low:r.high + 1] = [r.replica] * (r.high - r.low + 1)

    def owner(self, name: str) -> str:
        """The replica that owns the session `name`: crc32(hashed_part(name)) mod
        slot_count, as GetTopology documents the slot."""
        return self._owners[slot_of(name, self.slot_count)]

    def split(self, names: Iterable[str]) -> dict[str, list[int]]:
        """The indexes of `names`, by the replica that owns each (replicas in name
        order)."""
        parts: dict[str, list[int]] = {}
        for i, name in enumerate(names):
            parts.setdefault(self.owner(name), []).append(i)
        return dict(sorted(parts.items()))


class Router:
    """Decides whether a Client's calls over many sessions are split, and across
    which replicas. Thread-safe.

    Args:
        replica: the Client's `replica`: None routes; a name addresses every call
            to that replica and never splits one (the topology is then never read).
        read_topology: the GetTopology call, made at the first split call and by
            refresh(), given the replicas of the topology read before (none at
            first) to ask if the balancer cannot answer.
    """

    def __init__(self, replica: str | None,
                 read_topology: Callable[[list[str]], pb.Topology]) -> None:
        self.replica = replica
        self._read_topology = read_topology
        self._lock = threading.Lock()
        self._read = False
        self._slot_map: SlotMap | None = None
        self._epoch = -1  # of the topology read; -1 before the first

    def _take(self, topology: pb.Topology | None) -> None:
        """Keeps `topology` (None: a single server). Called with the lock held."""
        self._slot_map = (SlotMap(topology)
                          if topology is not None and len(topology.replicas) > 1 else None)
        self._epoch = topology.epoch if topology is not None else 0
        self._read = True

    def refresh(self) -> None:
        """Reads the topology again now (a replica refused a call naming another
        owner). Raises what GetTopology raises (but Unimplemented), keeping the
        topology read before, if any (the next split call routes by it; a refusal
        says where to go meanwhile). A client pinned to a replica reads nothing."""
        if self.replica is not None:
            return
        with self._lock:
            try:
                topology = self._read_topology(self._known())
            except Unimplemented:
                topology = None
            self._take(topology)

    def replicas(self) -> list[str]:
        """The replicas of the topology read last, in name order; none before the
        first read, for one server, or for a pinned client."""
        with self._lock:
            return self._known()

    def _known(self) -> list[str]:
        """The replicas of the topology read last, in name order (none before the
        first read or for one server). Called with the lock held."""
        return list(self._slot_map.replicas) if self._slot_map is not None else []

    def offer(self, topology: pb.Topology) -> None:
        """Takes `topology` (a GetTopology or SetSlotMap answer) if its epoch is newer
        than the one read; one read before the first split call is not kept."""
        if self.replica is not None:
            return
        with self._lock:
            if self._read and topology.epoch > self._epoch:
                self._take(topology)

    def slot_map(self) -> SlotMap | None:
        """The slot owners of a sharded deployment, read with GetTopology once; None
        for one server or one replica (or a server without GetTopology), or when
        every call goes to the client's `replica`. Raises what GetTopology raises
        (but Unimplemented); after an error the next call reads it again."""
        if self.replica is not None:
            return None
        with self._lock:
            if not self._read:
                try:
                    topology = self._read_topology(self._known())
                except Unimplemented:
                    topology = None  # a server from before GetTopology is a single server
                self._take(topology)
            return self._slot_map

    def after_fork(self) -> None:
        """In a forked child: replaces the lock, which a parent's thread may have held
        at fork time (the slot map read so far stays valid)."""
        self._lock = threading.Lock()
