"""Fixtures of the Python tests: the real qparams-server binary on a loopback port the
OS picks, started and stopped by its PID.

ctest runs these with PYTHONPATH=<build>/python (the package built from
python/) and --qparams-server / --qparams-cli naming the binaries (else
$QPARAMS_SERVER / $QPARAMS_CLI, else the default build tree's).
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterator

import pytest

import qparams
from qparams.testing import LocalServer

REPO = pathlib.Path(__file__).resolve().parents[2]


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


def start_local_server(*flags: str) -> LocalServer:
    """The qparams-server under test, started with `flags`."""
    return LocalServer(_binary("QPARAMS_SERVER", "build/server/qparams-server"), *flags)


@pytest.fixture(scope="session")
def server() -> Iterator[LocalServer]:
    """One plain server shared by the tests of a run (each uses its own session names)."""
    s = start_local_server()
    yield s
    s.stop()


@pytest.fixture
def start_server() -> Iterator:
    """Starts servers with extra flags for one test, stopping them after it."""
    started: list[LocalServer] = []

    def start(*flags: str) -> LocalServer:
        s = start_local_server(*flags)
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def client(server: LocalServer) -> Iterator[qparams.Client]:
    with qparams.Client(server.target) as c:
        yield c


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A session name unique to the test (the shared server outlives it)."""
    return "t/" + re.sub(r"[^a-zA-Z0-9._-]", "_", request.node.name)[:100]
