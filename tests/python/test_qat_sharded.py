"""Step-merged sessions behind HAProxy (docs/qat.md, issue 39): a run's sessions
spread over three replicas, W = 4 ranks, each making its step's call through HAProxy
(split by the client into one Step per owning replica), and one replica killed
(SIGKILL) and restarted on its data directory in the middle of a step: the ranks'
contributions acknowledged before the kill survive it (a resent one is a duplicate),
the step completes once the replica is back, and after every step every session's
state and qparams equal, bit for bit, one ordinary session observed with the
concatenation of the ranks' batches (qat.md §3), the same bits for every rank.

The cluster and HAProxy are test_sharded.py's; every process is stopped by its PID.
"""

from __future__ import annotations

import concurrent.futures
import random

import numpy as np

import qparams
from test_sharded import REPLICAS, Cluster, owner_of, wait_for
from test_sharded import cluster as sharded_cluster  # noqa: F401 (a fixture)

WORLD = 4
STEPS = 6
KILL_STEP = 3  # r1 dies after ranks 0 and 1 contributed to it
SESSIONS = [f"qat/m{i}" for i in range(12)]  # no hash tag: spread by name


def batch(step: int, rank: int, module: int) -> np.ndarray | None:
    """Rank `rank`'s input of module `module` in step `step`; None: it skipped the
    module (an unrouted expert), some steps for some ranks."""
    rng = np.random.default_rng(1000 * step + 10 * rank + module)
    if module % 3 == 0 and rng.random() < 0.3:
        return None
    return (rng.standard_normal((3, 5)) * (1 + step)).astype(np.float32)


def contributions(step: int, rank: int) -> list[tuple[str, int, np.ndarray | None]]:
    items = [(name, step, batch(step, rank, i)) for i, name in enumerate(SESSIONS)]
    random.Random(step * 31 + rank).shuffle(items)  # every rank its own order
    return items


def reference(client: qparams.Client, step: int) -> None:
    """One process: each ordinary session observes the concatenation of the ranks'
    batches of `step` (nothing if no rank ran the module)."""
    for i, name in enumerate(SESSIONS):
        parts = [x for r in range(WORLD) if (x := batch(step, r, i)) is not None]
        if parts:
            client.observe(f"ref/{name}", np.concatenate(parts), reduce="never")


def state(session) -> tuple:
    return (list(session.running_min), list(session.running_max),
            session.qparams.SerializeToString(deterministic=True))


def test_step_merged_sessions_across_replicas_survive_a_killed_replica(
        sharded_cluster: Cluster) -> None:
    cluster = sharded_cluster
    owners = {name: owner_of(name) for name in SESSIONS}
    assert set(owners.values()) == set(REPLICAS), "the sessions should spread over all three"
    target = f"unix:{cluster.haproxy.socket}"
    clients = [qparams.Client(target, retry_total=30) for _ in range(WORLD)]
    admin = qparams.Client(target)
    try:
        for name in SESSIONS:
            for prefix in ("", "ref/"):
                admin.create_session(prefix + name, calculator="moving_average",
                                     averaging_constant=0.5, dtype="int8",
                                     qscheme="asymmetric", target="activation")

        def rank_step(rank: int, step: int):
            return clients[rank].step(rank, WORLD, contributions(step, rank),
                                      [(name, step) for name in SESSIONS],
                                      step_timeout=300, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(WORLD) as pool:
            for step in range(STEPS):
                if step == KILL_STEP:
                    # Ranks 0 and 1 contribute, then r1 dies and comes back on its
                    # data directory: their contributions were durable.
                    for rank in (0, 1):
                        clients[rank].step(rank, WORLD, contributions(step, rank),
                                           step_timeout=300, timeout=60)
                    cluster.kill_replica("r1")
                    wait_for("haproxy to mark r1 DOWN",
                             lambda: cluster.haproxy.status("r1").startswith("DOWN"))
                    cluster.start_replica("r1")
                    cluster.route_to("r1")
                results = list(pool.map(lambda r: rank_step(r, step), range(WORLD)))
                if step == KILL_STEP:  # resent: taken before the kill, applied once
                    for rank in (0, 1):
                        resent = {c.name: c.duplicate for c in results[rank].contributions}
                        assert all(resent.values()), (rank, resent)
                reference(admin, step)
                for i, name in enumerate(SESSIONS):
                    reads = [next(x for x in res.reads if x.name == name) for res in results]
                    assert {x.step for x in reads} == {step}
                    scales = {x.qparams.scale.tobytes() for x in reads}
                    zero_points = {x.qparams.zero_point.tobytes() for x in reads}
                    assert len(scales) == 1 and len(zero_points) == 1, (name, step)
                    expected = admin.get_qparams(f"ref/{name}")
                    assert scales == {expected.scale.tobytes()}, (name, step)
                    assert zero_points == {expected.zero_point.tobytes()}, (name, step)
                    got = admin.get_session(name)
                    assert state(got) == state(admin.get_session(f"ref/{name}")), (name, step)
                    assert got.steps.last_applied_step == step
                    assert not got.steps.incomplete, (name, got.steps)
    finally:
        for c in clients + [admin]:
            c.close()
