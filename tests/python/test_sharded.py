"""Sharded replicas behind HAProxy (issue 16), end to end: three qparams-server
replicas r0, r1, r2 with one slot map, HAProxy run on docker/haproxy/haproxy.cfg as
shipped (its environment variables giving a UNIX socket to listen on, the replicas'
loopback ports, paths in a temporary directory), and the Python client, which names
each call's session in the x-qparams-session header HAProxy routes on, and splits
calls over many sessions into one per owning replica (x-qparams-replica).

Checked: sessions created through HAProxy land on their owner (crc32(name) mod 256
in the map) and only there; a replica refuses another's session with
FAILED_PRECONDITION naming the owner (message and x-qparams-owner trailer); a killed
replica's sessions answer UNAVAILABLE through HAProxy while the others' keep working;
the replica restarted on its data dir (on new ports, which HAProxy learns through
its runtime API) has its sessions back bit for bit; HAProxy checks each replica's
GET /healthz (on its --metrics_listen port) and takes a draining replica out while
it still runs; observe_many, observe_batch and
observe_async over sessions of every replica end bit for bit as on one server, and so
do histogram sessions (percentile, entropy, mse; tensors and local histograms);
list_sessions, read_sessions and qparams-cli list/report span every replica in name
order, page after page; export (every format, the compressed-tensors helper,
qparams-cli export) and qparams-cli report give one server's bytes, and its errors.

Every process is started here and stopped by its PID in fixture finalizers.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import re
import threading
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest

import qparams
from conftest import REPO, start_local_server
from helpers import ADMIN_TOKEN, admin_tokens_file, slot
from qparams.testing import LocalServer
from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc

HAPROXY = "/usr/sbin/haproxy"
TEMPLATE = REPO / "docker/haproxy/haproxy.cfg"
REPLICAS = ("r0", "r1", "r2")
SPARE_BACKENDS_END = 8  # haproxy.cfg's backends r0 .. r7; r3 .. r7 are spares
SLOT_MAP = "0:84 r0\n85:169 r1\n170:255 r2\n"
SESSIONS = [f"run/layer{i}.weight" for i in range(60)]
TIMEOUT = 10  # seconds: the deadline of every wait below
METRICS_LINE = re.compile(r"serving metrics on http://127\.0\.0\.1:(\d+)/metrics")


def owner_of(name: str) -> str:
    for line in SLOT_MAP.splitlines():
        span, replica = line.split()
        low, high = map(int, span.split(":"))
        if low <= slot(name) <= high:
            return replica
    raise AssertionError(f"slot {slot(name)} of {name} is in no range")


def wait_for(what: str, condition: Callable[[], bool], timeout: float = TIMEOUT) -> None:
    """Polls `condition` until it holds; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


class HAProxy:
    """HAProxy in the foreground (-db) on the shipped configuration; stopped by its PID."""

    def __init__(self, directory: pathlib.Path, servers: dict[str, str],
                 check_ports: dict[str, int]) -> None:
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
            variables[f"QPARAMS_R{i}_CHECK_PORT"] = str(check_ports[replica])
        # The spare backends (disabled) at a loopback address: no name to resolve.
        for i in range(len(REPLICAS), SPARE_BACKENDS_END):
            variables[f"QPARAMS_R{i}"] = "127.0.0.1:1"
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
        self.admin_tokens_file = admin_tokens_file(directory)  # every replica's
        self.replicas: dict[str, LocalServer] = {}
        self.check_ports: dict[str, int] = {}  # each replica's --metrics_listen port
        self.haproxy: HAProxy | None = None
        self.stopped: list[LocalServer] = []

    def start_replica(self, replica: str) -> LocalServer:
        data = self.directory / f"data-{replica}"
        data.mkdir(exist_ok=True)
        server = start_local_server(f"--replica_id={replica}", f"--slot_map={self.slot_map}",
                                    f"--data_dir={data}", "--durability=always",
                                    "--metrics_listen=127.0.0.1:0",
                                    f"--admin_tokens_file={self.admin_tokens_file}",
                                    # listings, reads and exports fan out through HAProxy
                                    f"--cluster_address=unix:{self.directory / 'grpc.sock'}")
        self.replicas[replica] = server
        # Logged right after the "listening on" line LocalServer waited for.
        wait_for(f"{replica}'s metrics port in its log",
                 lambda: any(METRICS_LINE.search(line) for line in server.log))
        self.check_ports[replica] = int(next(
            m[1] for line in server.log if (m := METRICS_LINE.search(line))))
        return server

    def route_to(self, replica: str) -> None:
        """Points HAProxy's backend `replica` (and its health check) at the replica's
        current ports through the runtime API, and the pool's server `replica` (calls
        naming no session) there too, makes it ready (a spare backend starts
        disabled) and waits until its health check marks it UP."""
        host, port = self.replicas[replica].target.rsplit(":", 1)
        answer = self.haproxy.command(f"set server any/{replica} addr {host} port {port}")
        assert "changed" in answer, answer
        prefix = f"set server {replica}/{replica}"
        answer = self.haproxy.command(f"{prefix} addr {host} port {port}")
        assert "changed" in answer, answer
        answer = self.haproxy.command(f"{prefix} check-port {self.check_ports[replica]}")
        assert answer.strip() == "", answer  # HAProxy 2.6 says nothing when it worked
        answer = self.haproxy.command(f"{prefix} state ready")
        assert answer.strip() == "", answer
        wait_for(f"haproxy to mark {replica} UP", lambda: self.haproxy.status(replica) == "UP")

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
            c.haproxy = HAProxy(c.directory, {r: s.target for r, s in c.replicas.items()},
                                c.check_ports)
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


