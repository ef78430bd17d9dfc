"""Fixtures of the Python tests: the real qparams-server binary on a loopback port the
OS picks, started and stopped by its PID.

ctest runs these with PYTHONPATH=<build>/python (the package built from
client/python) and --qparams-server / --qparams-cli naming the binaries (else
$QPARAMS_SERVER / $QPARAMS_CLI, else the default build tree's).
"""

from __future__ import annotations

import os
import pathlib
import queue
import re
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

import qparams

REPO = pathlib.Path(__file__).resolve().parents[2]
_LISTENING = re.compile(r"listening on (\S+)")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--qparams-server", help="the qparams-server binary to test against")
    parser.addoption("--qparams-cli", help="the qparams-cli binary")


def pytest_configure(config: pytest.Config) -> None:
    # Through the environment, so that the processes tests start see them too.
    for option, variable in (("qparams_server", "QPARAMS_SERVER"), ("qparams_cli", "QPARAMS_CLI")):
        if config.getoption(option):
            os.environ[variable] = config.getoption(option)


def vectors_path() -> pathlib.Path:
    """$QPARAMS_VECTORS, else the project's copy of the conformance vectors."""
    return pathlib.Path(os.environ.get("QPARAMS_VECTORS") or REPO / "tests/data/vectors.jsonl")


def _binary(variable: str, default: str) -> str:
    path = os.environ.get(variable) or str(REPO / default)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not an executable; build first or set ${variable}")
    return path


class ServerProcess:
    """A qparams-server child process; `target` is the host:port it reported."""

    def __init__(self, *flags: str, timeout: float = 30.0) -> None:
        self.argv = [_binary("QPARAMS_SERVER", "build/server/qparams-server"),
                     "--listen=127.0.0.1:0", *flags]
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:  # keeps reading, so that the server never blocks on its log
            for line in self.process.stderr:
                self.log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.stop()
                raise RuntimeError(f"qparams-server did not start: {''.join(self.log)}")
            if m := _LISTENING.search(line):
                self.target = m.group(1)
                return

    def stop(self) -> int:
        """Stops the server (SIGTERM, then SIGKILL after 20 s); its exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """One plain server shared by the tests of a run (each uses its own session names)."""
    s = ServerProcess()
    yield s
    s.stop()


@pytest.fixture
def start_server() -> Iterator:
    """Starts servers with extra flags for one test, stopping them after it."""
    started: list[ServerProcess] = []

    def start(*flags: str) -> ServerProcess:
        s = ServerProcess(*flags)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[qparams.Client]:
    with qparams.Client(server.target) as c:
        yield c


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A session name unique to the test (the shared server outlives it)."""
    return "t/" + re.sub(r"[^a-zA-Z0-9._-]", "_", request.node.name)[:100]
