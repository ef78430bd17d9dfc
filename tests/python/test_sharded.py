"""Sharded replicas behind HAProxy (issue 16), end to end: three qparams-server
replicas r0, r1, r2 with one slot map, HAProxy run from docker/haproxy/haproxy.cfg
(its placeholders replaced: a UNIX socket to listen on, the replicas' loopback
ports, paths in pytest's temporary directory), and the Python client, which names
each call's session in the x-qparams-session header HAProxy routes on.

Checked: sessions created through HAProxy land on their owner (crc32(name) mod 256
in the map) and only there; a replica refuses another's session with
FAILED_PRECONDITION naming the owner (message and x-qparams-owner trailer); a killed
replica's sessions answer UNAVAILABLE through HAProxy while the others' keep working;
the replica restarted on its data dir (on a new port, which HAProxy learns through
its runtime API) has its sessions back bit for bit.

Every process is started here and stopped by its PID in fixture finalizers.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest

import qparams
from conftest import REPO, start_local_server
from qparams.testing import LocalServer
from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc

HAPROXY = "/usr/sbin/haproxy"
TEMPLATE = REPO / "docker/haproxy/haproxy.cfg"
REPLICAS = ("r0", "r1", "r2")
SLOT_MAP = "0:84 r0\n85:169 r1\n170:255 r2\n"
SESSIONS = [f"run/layer{i}.weight" for i in range(60)]
TIMEOUT = 10  # seconds: the deadline of every wait below


def owner_of(name: str) -> str:
    slot = zlib.crc32(name.encode()) % 256
    for line in SLOT_MAP.splitlines():
        span, replica = line.split()
        low, high = map(int, span.split(":"))
        if low <= slot <= high:
            return replica
    raise AssertionError(f"slot {slot} of {name} is in no range")


def wait_for(what: str, condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Polls `condition` until it holds; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class HAProxy:
    """HAProxy in the foreground (-db) on the rendered template; stopped by its PID."""

    def __init__(self, directory: pathlib.Path, servers: dict[str, str]) -> None:
        self.socket = directory / "grpc.sock"
        self.admin = directory / "admin.sock"
        # sun_path holds 108 bytes, its terminating NUL included.
        assert len(os.fsencode(self.admin)) < 108, f"{directory} is too long; set TMPDIR"
        # The file as it is: what differs here goes in the environment variables it
        # expands (each has a default, so a variable it no longer reads would go unseen).
        self.config = TEMPLATE
        variables = {"QPARAMS_BIND": f"unix@{self.socket}",
                     "QPARAMS_ADMIN_SOCKET": str(self.admin),
                     "QPARAMS_SLOT_MAP": str(directory / "slots.map")}
        for i, replica in enumerate(REPLICAS):
            variables[f"QPARAMS_R{i}"] = servers[replica]
        config = self.config.read_text()
        for name in variables:
            assert f"${{{name}-" in config, name
        env = dict(os.environ, **variables)
        self.log = directory / "haproxy.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen([HAPROXY, "-f", str(self.config), "-db"],
                                            stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT, env=env)

    def listening(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"haproxy exited with {self.process.returncode}:\n{self.log.read_text()}")
        for path in (self.socket, self.admin):
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.connect(str(path))
            except OSError:
                return False
        return True

    def command(self, line: str) -> str:
        """One command of the runtime API; its answer."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(TIMEOUT)
            s.connect(str(self.admin))
            s.sendall(line.encode() + b"\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        return answer.decode()

    def status(self, replica: str) -> str:
        """The health of the replica's server: "UP", "DOWN", ... (show stat)."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row.get("pxname") == replica and row.get("svname") == replica:
                return row["status"]
        raise AssertionError(f"no server {replica} in show stat")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Cluster:
    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        self.slot_map = directory / "slots.map"
        self.slot_map.write_text(SLOT_MAP)
        self.replicas: dict[str, LocalServer] = {}
        self.haproxy: HAProxy | None = None
        self.stopped: list[LocalServer] = []

    def start_replica(self, replica: str) -> LocalServer:
        data = self.directory / f"data-{replica}"
        data.mkdir(exist_ok=True)
        server = start_local_server(f"--replica_id={replica}", f"--slot_map={self.slot_map}",
                                    f"--data_dir={data}", "--durability=always")
        self.replicas[replica] = server
        return server

    def kill_replica(self, replica: str) -> None:
        """SIGKILL: nothing gets flushed on the way out (--durability=always must have
        made every acknowledged mutation durable already)."""
        server = self.replicas.pop(replica)
        self.stopped.append(server)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=TIMEOUT)

    def stop(self) -> None:
        if self.haproxy is not None:
            self.haproxy.stop()
        for server in list(self.replicas.values()) + self.stopped:
            server.stop()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    if not os.access(HAPROXY, os.X_OK):
        pytest.fail(f"{HAPROXY} is missing: scripts/install-deps.sh installs it "
                    "(Debian package haproxy)")
    # A short directory of our own: pytest's tmp_path can be too long for sun_path.
    with tempfile.TemporaryDirectory(prefix="qps-") as directory:
        c = Cluster(pathlib.Path(directory))
        try:
            for replica in REPLICAS:
                c.start_replica(replica)
            c.haproxy = HAProxy(c.directory, {r: s.target for r, s in c.replicas.items()})
            wait_for("haproxy to listen", c.haproxy.listening)
            wait_for("every replica UP in haproxy",
                     lambda: all(c.haproxy.status(r) == "UP" for r in REPLICAS))
            yield c
        finally:
            c.stop()


def tensor(i: int) -> np.ndarray:
    return np.random.default_rng(1600 + i).standard_normal((8, 32)).astype(np.float32)


def snapshot(client: qparams.Client, name: str) -> tuple[bytes, bytes, bytes, int]:
    """What must survive a restart: the whole Session message, the qparams' scale and
    zero_point bytes and the observation count."""
    session = client.get_session(name)
    q = client.get_qparams(name)
    assert q.initialized
    return (session.SerializeToString(deterministic=True), q.scale.tobytes(),
            q.zero_point.tobytes(), session.observation_count)


def local_names(server: LocalServer) -> set[str]:
    with qparams.Client(server.target) as direct:
        return {s.name for s in direct.list_sessions()}


def test_sharded_replicas_behind_haproxy(cluster: Cluster) -> None:
    owners = {name: owner_of(name) for name in SESSIONS}
    assert set(owners.values()) == set(REPLICAS), "the names should spread over every replica"
    target = f"unix:{cluster.haproxy.socket}"

    with qparams.Client(target) as client:
        # Create and observe through HAProxy.
        for i, name in enumerate(SESSIONS):
            created = client.create_session(name, dtype="int8", granularity="per_channel:0")
            assert created.name == name
            result = client.observe(name, tensor(i))
            assert result.observation_count == 1
            assert result.qparams.scale.shape == (8, 1)  # per channel of dim 0
        assert client.health() == "SERVING"

        # Any replica describes the topology: the slot map, which the client's own
        # slot function (zlib's CRC-32) reads like the servers and HAProxy.
        topology = client.topology()
        assert topology.replica_id == "r0"  # calls without a session: the default backend
        assert tuple(topology.replicas) == REPLICAS
        by_slot = {s: r.replica for r in topology.ranges for s in range(r.low, r.high + 1)}
        assert len(by_slot) == topology.slot_count == 256
        assert all(by_slot[zlib.crc32(n.encode()) % 256] == o for n, o in owners.items())

        # Each replica holds exactly the sessions it owns.
        for replica, server in cluster.replicas.items():
            assert local_names(server) == {n for n, o in owners.items() if o == replica}, replica

        # A call sent straight to a replica that does not own the session is refused,
        # naming the owner in the message and in the x-qparams-owner trailer.
        name = next(n for n in SESSIONS if owners[n] == "r2")
        with qparams.Client(cluster.replicas["r0"].target) as wrong:
            with pytest.raises(qparams.FailedPrecondition, match="belongs to replica r2"):
                wrong.get_session(name)
            with pytest.raises(qparams.FailedPrecondition, match="belongs to replica r2"):
                wrong.observe(name, tensor(0), reduce="never")
        with grpc.insecure_channel(cluster.replicas["r0"].target) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                pb_grpc.QParamsServiceStub(channel).GetSession(pb.GetSessionRequest(name=name),
                                                               timeout=TIMEOUT)
            assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert ("x-qparams-owner", "r2") in tuple(raised.value.trailing_metadata())

        before = {name: snapshot(client, name) for name in SESSIONS}

        # r1 dies (SIGKILL): HAProxy's health check marks it DOWN, its sessions are
        # UNAVAILABLE, the others' keep working and stay where they are.
        cluster.kill_replica("r1")
        wait_for("haproxy to mark r1 DOWN",
                 lambda: cluster.haproxy.status("r1").startswith("DOWN"))
        for i, name in enumerate(SESSIONS):
            if owners[name] == "r1":
                with pytest.raises(qparams.Unavailable):
                    client.get_qparams(name)
                with pytest.raises(qparams.Unavailable):
                    client.observe(name, tensor(i), reduce="never")
            else:
                assert client.observe(name, tensor(i)).observation_count == 2
        for replica, server in cluster.replicas.items():
            assert local_names(server) == {n for n, o in owners.items() if o == replica}, replica

        # r1 restarts on its data dir, on a new port; HAProxy's runtime API points its
        # backend there, and the health check brings it UP.
        server = cluster.start_replica("r1")
        host, port = server.target.rsplit(":", 1)
        answer = cluster.haproxy.command(f"set server r1/r1 addr {host} port {port}")
        assert "changed" in answer, answer
        wait_for("haproxy to mark r1 UP", lambda: cluster.haproxy.status("r1") == "UP")

        assert local_names(server) == {n for n, o in owners.items() if o == "r1"}
        for name in SESSIONS:
            if owners[name] == "r1":
                assert snapshot(client, name) == before[name], name
            else:
                assert client.get_session(name).observation_count == 2, name