def local_names(server: LocalServer, replica: str) -> set[str]:
    """The sessions the replica holds, asked straight (addressed to it by name: a
    routed client would split the listing over every replica)."""
    with qparams.Client(server.target, replica=replica) as direct:
        return {s.name for s in direct.list_sessions()}


def test_sharded_replicas_behind_haproxy(cluster: Cluster) -> None:
    owners = {name: owner_of(name) for name in SESSIONS}
    assert set(owners.values()) == set(REPLICAS), "the names should spread over every replica"
    target = f"unix:{cluster.haproxy.socket}"

    # No retries: r1's sessions answer UNAVAILABLE while it is down, which this test
    # checks (a client that retries would wait for r1 for retry_total).
    with qparams.Client(target, retry_total=0) as client:
        # Create and observe through HAProxy.
        for i, name in enumerate(SESSIONS):
            created = client.create_session(name, dtype="int8", granularity="per_channel:0", target="weight")
            assert created.name == name
            result = client.observe(name, tensor(i))
            assert result.observation_count == 1
            assert result.qparams.scale.shape == (8, 1)  # per channel of dim 0
        assert client.health() == "SERVING"

        # Any replica describes the topology: the slot map, which the client's own
        # slot function (zlib's CRC-32) reads like the servers and HAProxy.
        topology = client.topology()
        assert topology.replica_id in REPLICAS  # calls without a session: any replica
        assert tuple(topology.replicas) == REPLICAS
        by_slot = {s: r.replica for r in topology.ranges for s in range(r.low, r.high + 1)}
        assert len(by_slot) == topology.slot_count == 256
        assert all(by_slot[slot(n)] == o for n, o in owners.items())

        # Each replica holds exactly the sessions it owns.
        for replica, server in cluster.replicas.items():
            own = {n for n, o in owners.items() if o == replica}
            assert local_names(server, replica) == own, replica

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
        with pytest.raises(qparams.Unavailable, match="^UNAVAILABLE: replica r1: "):
            client.export("run/", "onnx")  # no document without r1's share
        for replica, server in cluster.replicas.items():
            own = {n for n, o in owners.items() if o == replica}
            assert local_names(server, replica) == own, replica

        # r1 restarts on its data dir, on new ports; HAProxy's runtime API points its
        # backend and its health check there, and the health check brings it UP.
        server = cluster.start_replica("r1")
        cluster.route_to("r1")

        assert local_names(server, "r1") == {n for n, o in owners.items() if o == "r1"}
        for name in SESSIONS:
            if owners[name] == "r1":
                assert snapshot(client, name) == before[name], name
            else:
                assert client.get_session(name).observation_count == 2, name


