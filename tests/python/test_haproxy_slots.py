"""HAProxy's slot of a session name is the servers' (issue 16): the balancer routes on
`req.hdr(x-qparams-session),crc32,mod(256)`, the servers shard on
qparams::SlotOf(name), zlib's CRC-32 mod 256 (common/slot.h). This runs Debian's
HAProxy (/usr/sbin/haproxy, which scripts/install-deps.sh installs) with a frontend
that answers each request with that expression's value, and compares it, for about
2000 names, with `qparams-cli slot` and with Python's zlib.crc32.

HAProxy listens on a UNIX socket in pytest's temporary directory: no TCP port, so no
port to race for.
"""

from __future__ import annotations

import http.client
import json
import os
import pathlib
import random
import socket
import string
import subprocess
import time
import zlib
from collections.abc import Iterator

import pytest

from conftest import _binary
from qparams._routing import SlotMap, hashed_part, session_header, slot_of
from qparams.v1 import qparams_pb2 as pb

HAPROXY = "/usr/sbin/haproxy"
HEADER = "x-qparams-session"
# The session-name alphabet of the server, and its longest name.
ALPHABET = string.ascii_letters + string.digits + "._/-"
MAX_NAME = 128
READY_TIMEOUT = 10  # seconds for HAProxy to listen
TIMEOUT = 60  # seconds, for a request or a run of qparams-cli

CONFIG = """\
global
    nbthread 1

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s

frontend slots
    bind unix@{socket}
    http-request return status 200 content-type text/plain \
lf-string "%[req.hdr({header}),crc32,mod(256)]"
"""


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a UNIX socket; counts its connections."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=TIMEOUT)
        self.path = path
        self.connects = 0

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.path)
        self.sock = sock
        self.connects += 1


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def haproxy(tmp_path: pathlib.Path) -> Iterator[str]:
    """HAProxy in the foreground, answering on a UNIX socket; yields the socket's path."""
    if not os.access(HAPROXY, os.X_OK):
        pytest.fail(f"{HAPROXY} is missing: scripts/install-deps.sh installs it "
                    "(Debian package haproxy)")
    path = tmp_path / "h.sock"
    # sun_path holds 108 bytes, its terminating NUL included.
    assert len(os.fsencode(path)) < 108, f"{path} is too long for a UNIX socket; set TMPDIR"
    config = tmp_path / "haproxy.cfg"
    config.write_text(CONFIG.format(socket=path, header=HEADER))
    log = tmp_path / "haproxy.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([HAPROXY, "-f", str(config), "-db"], stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if process.poll() is not None:
                pytest.fail(f"haproxy exited with {process.returncode}:\n{log.read_text()}")
            if path.exists():
                try:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                        probe.connect(str(path))
                    break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                pytest.fail(f"haproxy did not listen on {path} within {READY_TIMEOUT} s:\n"
                            f"{log.read_text()}")
            time.sleep(0.05)
        yield str(path)
    finally:
        _stop(process)


def session_names() -> list[str]:
    """Edge cases, then random names of the alphabet, 1 to 128 characters."""
    names = ["a", "Z", "0", "123456789", "-", "--", "--help", "-a", ".", "..", "/", "_",
             "model/layer1.weight", "a/b/c/d", "x.y.z", "a-b-c", "a_b_c", "/leading", "trailing/",
             "a" * MAX_NAME, "/" * MAX_NAME, "-" * MAX_NAME, ALPHABET, ALPHABET[::-1]]
    rng = random.Random(16)
    while len(names) < 2000:
        length = rng.randint(1, MAX_NAME)
        names.append("".join(rng.choice(ALPHABET) for _ in range(length)))
    assert all(1 <= len(n) <= MAX_NAME and set(n) <= set(ALPHABET) for n in names)
    return names


def haproxy_slots(path: str, names: list[str]) -> list[int]:
    """HAProxy's slot of each name, over one keep-alive connection."""
    connection = UnixHTTPConnection(path)
    slots = []
    try:
        for name in names:
            connection.request("GET", "/", headers={HEADER: name})
            response = connection.getresponse()
            body = response.read().decode()
            assert response.status == 200, (name, response.status, body)
            slots.append(int(body))
    finally:
        connection.close()
    assert connection.connects == 1, "HAProxy did not keep the connection alive"
    return slots


