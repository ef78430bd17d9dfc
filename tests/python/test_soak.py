"""The sharded soak (docs/testing.md): four client processes observe 60 sessions
(moving_average, static and global_minmax; each session fed in a fixed order)
continuously through HAProxy, with the Python client's idempotency keys and retries,
while slot ranges move twice between the three replicas (0:42 r0 -> r1, then 85:127
r1 -> r2) and a fourth replica r3 is added while serving (HAProxy's spare backend made
ready through its runtime API) and takes 170:212 from r2, each move with
`qparams-cli reshard --haproxy_admin`. The second test kills (SIGKILL) a replica in
the middle of each move, restarts it on its data directory and finishes the move with
`reshard --resume`: the source of the first move once it is copied and frozen
(`--stop_before_switch`), the target of the second in the middle of its copy (half of
the records imported, see copy_half), the target of the third once copied and frozen.

Afterwards every session's state (observation count, running min and max, qparams)
equals, bit for bit, one server's replay of exactly the acknowledged observations
in their order: nothing lost, nothing applied twice.

Skipped unless QPARAMS_SOAK=1 (both tests take about half a minute; .ci/run runs
them through scripts/soak.sh); the cluster and HAProxy are test_sharded.py's. Every process is
started here and stopped by its PID.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.synchronize
import os
import pathlib
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

import qparams
from conftest import start_local_server
from helpers import ADMIN_TOKEN, slot
from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc
from test_sharded import Cluster, cli, wait_for
from test_sharded import cluster as sharded_cluster  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(os.environ.get("QPARAMS_SOAK") != "1",
                                reason="the soak runs only with QPARAMS_SOAK=1")

CLIENTS = 4
SESSIONS = [f"soak/s{i}" for i in range(60)]
CALCULATORS = ("moving_average", "static", "global_minmax")
# (LOW, HIGH, SOURCE, TARGET); test_sharded's map gives 0:84 to r0, 85:169 to r1 and
# 170:255 to r2. Two moves between those three, then one to r3, added before it.
FIRST_MOVE = (0, 42, "r0", "r1")
SECOND_MOVE = (85, 127, "r1", "r2")
THIRD_MOVE = (170, 212, "r2", "r3")
MOVES = (FIRST_MOVE, SECOND_MOVE, THIRD_MOVE)
# The slot map afterwards, as GetTopology's ranges.
FINAL_RANGES = [(0, 42, "r1"), (43, 84, "r0"), (85, 127, "r2"), (128, 169, "r1"),
                (170, 212, "r3"), (213, 255, "r2")]
STEP = 2000  # acknowledged observations (all clients) awaited after each phase
PHASE_TIMEOUT = 120  # seconds: the deadline of each wait for progress


def tensor(session: int, index: int) -> np.ndarray:
    """The index-th observation of session number `session`: its fixed order."""
    rng = np.random.default_rng(session * 1_000_003 + index)
    return (rng.standard_normal(32) * (1 + index % 7)).astype(np.float32)


def in_range(name: str, low: int, high: int) -> bool:
    """Whether the session `name`'s slot is in low:high."""
    return low <= slot(name) <= high


def observe_forever(target: str, mine: list[int], acks: str,
                    stop: multiprocessing.synchronize.Event, path: str = "observe") -> None:
    """A client process: observes its sessions round-robin, each in its fixed order,
    until `stop`, through `path`: one observe call each ("observe"), or a round of
    all of them in one observe_batch ("batch") or one observe_many stream
    ("stream"); each acknowledged observation is appended to the file `acks` as
    "SESSION INDEX DUPLICATE" before the next round (DUPLICATE 1: the answer of a
    retry that the server had applied already). Any error ends the process (failing the
    test): the client's own retries must carry it through the moves and the kills,
    since an observation given up on may have been applied (a new call would get a
    new key)."""
    next_index = {s: 0 for s in mine}
    with qparams.Client(target, timeout=10, retry_total=120) as client, \
            open(acks, "a", buffering=1) as out:
        while not stop.is_set():
            items = [(SESSIONS[s], tensor(s, next_index[s])) for s in mine]
            if path == "observe":
                results = [client.observe(name, x) for name, x in items]
            elif path == "batch":
                results = client.observe_batch(items)
            else:
                results = list(client.observe_many(items))
            for s, result in zip(mine, results):
                if isinstance(result, Exception):
                    raise result
                out.write(f"{s} {next_index[s]} {int(result.duplicate)}\n")
                next_index[s] += 1


