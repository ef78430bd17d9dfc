"""The operator's runbook, docs/runbook.md (issue 27, once README.md's operator
section), runs as printed: its ```sh sharded blocks, in document order, through bash
as test_docs.py runs `sh` blocks, against test_sharded.py's Cluster (three replicas
r0, r1, r2 with data directories behind Debian's HAProxy on a UNIX socket, its
runtime API on another).

The blocks get the environment the runbook has the operator set in its `norun` lines:
QPARAMS_TARGET the balancer, HAPROXY_ADMIN HAProxy's runtime API socket, and R3 once
r3 runs; and QPARAMS_TOKEN, the admin token the runbook says its moves need, one of
the replicas' --admin_tokens_file. r3 is started where the runbook starts it, from its
`norun` qparams-server command with the same flags, but loopback ports, a data
directory of the test's and the others' --admin_tokens_file.

Before the blocks, sessions are created and observed through HAProxy on every
replica, most of them in the ranges the runbook moves. A block's commands run one at a
time, each through bash as printed, and its output is its ```text block's, if it has
one (test_docs' normalisation). After each command: every replica serves one map, which HAProxy's `show map` lists range for range; each session lives on its
owner alone, and a plain stub through HAProxy (no client that follows a refusal)
reads it with the same session record (spec, state, count) and qparams.

Every process is started here and stopped by its PID (the Cluster's finalizer).
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess

import grpc
import numpy as np

import qparams
from conftest import REPO, start_local_server
from helpers import ADMIN_TOKEN, slot
from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc
from test_docs import blocks, cli_path, commands, normalised
from test_sharded import METRICS_LINE, TIMEOUT, Cluster, cluster, local_names, wait_for  # noqa: F401

RUNBOOK = REPO / "docs/runbook.md"
# The ranges the runbook's blocks move, each to hold sessions of its own.
MOVED_RANGES = [(0, 20), (21, 40), (85, 105), (170, 190)]
STAYING_RANGES = [(41, 84), (106, 169), (191, 255)]


def session_names() -> list[str]:
    """Three names in each moved range and two in each range that stays put."""
    wanted = [(r, 3) for r in MOVED_RANGES] + [(r, 2) for r in STAYING_RANGES]
    names: list[str] = []
    for (low, high), count in wanted:
        found = (n for n in (f"ops/s{i}" for i in range(100000)) if low <= slot(n) <= high)
        names += [next(found) for _ in range(count)]
    return names


def tensor(i: int) -> np.ndarray:
    """The i-th observation: 4 channels of 16 values."""
    return np.random.default_rng(2700 + i).standard_normal((4, 16)).astype(np.float32)


def read_through_haproxy(target: str, name: str) -> tuple[bytes, bytes]:
    """The session's record and qparams as HAProxy's map routes them: a stub sends the
    x-qparams-session header and follows no refusal."""
    routed = (("x-qparams-session", name),)
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.QParamsServiceStub(channel)
        session = stub.GetSession(pb.GetSessionRequest(name=name), timeout=TIMEOUT,
                                  metadata=routed)
        q = stub.GetQParams(pb.GetQParamsRequest(name=name), timeout=TIMEOUT, metadata=routed)
    return session.SerializeToString(deterministic=True), q.SerializeToString(deterministic=True)


def start_r3_as_printed(cluster: Cluster, body: str, work: pathlib.Path) -> str:
    """Starts the runbook's r3 (its qparams-server command's flags, with loopback ports,
    the test's data directory, and the other replicas' admin tokens and transport;
    --slot_map as printed, relative to where the commands run); returns R3, its
    HOST:PORT:CHECK_PORT."""
    command = next(c for c in commands(body) if c.startswith("qparams-server"))
    flags = dict(word.split("=", 1) for word in shlex.split(command)[1:])
    assert flags["--replica_id"] == "r3", command
    flags.pop("--listen")  # LocalServer listens on 127.0.0.1, a port the OS picks
    # "The others' flags": the test's replicas serve loopback in plaintext, without
    # tenant tokens, so r3 does too (the admin tokens are theirs, below).
    for flag in ("--tls_cert", "--tls_key", "--auth_tokens_file"):
        flags.pop(flag)
    flags["--metrics_listen"] = "127.0.0.1:0"
    flags["--data_dir"] = str(cluster.directory / "data-r3")
    flags["--slot_map"] = str(work / flags["--slot_map"])
    flags["--admin_tokens_file"] = str(cluster.admin_tokens_file)
    server = start_local_server(*(f"{flag}={value}" for flag, value in flags.items()))
    cluster.replicas["r3"] = server
    wait_for("r3's metrics port in its log",
             lambda: any(METRICS_LINE.search(line) for line in server.log))
    check_port = int(next(m[1] for line in server.log if (m := METRICS_LINE.search(line))))
    cluster.check_ports["r3"] = check_port
    return f"{server.target}:{check_port}"


def check_deployment(cluster: Cluster, target: str, names: list[str],
                     before: dict[str, tuple[bytes, bytes]], where: str) -> None:
    """Every replica serves one map, HAProxy's; each session is on its owner alone, and
    read through HAProxy as it was."""
    maps = {}
    for replica in cluster.replicas:
        with qparams.Client(target, replica=replica) as pinned:
            topology = pinned.topology()
        maps[replica] = (topology.epoch,
                         [(r.low, r.high, r.replica) for r in topology.ranges])
    epoch, ranges = maps["r0"]
    assert all(m == (epoch, ranges) for m in maps.values()), f"{where}: {maps}"
    shown = [line.split()[1:] for line in
             cluster.haproxy.command(f"show map {cluster.slot_map}").splitlines() if line]
    assert shown == [[f"{low}:{high}", replica] for low, high, replica in ranges], where
    owner = {s: replica for low, high, replica in ranges for s in range(low, high + 1)}
    for replica, server in cluster.replicas.items():
        assert local_names(server, replica) == {n for n in names if owner[slot(n)] == replica}, \
            f"{where}: {replica}"
    for name in names:
        assert read_through_haproxy(target, name) == before[name], f"{where}: {name}"


def test_runbook_sharded_blocks_run_as_printed(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """The runbook's sharded blocks in order, r3 started where it says, checked throughout."""
    found = blocks(RUNBOOK)
    sharded = [b for b in found if b["kind"] == "sharded"]
    assert len(sharded) >= 5, "the runbook (docs/runbook.md) lost its sharded blocks"
    # Every variable the blocks use is one the runbook has the operator set.
    norun = "".join(b["body"] for b in found if b["kind"] == "norun")
    for variable in sorted({v for b in sharded for v in re.findall(r"\$(\w+)", b["body"])}):
        assert re.search(rf"\b{variable}=", norun), f"the runbook never sets ${variable}"

    target = f"unix:{cluster.haproxy.socket}"
    names = session_names()
    with qparams.Client(target) as client:
        for i, name in enumerate(names):
            calculator = "moving_average" if i % 2 else "global_minmax"
            client.create_session(name, calculator=calculator, target="weight", dtype="int8",
                                  granularity="per_channel:0")
            client.observe(name, tensor(i))
            client.observe(name, tensor(i + 100))
    before = {name: read_through_haproxy(target, name) for name in names}
    check_deployment(cluster, target, names, before, "before the blocks")

    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "QPARAMS_TARGET": target, "HAPROXY_ADMIN": str(cluster.haproxy.admin),
           "PATH": cli_path() + os.pathsep + os.environ.get("PATH", "")}
    env["QPARAMS_TOKEN"] = ADMIN_TOKEN  # for the moves, which need an admin token
    started_r3 = False
    for block in found:
        where = f"{RUNBOOK.relative_to(REPO)}:{block['line']}"
        if block["kind"] == "norun" and "qparams-server --replica_id=r3" in block["body"]:
            env["R3"] = start_r3_as_printed(cluster, block["body"], work)
            started_r3 = True
        if block["kind"] != "sharded":
            continue
        # One command at a time, so that the deployment is checked after each.
        output = ""
        for command in commands(block["body"]):
            run = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=work,
                                 env=env, capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, f"{where}: `{command}` exit {run.returncode}\n{run.stderr}"
            output += run.stdout
            check_deployment(cluster, target, names, before, f"{where}: after `{command}`")
        if block["expected"] is not None:
            assert normalised(output) == normalised(block["expected"]), \
                f"{where}: the block\n{block['body']}\nprinted\n{output}"
    assert started_r3, "the runbook no longer starts r3 (qparams-server --replica_id=r3)"
    # The runbook added r3 and removed it again: it serves and holds nothing.
    assert local_names(cluster.replicas["r3"], "r3") == set()