def cli_slots(names: list[str]) -> list[int]:
    """`qparams-cli slot` of each name: one run, or more if the names would not fit on
    one command line. "--" first, as names may start with '-'."""
    cli = _binary("QPARAMS_CLI", "build/tools/qparams-cli")
    environment = sum(len(os.fsencode(k)) + len(os.fsencode(v)) + 2 for k, v in os.environ.items())
    budget = os.sysconf("SC_ARG_MAX") // 2 - environment  # room for argv's pointers
    chunks: list[list[str]] = [[]]
    used = 0
    for name in names:
        size = len(name.encode()) + 1 + 8
        if chunks[-1] and used + size > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(name)
        used += size
    slots = []
    for chunk in chunks:
        # No server at --target: slot calls none.
        run = subprocess.run([cli, "--target=unix:/nonexistent/qparams.sock", "slot", "--", *chunk],
                             capture_output=True, text=True, timeout=TIMEOUT, check=False)
        assert run.returncode == 0, run.stderr
        answer = json.loads(run.stdout)["slots"]
        assert [s["name"] for s in answer] == chunk
        slots += [s["slot"] for s in answer]
    return slots


def test_haproxy_crc32_is_zlib_crc32_and_qparams_slot(haproxy: str) -> None:
    names = session_names()
    by_haproxy = haproxy_slots(haproxy, names)
    by_cli = cli_slots(names)
    by_zlib = [zlib.crc32(name.encode()) % 256 for name in names]
    assert len(by_haproxy) == len(by_cli) == len(by_zlib) == len(names)
    differing = [(name, h, c, z) for name, h, c, z in zip(names, by_haproxy, by_cli, by_zlib)
                 if not h == c == z]
    shown = "\n".join(f"  {name!r}: haproxy {h}, qparams-cli {c}, zlib {z}"
                      for name, h, c, z in differing[:10])
    assert not differing, f"{len(differing)} of {len(names)} names differ; the first:\n{shown}"
    # The names spread over the slots (a constant answer would agree with nothing, but
    # this says so plainly).
    assert len(set(by_haproxy)) > 200


SLOTS_TSV = pathlib.Path(__file__).resolve().parents[1] / "data" / "slots.tsv"


def slot_table() -> list[tuple[str, str, int]]:
    """tests/data/slots.tsv: (name, hashed part, slot) rows, as tests/core/slot_test.cc
    checks them against qparams::HashedPart and qparams::SlotOf."""
    rows = []
    for line in SLOTS_TSV.read_text().splitlines():
        if line and not line.startswith("#"):
            name, part, slot = line.split("\t")
            rows.append((name, part, int(slot)))
    assert len(rows) >= 20
    return rows


def test_hash_tags_agree_between_python_cli_and_haproxy(haproxy: str) -> None:
    """A hash tag: the Python client hashes and sends the tag (or the whole name),
    HAProxy hashes that header, and `qparams-cli slot` hashes the full name; all three
    give the table's slot."""
    rows = slot_table()
    names = [name for name, _, _ in rows]
    assert [hashed_part(n) for n in names] == [part for _, part, _ in rows]
    assert [slot_of(n) for n in names] == [slot for _, _, slot in rows]
    assert [dict(session_header(n))[HEADER] for n in names] == [part for _, part, _ in rows]
    by_haproxy = haproxy_slots(haproxy, [dict(session_header(n))[HEADER] for n in names])
    assert by_haproxy == [slot for _, _, slot in rows]
    assert cli_slots(names) == [slot for _, _, slot in rows]
    topology = pb.Topology(slot_count=256, replicas=["a", "b"],
                           ranges=[pb.SlotRange(low=0, high=127, replica="a"),
                                   pb.SlotRange(low=128, high=255, replica="b")])
    owners = SlotMap(topology)
    assert all(owners.owner(n) == ("a" if s < 128 else "b") for n, _, s in rows)