class Clients:
    """The client processes (spawned), each owning every CLIENTS-th session, the i-th
    observing through paths[i % len(paths)] (see observe_forever)."""

    def __init__(self, target: str, directory: pathlib.Path,
                 paths: tuple[str, ...] = ("observe",)) -> None:
        context = multiprocessing.get_context("spawn")
        self.stopping = context.Event()
        self.files = [directory / f"acks-{i}" for i in range(CLIENTS)]
        self.processes = [
            context.Process(target=observe_forever, daemon=True,
                            args=(target, list(range(i, len(SESSIONS), CLIENTS)),
                                  str(self.files[i]), self.stopping, paths[i % len(paths)]))
            for i in range(CLIENTS)]
        for process in self.processes:
            process.start()

    def counts(self) -> list[int]:
        """Each client's acknowledged observations so far (whole lines), asserting
        that every client still runs."""
        for process in self.processes:
            assert process.exitcode is None, f"client {process.pid} exited {process.exitcode}"
        return [path.read_bytes().count(b"\n") if path.exists() else 0 for path in self.files]

    def progress(self, what: str, more: int = STEP) -> None:
        """Waits until every client acknowledged its share of `more` further
        observations."""
        goals = [count + more // CLIENTS for count in self.counts()]
        wait_for(f"{more} observations {what}",
                 lambda: all(c >= g for c, g in zip(self.counts(), goals)), PHASE_TIMEOUT)
        print(f"soak: {sum(self.counts())} observations acknowledged {what}")

    def stop(self) -> dict[int, list[int]]:
        """Stops the clients; each session's acknowledged indices, in order."""
        self.stopping.set()
        for process in self.processes:
            process.join(PHASE_TIMEOUT)
        codes = [p.exitcode for p in self.processes]
        assert codes == [0] * CLIENTS, f"client exit codes {codes}"
        acknowledged: dict[int, list[int]] = {s: [] for s in range(len(SESSIONS))}
        duplicates = 0
        for path in self.files:
            for line in path.read_text().splitlines():
                s, index, duplicate = map(int, line.split())
                acknowledged[s].append(index)
                duplicates += duplicate
        print(f"soak: {sum(map(len, acknowledged.values()))} observations acknowledged, "
              f"{duplicates} of them as duplicates")
        return acknowledged

    def kill(self) -> None:
        """SIGKILL of the clients still running (a failed test's clean-up)."""
        for process in self.processes:
            if process.is_alive():
                process.kill()
                process.join()


def started(cluster: Cluster, paths: tuple[str, ...]) -> Clients:
    """The sessions created, and the clients observing through `paths`."""
    target = f"unix:{cluster.haproxy.socket}"
    with qparams.Client(target) as client:
        for i, name in enumerate(SESSIONS):
            create(client, i)
    return Clients(target, cluster.directory, paths)


@pytest.fixture
def soak(sharded_cluster: Cluster) -> Iterator[tuple[Cluster, Clients]]:
    """The cluster with the sessions created and the clients observing (observe)."""
    clients = started(sharded_cluster, ("observe",))
    try:
        yield sharded_cluster, clients
    finally:
        clients.kill()


@pytest.fixture
def soak_batches_and_streams(sharded_cluster: Cluster) -> Iterator[tuple[Cluster, Clients]]:
    """As soak, two clients observing through observe_batch, two through
    observe_many's streams."""
    clients = started(sharded_cluster, ("batch", "stream"))
    try:
        yield sharded_cluster, clients
    finally:
        clients.kill()


def create(client: qparams.Client, i: int) -> None:
    """Creates session number i, its calculator the i-th of CALCULATORS in turn."""
    client.create_session(SESSIONS[i], calculator=CALCULATORS[i % len(CALCULATORS)],
                          target="activation", dtype="int8", qscheme="asymmetric")


def state(client: qparams.Client) -> dict[str, tuple]:
    """Each session's count, running min and max, and qparams bytes."""
    out = {}
    for name in SESSIONS:
        s = client.get_session(name)
        q = client.get_qparams(name)
        out[name] = (s.observation_count, np.asarray(s.running_min, np.float32).tobytes(),
                     np.asarray(s.running_max, np.float32).tobytes(), q.scale.tobytes(),
                     q.zero_point.tobytes())
    return out


def replayed(acknowledged: dict[int, list[int]]) -> dict[str, tuple]:
    """What one server ends with when it applies the acknowledged observations."""
    with start_local_server() as one, qparams.Client(one.target) as client:
        for i in range(len(SESSIONS)):
            create(client, i)
            for index in acknowledged[i]:
                client.observe(SESSIONS[i], tensor(i, index))
        return state(client)


def reshard(cluster: Cluster, move: tuple[int, int, str, str], *flags: str) -> dict:
    """qparams-cli reshard of `move` (LOW, HIGH, SOURCE, TARGET) through HAProxy; its
    result, with its steps (stderr) under "log"."""
    low, high, source, destination = move
    run = cli(f"--target=unix:{cluster.haproxy.socket}", f"--token={ADMIN_TOKEN}",
              "--timeout=60s", "reshard", f"{low}:{high}", source, destination, *flags)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    print(f"soak: reshard {low}:{high} {source} {destination} {' '.join(flags)}: "
          f"{json.dumps({k: v for k, v in result.items() if k != 'next_map'})}")
    result["log"] = run.stderr
    return result


def copy_half(cluster: Cluster, move: tuple[int, int, str, str]) -> int:
    """The first steps of `move` as reshard takes them (docs/sharding.md, "Moving
    slots online"): the target importing, the source migrating (frozen), the target's
    old copies dropped, then the copy cut in the middle: of the source's records only
    the first half is imported (one ImportSessions message, journaled and synced when
    the call returns), as a command that died there leaves it. reshard has no pause
    inside its copy, so the test takes these steps itself, each call addressed to its
    replica through HAProxy. Returns how many records the whole copy has."""
    low, high, source, destination = move
    with grpc.insecure_channel(f"unix:{cluster.haproxy.socket}") as channel:
        stub = pb_grpc.ClusterAdminStub(channel)

        def at(replica: str) -> dict:
            """An admin call's options: addressed to `replica` (HAProxy routes on it),
            with the replicas' admin token."""
            return {"metadata": (("x-qparams-replica", replica),
                                 ("authorization", f"Bearer {ADMIN_TOKEN}")), "timeout": 30}

        stub.SetSlotState(pb.SetSlotStateRequest(move=pb.SlotMove(
            low=low, high=high, state=pb.SlotMove.IMPORTING, peer=source)), **at(destination))
        stub.SetSlotState(pb.SetSlotStateRequest(move=pb.SlotMove(
            low=low, high=high, state=pb.SlotMove.MIGRATING, peer=destination)), **at(source))
        dropped = stub.DropSlots(pb.DropSlotsRequest(low=low, high=high), **at(destination))
        assert (dropped.sessions, dropped.groups) == (0, 0), dropped
        records = [r for batch in stub.ReadSlotRecords(
            pb.ReadSlotRecordsRequest(low=low, high=high), **at(source)) for r in batch.records]
        assert len(records) >= 2, records
        half = records[:len(records) // 2]
        imported = stub.ImportSessions(iter([pb.SlotRecords(records=half)]), **at(destination))
        assert (imported.sessions, imported.groups) == (len(half), 0), imported
    print(f"soak: {low}:{high} {source} -> {destination}: {len(half)} of {len(records)} "
          "records imported")
    return len(records)


def restart(cluster: Cluster, replica: str) -> None:
    """SIGKILL, then a start on the same data directory (new ports: HAProxy is
    pointed there)."""
    cluster.kill_replica(replica)
    cluster.start_replica(replica)
    cluster.route_to(replica)


def add_r3(cluster: Cluster) -> None:
    """r3 on the map file (epoch 0: it owns no slot), its spare backend made ready."""
    cluster.start_replica("r3")
    cluster.route_to("r3")


def check(cluster: Cluster, clients: Clients) -> None:
    """Stops the clients; the cluster's sessions against one server's replay."""
    acknowledged = clients.stop()
    assert all(len(indices) > 10 for indices in acknowledged.values()), \
        {SESSIONS[s]: len(i) for s, i in acknowledged.items()}
    assert all(i == list(range(len(i))) for i in acknowledged.values())
    for low, high, _, _ in MOVES:
        moved = [n for n in SESSIONS if in_range(n, low, high)]
        assert len(moved) >= 5, (low, high, moved)
    with qparams.Client(f"unix:{cluster.haproxy.socket}") as client:
        ranges = [(r.low, r.high, r.replica) for r in client.topology().ranges]
        got = state(client)
    assert ranges == FINAL_RANGES, ranges
    entries = [line.split()[1:] for line in
               cluster.haproxy.command(f"show map {cluster.slot_map}").splitlines() if line]
    assert entries == [[f"{low}:{high}", replica] for low, high, replica in ranges], entries
    want = replayed(acknowledged)
    differ = [n for n in SESSIONS if got[n] != want[n]]
    assert not differ, [(n, got[n][0], want[n][0]) for n in differ]


def test_soak_moves_and_a_new_replica(soak: tuple[Cluster, Clients]) -> None:
    cluster, clients = soak
    admin = f"--haproxy_admin={cluster.haproxy.admin}"
    clients.progress("before the moves")
    assert reshard(cluster, FIRST_MOVE, admin)["outcome"] == "done"
    clients.progress("after the first move")
    assert reshard(cluster, SECOND_MOVE, admin)["outcome"] == "done"
    clients.progress("after the second move")
    add_r3(cluster)
    clients.progress("with r3 added")
    assert reshard(cluster, THIRD_MOVE, admin)["outcome"] == "done"
    clients.progress("after the third move")
    check(cluster, clients)


def test_soak_moves_resumed_after_sigkill(soak: tuple[Cluster, Clients]) -> None:
    cluster, clients = soak
    admin = f"--haproxy_admin={cluster.haproxy.admin}"
    clients.progress("before the moves")
    # The source dies in the middle of the first move (copied, frozen, not switched).
    assert reshard(cluster, FIRST_MOVE, "--stop_before_switch")["outcome"] == "awaiting_switch"
    restart(cluster, FIRST_MOVE[2])
    assert reshard(cluster, FIRST_MOVE, "--resume", admin)["outcome"] == "done"
    clients.progress("after the first move")
    # The target dies in the middle of the second move's copy: restarted, it has the
    # half it journaled (and serves none of it); the resumed copy replaces it.
    records = copy_half(cluster, SECOND_MOVE)
    restart(cluster, SECOND_MOVE[3])
    moving = next(n for n in SESSIONS if in_range(n, *SECOND_MOVE[:2]))
    with qparams.Client(cluster.replicas["r2"].target, replica="r2") as r2:
        with pytest.raises(qparams.FailedPrecondition) as refused:
            r2.get_session(moving)
        assert refused.value.owner == "r1"
    resumed = reshard(cluster, SECOND_MOVE, "--resume", admin)
    assert (resumed["outcome"], resumed["sessions_copied"]) == ("done", records), resumed
    assert f"dropped {records // 2} session(s) and 0 group(s) left by an earlier copy" \
        in resumed["log"], resumed["log"]
    clients.progress("after the second move")
    add_r3(cluster)
    clients.progress("with r3 added")
    # The target dies in the middle of the third move (copied, frozen, not switched).
    assert reshard(cluster, THIRD_MOVE, "--stop_before_switch")["outcome"] == "awaiting_switch"
    restart(cluster, THIRD_MOVE[3])
    assert reshard(cluster, THIRD_MOVE, "--resume", admin)["outcome"] == "done"
    clients.progress("after the third move")
    check(cluster, clients)


def test_soak_batches_and_streams_through_moves_whose_target_dies(
        soak_batches_and_streams: tuple[Cluster, Clients]) -> None:
    """Right after each move's switch, the new owner is killed (SIGKILL) and only
    then restarted: meanwhile the old owner refuses the moved items naming it, and
    HAProxy routes them to it, so the batches and the streams (each client's
    topology, read before the move, sends them to the old owner) must keep the
    items and retry them with their keys until it is back, as observe does. The
    callers see no error, and every session equals the replay of what they were
    acknowledged."""
    cluster, clients = soak_batches_and_streams
    admin = f"--haproxy_admin={cluster.haproxy.admin}"
    clients.progress("before the moves")
    for move in (FIRST_MOVE, SECOND_MOVE):
        assert reshard(cluster, move, admin)["outcome"] == "done"
        target = move[3]
        cluster.kill_replica(target)
        wait_for(f"haproxy to mark {target} DOWN",
                 lambda: cluster.haproxy.status(target).startswith("DOWN"), PHASE_TIMEOUT)
        clients.counts()  # every client still runs, waiting for the target
        cluster.start_replica(target)
        cluster.route_to(target)
        clients.progress(f"after {target}, the target of {move[0]}:{move[1]}, came back")
    add_r3(cluster)
    assert reshard(cluster, THIRD_MOVE, admin)["outcome"] == "done"
    clients.progress("after the third move")
    check(cluster, clients)