def healthz(port: int) -> tuple[int, str]:
    """GET /healthz of a replica's metrics listener: the status and the body."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def test_haproxy_takes_a_draining_replica_out(cluster: Cluster) -> None:
    """Health means serving: on SIGTERM a replica turns NOT_SERVING and drains (an
    ObserveStream left open holds the drain here), its /healthz answers 503 saying
    so, and HAProxy marks it DOWN while the process still runs, so that its sessions
    answer UNAVAILABLE at once instead of reaching a replica that is going away."""
    assert all(healthz(port) == (200, "SERVING\n") for port in cluster.check_ports.values())
    name = next(n for n in SESSIONS if owner_of(n) == "r2")
    r2 = cluster.replicas["r2"]
    release = threading.Event()

    def requests():
        yield pb.ObserveRequest(name=name)  # refused (no observation), but answered: the call is open
        release.wait(TIMEOUT)

    with qparams.Client(f"unix:{cluster.haproxy.socket}") as client, \
            grpc.insecure_channel(r2.target) as channel:
        client.create_session(name, dtype="int8", target="weight")
        responses = pb_grpc.QParamsServiceStub(channel).ObserveStream(requests(), timeout=3 * TIMEOUT)
        try:
            assert next(responses).status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
            r2.process.send_signal(signal.SIGTERM)
            wait_for("r2's /healthz to answer 503", lambda: healthz(cluster.check_ports["r2"])[0] == 503)
            status, body = healthz(cluster.check_ports["r2"])
            assert body.startswith("NOT_SERVING: shutting down"), body
            wait_for("haproxy to mark the draining r2 DOWN",
                     lambda: cluster.haproxy.status("r2").startswith("DOWN"))
            assert r2.process.poll() is None, "r2 should still be draining"
            with pytest.raises(qparams.Unavailable):
                client.get_session(name)
            other = next(n for n in SESSIONS if owner_of(n) == "r0")
            client.create_session(other, dtype="int8", target="weight")
            assert cluster.haproxy.status("r0") == "UP"
        finally:
            release.set()
        assert list(responses) == []  # the stream ends cleanly once released
    assert r2.process.wait(timeout=TIMEOUT) == 0


def cli(*args: str) -> subprocess.CompletedProcess:
    binary = os.environ.get("QPARAMS_CLI") or str(REPO / "build/tools/qparams-cli")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def calibrate(client: qparams.Client) -> dict[str, tuple[bytes, bytes, int]]:
    """Creates the sessions and observes each through every path that spans many
    sessions (observe_many whole and reduced, observe_batch, observe_async), items
    interleaved across sessions; returns each session's qparams bytes and count."""
    for name in SESSIONS:
        client.create_session(name, dtype="int8", granularity="per_channel:0",
                              calculator="global_minmax", target="weight")
    items = [(name, tensor(i)) for i, name in enumerate(SESSIONS)]
    results = list(client.observe_many(items, reduce="never"))
    assert all(isinstance(r, qparams.ObserveResult) for r in results), results
    assert [r.observation_count for r in results] == [1] * len(SESSIONS)
    shuffled = [(name, tensor(i + 100)) for i, name in reversed(list(enumerate(SESSIONS)))]
    results = list(client.observe_many(shuffled, reduce="always"))
    assert [r.observation_count for r in results] == [2] * len(SESSIONS)
    results = client.observe_batch([(name, tensor(i + 200)) for i, name in enumerate(SESSIONS)])
    assert [r.observation_count for r in results] == [3] * len(SESSIONS)
    futures = [client.observe_async(name, tensor(i + 300)) for i, name in enumerate(SESSIONS)]
    client.flush()
    assert [f.result().observation_count for f in futures] == [4] * len(SESSIONS)
    out = {}
    for name in SESSIONS:
        q = client.get_qparams(name)
        out[name] = (q.scale.tobytes(), q.zero_point.tobytes(),
                     client.get_session(name).observation_count)
    return out


def test_many_sessions_split_by_owner(cluster: Cluster) -> None:
    """observe_many / observe_batch / observe_async over sessions of every replica,
    through HAProxy, end bit for bit where one unsharded server ends."""
    with start_local_server() as single, qparams.Client(single.target) as client:
        expected = calibrate(client)
    with qparams.Client(f"unix:{cluster.haproxy.socket}") as client:
        assert calibrate(client) == expected
        # A refused item fails alone, on whichever replica's stream it travels.
        items = [(SESSIONS[0], tensor(0)), ("run/missing", tensor(1)), (SESSIONS[1], tensor(2))]
        outcomes = list(client.observe_many(items, reduce="never"))
        assert isinstance(outcomes[1], qparams.NotFound) and outcomes[1].session == "run/missing"
        assert outcomes[0].observation_count == outcomes[2].observation_count == 5
    for replica, server in cluster.replicas.items():
        own = {n for n in SESSIONS if owner_of(n) == replica}
        assert local_names(server, replica) == own, replica


HISTOGRAM_SESSIONS = [(f"run/act{i}.output", ("percentile", "entropy", "mse")[i % 3])
                      for i in range(12)]


