"""No replica is special (issue 37): with any one replica of three killed (SIGKILL),
the deployment stays usable for every session whose owner is alive, through HAProxy
(docker/haproxy/haproxy.cfg as shipped: calls naming no session go to a pool of
every healthy replica) and through the clients' own routing (the topology read from
any replica, calls split by owner), for clients created before and after the kill:
GetTopology, Compute, health, every kind of observation (unary, batch, stream,
async) and read on the surviving replicas' sessions, and listings and reports that
return what the live replicas hold and name the missing one (Python
IncompleteListing, qparams-cli exit status 3 and its stderr). Exports, which must be
whole, keep refusing and name it.

The cluster and HAProxy are test_sharded.py's; every process is stopped by its PID.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import qparams
from test_sharded import REPLICAS, Cluster, cli, owner_of, wait_for
from test_sharded import cluster as sharded_cluster  # noqa: F401 (a fixture)

SESSIONS = [f"down/layer{i}" for i in range(24)]
EXIT_INCOMPLETE = 3  # qparams-cli's kExitIncomplete


def tensor(i: int) -> np.ndarray:
    return np.random.default_rng(3700 + i).standard_normal(16).astype(np.float32)


def survivors(dead: str) -> list[str]:
    return [name for name in SESSIONS if owner_of(name) != dead]


def exercise(client: qparams.Client, dead: str, round_: int) -> None:
    """Every kind of call on the sessions of the live replicas, and the calls that
    name no session; each observation adds one to each survivor's count."""
    live = survivors(dead)
    assert client.topology().replica_id in set(REPLICAS) - {dead}
    assert client.compute(tensor(0), target="weight", dtype="int8",
                          qscheme="symmetric").scale.size == 1
    assert client.health() == "SERVING"
    assert [c.key for c in client.list_calculators()]
    base = 1 + 4 * round_
    for k, name in enumerate(live):
        assert client.observe(name, tensor(k)).observation_count == base + 1
    results = client.observe_batch([(name, tensor(k)) for k, name in enumerate(live)])
    assert [r.observation_count for r in results] == [base + 2] * len(live)
    streamed = list(client.observe_many((name, tensor(k)) for k, name in enumerate(live)))
    assert [r.observation_count for r in streamed] == [base + 3] * len(live)
    futures = [client.observe_async(name, tensor(k)) for k, name in enumerate(live)]
    client.flush()
    assert [f.result().observation_count for f in futures] == [base + 4] * len(live)
    for name in live:
        assert client.get_qparams(name).initialized
        assert client.get_session(name).observation_count == base + 4

    for listing in (client.list_sessions("down/"), client.read_sessions("down/")):
        listed = []
        with pytest.raises(qparams.IncompleteListing) as incomplete:
            for session in listing:
                listed.append(session.name)
        assert listed == sorted(live)
        assert list(incomplete.value.missing) == [dead]
        assert f"replica {dead}: " in str(incomplete.value)
    with pytest.raises(qparams.Unavailable, match=f"replica {dead}: "):
        client.export("down/", "onnx")  # no document without the dead replica's share


def check_cli(target: str, dead: str, directory: pathlib.Path) -> None:
    """qparams-cli (the C++ client) against the deployment without `dead`."""
    live = survivors(dead)
    run = cli(f"--target={target}", "slotmap", "show")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["replicaId"] != dead
    run = cli(f"--target={target}", "calculators")
    assert run.returncode == 0, run.stderr
    np.save(directory / "x.npy", tensor(0))
    run = cli(f"--target={target}", "observe", live[0], str(directory / "x.npy"))
    assert run.returncode == 0, run.stderr
    names, token = [], ""
    while True:  # page after page, each naming the dead replica
        listed = cli(f"--target={target}", "list", "--filter=down/", f"--page_token={token}")
        assert listed.returncode == EXIT_INCOMPLETE, listed.stderr
        assert "replica(s) could not be read" in listed.stderr and dead in listed.stderr
        page = json.loads(listed.stdout)
        assert page["unreachableReplicas"] == [dead]
        names += [s["name"] for s in page["sessions"]]
        if not (token := page["nextPageToken"]):
            break
    assert names == sorted(live)
    report = cli(f"--target={target}", "report", "--prefix=down/")
    assert report.returncode == EXIT_INCOMPLETE, report.stderr
    assert f"replica {dead}: " in report.stderr
    assert all(name in report.stdout for name in live)


@pytest.mark.parametrize("dead", ["r0", "r1"])
def test_any_one_replica_may_die(sharded_cluster: Cluster, dead: str,
                                 tmp_path: pathlib.Path) -> None:
    cluster = sharded_cluster
    target = f"unix:{cluster.haproxy.socket}"
    assert {owner_of(n) for n in SESSIONS} == set(REPLICAS)
    # Few retries: a call on the dead replica's sessions must not wait for it long.
    options = dict(retry_total=1.0, timeout=5)
    with qparams.Client(target, **options) as before:
        for name in SESSIONS:
            before.create_session(name, calculator="global_minmax", target="weight",
                                  dtype="int8", qscheme="symmetric")
            before.observe(name, tensor(99))
        list(before.list_sessions())  # reads the topology: every replica known

        cluster.kill_replica(dead)
        # At once, before HAProxy's health check noticed: a call naming no session
        # that reached the dead replica is sent to another one (redispatch), and a
        # client's own topology read goes to the replicas it knows.
        exercise(before, dead, 0)
        wait_for(f"haproxy to mark {dead} DOWN",
                 lambda: cluster.haproxy.status(dead).startswith("DOWN"))
        exercise(before, dead, 1)
        with qparams.Client(target, **options) as after:
            exercise(after, dead, 2)
        check_cli(target, dead, tmp_path)