def calibrate_histograms(client: qparams.Client) -> dict[str, tuple]:
    """Creates histogram sessions of the three kinds and observes each through the
    paths that span many sessions (tensors and local histograms, observe_many and
    observe_batch) and one observe_histogram each; returns what must match one server:
    the histogram's bytes, the calibration and the qparams of every session."""
    for name, calculator in HISTOGRAM_SESSIONS:
        client.create_session(name, dtype="int8", calculator=calculator, target="activation",
                              histogram={"num_bins": 1024})
    names = [name for name, _ in HISTOGRAM_SESSIONS]
    results = list(client.observe_many([(n, tensor(i)) for i, n in enumerate(names)],
                                       reduce="never", omit_qparams=True))
    assert [r.observation_count for r in results] == [1] * len(names), results
    results = list(client.observe_many([(n, tensor(i + 50)) for i, n in enumerate(names)],
                                       reduce="always", omit_qparams=True))
    assert [r.observation_count for r in results] == [2] * len(names), results
    results = client.observe_batch([(n, tensor(i + 80)) for i, n in enumerate(names)])
    assert [r.observation_count for r in results] == [3] * len(names), results
    for i, n in enumerate(names):
        client.observe_histogram(n, qparams.local_histogram(tensor(i + 90), 1024))
    out = {}
    for n in names:
        q = client.get_qparams(n)
        h = client.get_histogram(n)
        out[n] = (h.to_proto().SerializeToString(deterministic=True), q.scale.tobytes(),
                  q.zero_point.tobytes(), str(q.calibration))
    return out


def test_histogram_sessions_work_sharded(cluster: Cluster) -> None:
    """Histogram sessions behind HAProxy end bit for bit where one server ends, each on
    its owner only: sharding needs nothing of its own for them."""
    with start_local_server() as single, qparams.Client(single.target) as client:
        expected = calibrate_histograms(client)
    with qparams.Client(f"unix:{cluster.haproxy.socket}") as client:
        assert calibrate_histograms(client) == expected
    names = {n for n, _ in HISTOGRAM_SESSIONS}
    for replica, server in cluster.replicas.items():
        assert local_names(server, replica) == {n for n in names if owner_of(n) == replica}


def test_listing_spans_every_replica(cluster: Cluster) -> None:
    """ListSessions and ReadSessions through HAProxy: every replica's sessions, in name
    order, page after page; the C++ client (qparams-cli) pages with tokens any
    replica accepts."""
    target = f"unix:{cluster.haproxy.socket}"
    names = sorted(SESSIONS + [f"other/{i}" for i in range(5)])
    with qparams.Client(target) as client:
        for name in names:
            client.create_session(name, dtype="int8", target="weight")
        for page_size in (0, 1, 7, 1000):
            assert [s.name for s in client.list_sessions(page_size=page_size)] == names
        assert [s.name for s in client.list_sessions("run/layer1")] == [
            n for n in names if n.startswith("run/layer1")]
        assert [s.name for s in client.read_sessions()] == names
        assert [s.name for s in client.read_sessions("other/")] == names[:5]

    # The C++ client: pages of 7 merged from the three replicas, each page's token
    # taken by every replica for the next.
    listed, token = [], ""
    for _ in range(len(names)):
        args = ["--target=" + target, "list", "--page_size=7"]
        page = cli(*args, *(["--page_token=" + token] if token else []))
        assert page.returncode == 0, page.stderr
        document = json.loads(page.stdout)
        got = [s["name"] for s in document.get("sessions", [])]
        assert len(got) <= 7
        listed += got
        token = document.get("nextPageToken", document.get("next_page_token", ""))
        if not token:
            break
    assert listed == names
    report = cli("--target=" + target, "report", "--prefix=run/")
    assert report.returncode == 0, report.stderr
    assert [s["name"] for s in json.loads(report.stdout)["sessions"]] == sorted(SESSIONS)

    # One replica on its own, through the balancer: only its sessions.
    for replica in REPLICAS:
        with qparams.Client(target, replica=replica) as client:
            assert [s.name for s in client.list_sessions()] == [
                n for n in names if owner_of(n) == replica]
            assert client.topology().replica_id == replica
        one = cli("--target=" + target, "--replica=" + replica, "list", "--page_size=1000")
        assert [s["name"] for s in json.loads(one.stdout).get("sessions", [])] == [
            n for n in names if owner_of(n) == replica], one.stderr


def test_cli_observes_through_owner_stream(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    """qparams-cli observe (an ObserveStream of the C++ client) through HAProxy reaches
    the owner of any session; a refusal by a non-owner carries its owner."""
    target = f"unix:{cluster.haproxy.socket}"
    np.save(tmp_path / "x.npy", tensor(0))
    with qparams.Client(target) as client:
        for replica in REPLICAS:
            name = next(n for n in SESSIONS if owner_of(n) == replica)
            client.create_session(name, dtype="int8", granularity="per_channel:0", target="weight")
            for flags in ([], ["--reduce-locally"]):
                done = cli("--target=" + target, "observe", *flags, name, str(tmp_path / "x.npy"))
                assert done.returncode == 0, done.stderr
            assert client.get_session(name).observation_count == 2
        name = next(n for n in SESSIONS if owner_of(n) == "r2")
        with qparams.Client(cluster.replicas["r0"].target, replica="r0") as wrong:
            with pytest.raises(qparams.FailedPrecondition) as raised:
                wrong.get_session(name)
            assert raised.value.owner == "r2"


def test_scale_groups_route_on_their_hash_tag(cluster: Cluster) -> None:
    """Scale groups through HAProxy: each group's calls reach the replica owning its
    hash tag, where its members are; listing merges every replica's groups in name
    order; a member in another slot is refused."""
    tags: dict[str, str] = {}  # one hash tag per replica
    for i in range(100):
        tags.setdefault(owner_of(f"t{i}"), f"t{i}")
        if len(tags) == len(REPLICAS):
            break
    target = f"unix:{cluster.haproxy.socket}"
    groups = sorted(f"grp/{{{tag}}}.qk" for tag in tags.values())
    with qparams.Client(target) as client:
        for replica, tag in tags.items():
            members = [f"grp/{{{tag}}}.q", f"grp/{{{tag}}}.k"]
            for name in members:
                client.create_session(name, target="weight", dtype="float4_e2m1fn_x2",
                                      scale_dtype="float8_e4m3fn",
                                      granularity="per_block:-1:16")
                client.observe(name, np.full((1, 16), 1.0, np.float32))
            group = f"grp/{{{tag}}}.qk"
            client.create_scale_group(group, members)
            assert client.get_scale_group(group).members == tuple(members)
            assert client.get_group_qparams(group).initialized
            with qparams.Client(target, replica=replica) as direct:
                assert [g.name for g in direct.list_scale_groups("grp/")] == [group]
        assert [g.name for g in client.list_scale_groups("grp/", page_size=1)] == groups
        first, second = list(tags.values())[:2]
        with pytest.raises(qparams.InvalidArgument):
            client.create_scale_group(f"grp/{{{first}}}.mixed",
                                      [f"grp/{{{first}}}.q", f"grp/{{{second}}}.q"])
        for group in groups:
            client.delete_scale_group(group)
        assert list(client.list_scale_groups("grp/")) == []


def nvfp4_session(client: qparams.Client, name: str, convention: str, target: str,
                  x: np.ndarray) -> None:
    """An NVFP4 session of `convention` observed once on x (a weight in blocks of 16
    along its last axis, an input in the tuple form)."""
    client.create_session(name, calculator="global_minmax", dtype="float4_e2m1fn_x2",
                          scale_dtype="float8_e4m3fn", convention=convention, target=target,
                          granularity="per_block:-1:16" if target == "weight"
                          else "per_block:-1,16")
    client.observe(name, x)


def calibrate_for_export(client: qparams.Client) -> None:
    """Sessions for every export format, spread over the replicas by their names:
    integer weights and activations (mx/int/), sessions that never saw data
    (mx/idle/), NVFP4 layers of each convention whose q/k/v weights share a
    GLOBAL_AMAX scale group (mx/ct/, mx/mo/), fused siblings without a group
    (mx/fused/) and a group with an uncalibrated member (mx/ug/)."""
    rng = np.random.default_rng(2026)
    for i in range(8):
        client.create_session(f"mx/int/fc{i}.weight", calculator="global_minmax",
                              target="weight", dtype="int8", granularity="per_channel:0")
        client.observe(f"mx/int/fc{i}.weight", rng.standard_normal((4, 16), np.float32))
        client.create_session(f"mx/int/fc{i}.input", calculator="global_minmax",
                              target="activation", dtype="uint8", qscheme="asymmetric")
        client.observe(f"mx/int/fc{i}.input", rng.standard_normal((8, 16), np.float32) + 0.5)
    client.create_session("mx/int/head.weight", calculator="global_minmax", target="weight",
                          dtype="int4", granularity="per_block:1:4")
    client.observe("mx/int/head.weight", rng.standard_normal((2, 8), np.float32))
    for i in range(6):
        client.create_session(f"mx/idle/fc{i}.weight", calculator="global_minmax",
                              target="weight", dtype="int8")
    for convention, prefix in (("compressed_tensors", "mx/ct"), ("modelopt", "mx/mo")):
        for layer in range(3):
            tag = f"{{layers.{layer}.self_attn}}"
            members = [f"{prefix}/{tag}.{p}_proj.weight" for p in "qkv"]
            for m in members:
                nvfp4_session(client, m, convention, "weight",
                              rng.standard_normal((4, 32), np.float32) * (1 + layer))
            client.create_scale_group(f"{prefix}/{tag}.qkv", members)
            for role, target in (("weight", "weight"), ("input", "activation")):
                nvfp4_session(client, f"{prefix}/layers.{layer}.mlp.down_proj.{role}",
                              convention, target, rng.standard_normal((4, 32), np.float32))
    for p in ("gate", "up"):
        nvfp4_session(client, f"mx/fused/layers.0.mlp.{p}_proj.weight", "compressed_tensors",
                      "weight", rng.standard_normal((4, 32), np.float32))
    members = ["mx/ug/{g}.a.weight", "mx/ug/{g}.b.weight"]
    nvfp4_session(client, members[0], "compressed_tensors", "weight",
                  rng.standard_normal((4, 32), np.float32))
    client.create_session(members[1], calculator="global_minmax", dtype="float4_e2m1fn_x2",
                          scale_dtype="float8_e4m3fn", target="weight",
                          granularity="per_block:-1:16")
    client.create_scale_group("mx/ug/{g}.ab", members)


# (prefix, format, allow_uninitialized, tensor_names): documents and refusals alike.
EXPORTS = [
    ("mx/int/", "aimet", False, None),
    ("mx/int/", "onnx", False, None),
    ("mx/int/", "onnx", False, {"fc1.weight": "/fc1/W", "fc5.input": "/fc5/X"}),
    ("mx/int/", "compressed-tensors", False, None),
    ("mx/ct/", "compressed-tensors", False, None),
    ("mx/mo/", "modelopt", False, None),
    ("mx/i", "aimet", True, None),         # the uninitialized left out
    ("mx/i", "aimet", False, None),        # uninitialized on every replica: one list
    ("mx/", "aimet", False, None),         # the first session aimet cannot express
    ("mx/ct/", "modelopt", False, None),   # another convention
    ("mx/fused/", "compressed-tensors", False, None),  # siblings on two replicas
    ("mx/ug/", "compressed-tensors", False, None),     # the group's uncalibrated member
    ("mx/int/", "bogus", False, None),
    ("mx/none/", "onnx", False, None),
]


def export_outcome(client: qparams.Client, prefix: str, format: str, allow: bool,
                   names: dict[str, str] | None) -> tuple[str, str]:
    """The document, or the refusal's type and message."""
    try:
        return "document", client.export(prefix, format, allow_uninitialized=allow,
                                         tensor_names=names)
    except qparams.QParamsError as e:
        return type(e).__name__, str(e)


def cli_outcomes(target: str) -> list[tuple[int, str, str]]:
    """qparams-cli export of every EXPORTS case without tensor names, and report (JSON
    and table) of every session: exit status, stdout, stderr."""
    runs = [["export", f"--prefix={p}", f"--format={f}"] +
            (["--allow-uninitialized"] if allow else [])
            for p, f, allow, names in EXPORTS if names is None]
    runs += [["report", "--prefix=mx/"], ["report", "--prefix=mx/", "--format=table"]]
    out = []
    for run in runs:
        done = cli("--target=" + target, *run)
        out.append((done.returncode, done.stdout, done.stderr))
    return out


def test_exports_merge_every_replica(cluster: Cluster) -> None:
    """export through HAProxy: one document of every replica's sessions, the bytes of
    one unsharded server holding the same sessions, in every format (NVFP4 scale
    groups and fused-sibling checks included), and the same refusals; the
    compressed-tensors helper and qparams-cli export and report alike."""
    target = f"unix:{cluster.haproxy.socket}"
    with start_local_server() as single, qparams.Client(single.target) as alone:
        calibrate_for_export(alone)
        expected = [export_outcome(alone, *case) for case in EXPORTS]
        expected_tensors, expected_config = alone.export_compressed_tensors("mx/ct/")
        expected_cli = cli_outcomes(single.target)
    assert [code == 0 for code, _, _ in expected_cli] == [True] * 6 + [False] * 7 + [True] * 2
    assert [kind for kind, _ in expected] == ["document"] * 7 + [
        "FailedPrecondition", "InvalidArgument", "InvalidArgument", "FusedGlobalScalesDiffer",
        "UncalibratedGroup", "InvalidArgument", "NotFound"], expected
    with qparams.Client(target) as client:
        calibrate_for_export(client)
        held = {r: local_names(server, r) for r, server in cluster.replicas.items()}
        for prefix in ("mx/int/", "mx/idle/", "mx/ct/", "mx/mo/", "mx/fused/"):
            owners = {r for r, names in held.items() if any(n.startswith(prefix) for n in names)}
            assert len(owners) > 1, (prefix, owners)  # the documents span replicas
        for case, want in zip(EXPORTS, expected):
            assert export_outcome(client, *case) == want, case
        tensors, config = client.export_compressed_tensors("mx/ct/")
        assert config == expected_config
        assert sorted(tensors) == sorted(expected_tensors)
        for name, t in tensors.items():
            assert t.dtype == expected_tensors[name].dtype and t.equal(expected_tensors[name])
    assert cli_outcomes(target) == expected_cli
def test_an_export_waits_for_every_replica_to_serve_one_slot_map(cluster: Cluster) -> None:
    """A map taken by one replica and not yet by the others (a move's switch under
    way) could make an export miss a session or hold it twice: export raises Aborted
    naming each replica's epoch (after retrying within retry_total), and is the same
    document once every replica serves the map."""
    target = f"unix:{cluster.haproxy.socket}"
    with qparams.Client(target, retry_total=0.2, retry_initial_backoff=0.01) as client:
        calibrate(client)
        before = client.export("run/", "onnx")
        same_owners = "# epoch 1\n" + SLOT_MAP
        with qparams.Client(target, replica="r1", token=ADMIN_TOKEN) as admin:
            admin.set_slot_map(same_owners)
        with pytest.raises(qparams.Aborted) as aborted:
            client.export("run/", "onnx")
        assert "the replicas serve different slot maps (r0 epoch 0, r1 epoch 1, r2 epoch 0)" \
            in str(aborted.value)
        for replica in ("r0", "r2"):
            with qparams.Client(target, replica=replica, token=ADMIN_TOKEN) as admin:
                admin.set_slot_map(same_owners)
        assert client.export("run/", "onnx") == before


# r0's slots move to r1, and r0 owns none: what SetSlotMap gives every replica below.
MOVED_MAP = "# epoch 1\n0:169 r1\n170:255 r2\n"


def observe_everywhere(client: qparams.Client, names: list[str]) -> list[int]:
    """observe_many, observe_batch and observe_async over `names`; each item's count
    after the three (asserting that none failed)."""
    results = list(client.observe_many([(n, tensor(i)) for i, n in enumerate(names)],
                                       reduce="never"))
    assert all(isinstance(r, qparams.ObserveResult) for r in results), results
    results = client.observe_batch([(n, tensor(i + 100)) for i, n in enumerate(names)])
    assert all(isinstance(r, qparams.ObserveResult) for r in results), results
    futures = [client.observe_async(n, tensor(i + 200)) for i, n in enumerate(names)]
    client.flush()
    return [f.result().observation_count for f in futures]


def test_clients_follow_a_slot_map_changed_under_them(cluster: Cluster) -> None:
    """A live client that read the topology before slots moved (HAProxy still routing
    by the old map): a call refused naming the new owner is retried there once, and
    the items of observe_many / observe_batch / observe_async that the old owner
    refuses go again to the new one, answers in item order; the results are bit for
    bit those of one server. Sessions on moved slots are created fresh on the new
    owner (copying their state is a move's job)."""
    target = f"unix:{cluster.haproxy.socket}"
    moved = [n for n in SESSIONS if owner_of(n) == "r0"][:8]
    kept = [n for n in SESSIONS if owner_of(n) != "r0"][:8]
    names = [n for pair in zip(moved, kept) for n in pair]  # interleaved
    with start_local_server() as single, qparams.Client(single.target) as one:
        for name in names:
            one.create_session(name, dtype="int8", calculator="global_minmax", target="weight")
        assert observe_everywhere(one, names) == [3] * len(names)
        expected = {n: one.get_qparams(n).scale.tobytes() for n in names}

    with qparams.Client(target) as live, qparams.Client(target) as unary:
        for name in kept:
            live.create_session(name, dtype="int8", calculator="global_minmax", target="weight")
        list(live.list_sessions())  # reads the topology: epoch 0, r0 owning 0:84
        assert live.topology().epoch == 0

        for replica in REPLICAS:
            with qparams.Client(target, replica=replica, token=ADMIN_TOKEN) as admin:
                topology = admin.set_slot_map(MOVED_MAP)
                assert (topology.replica_id, topology.epoch) == (replica, 1)
        # HAProxy still sends r0's old slots to r0, which refuses naming r1: created
        # there on the retry.
        for name in moved:
            assert unary.create_session(name, dtype="int8", calculator="global_minmax",
                                        target="weight").name == name
        assert local_names(cluster.replicas["r1"], "r1") >= set(moved)
        with qparams.Client(cluster.replicas["r0"].target, replica="r0") as r0:
            with pytest.raises(qparams.FailedPrecondition) as refused:
                r0.get_session(moved[0])
            assert refused.value.owner == "r1"

        # `live` still routes by epoch 0: r0's streams and batches refuse the moved
        # items, which go again to r1.
        assert observe_everywhere(live, names) == [3] * len(names)
        assert {n: live.get_qparams(n).scale.tobytes() for n in names} == expected
        assert live.topology().epoch == 1
        # A client pinned to r0 is not rerouted.
        with qparams.Client(target, replica="r0") as pinned:
            with pytest.raises(qparams.FailedPrecondition):
                pinned.get_qparams(moved[0])

    # qparams-cli slotmap push: the replicas have the map (nothing changes), and
    # HAProxy's map is replaced through its runtime API, without a reload.
    map_file = cluster.directory / "moved.map"
    map_file.write_text(MOVED_MAP)
    pushed = cli(f"--target={target}", f"--token={ADMIN_TOKEN}", "slotmap", "push",
                 str(map_file), f"--haproxy_admin={cluster.haproxy.admin}")
    assert pushed.returncode == 0, pushed.stderr
    report = json.loads(pushed.stdout)
    assert report["epoch"] == 1
    # The map's replicas, and the one that answered GetTopology (any replica: the
    # balancer's pool), which may be r0, which the map no longer names.
    pushed_to = [(r["replica"], r["epoch"]) for r in report["replicas"]]
    assert {("r1", 1), ("r2", 1)} <= set(pushed_to) <= {("r0", 1), ("r1", 1), ("r2", 1)}, \
        pushed_to
    assert report["haproxy"] == [{"admin": str(cluster.haproxy.admin),
                                  "map": str(cluster.slot_map)}]
    entries = [line.split()[1:] for line in
               cluster.haproxy.command(f"show map {cluster.slot_map}").splitlines() if line]
    assert entries == [["0:169", "r1"], ["170:255", "r2"]]
    # HAProxy now sends a moved session straight to r1: a stub that cannot retry.
    with grpc.insecure_channel(target) as channel:
        session = pb_grpc.QParamsServiceStub(channel).GetSession(
            pb.GetSessionRequest(name=moved[0]), timeout=TIMEOUT,
            metadata=(("x-qparams-session", moved[0]),))
        assert session.observation_count == 3
    # An older map is refused by every replica, and HAProxy is left as it is.
    map_file.write_text(SLOT_MAP)
    refused = cli(f"--target={target}", f"--token={ADMIN_TOKEN}", "slotmap", "push",
                  str(map_file), f"--haproxy_admin={cluster.haproxy.admin}", "--format=table")
    assert refused.returncode == 1, refused.stdout
    assert "epoch 0 is older than replica r1's epoch 1" in refused.stdout, refused.stdout
    assert "not changed: a replica did not take the map" in refused.stdout, refused.stdout


def test_reshard_gives_haproxy_the_new_map(cluster: Cluster) -> None:
    """qparams-cli reshard --haproxy_admin: once every replica took the new map,
    HAProxy's is replaced through its runtime API, so a moved session is reached
    through HAProxy straight at its new owner (a stub that cannot follow a refusal),
    with the state it had on the old one."""
    target = f"unix:{cluster.haproxy.socket}"
    low, high = 170, 179
    with qparams.Client(target) as client:
        owners = {s: r.replica for r in client.topology().ranges
                  for s in range(r.low, r.high + 1)}
        source = owners[low]
        assert all(owners[s] == source for s in range(low, high + 1)), owners
        destination = "r1" if source != "r1" else "r0"
        names = [n for n in (f"reshard/s{i}" for i in range(2000))
                 if low <= slot(n) <= high][:3]
        for i, name in enumerate(names):
            client.create_session(name, dtype="int8", calculator="global_minmax",
                                  target="weight")
            client.observe(name, tensor(i))
    moved = cli(f"--target={target}", f"--token={ADMIN_TOKEN}", "reshard", f"{low}:{high}",
                source, destination, f"--haproxy_admin={cluster.haproxy.admin}")
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["outcome"] == "done"
    assert f"HAProxy {cluster.haproxy.admin}: slot map epoch" in moved.stderr, moved.stderr
    with qparams.Client(target) as client:
        ranges = [[f"{r.low}:{r.high}", r.replica] for r in client.topology().ranges]
    entries = [line.split()[1:] for line in
               cluster.haproxy.command(f"show map {cluster.slot_map}").splitlines() if line]
    assert entries == ranges
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.QParamsServiceStub(channel)
        for name in names:
            session = stub.GetSession(pb.GetSessionRequest(name=name), timeout=TIMEOUT,
                                      metadata=(("x-qparams-session", name),))
            assert session.observation_count == 1
    assert local_names(cluster.replicas[destination], destination) >= set(names)
