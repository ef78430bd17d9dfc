"""The online move of a slot range between replicas (docs/sharding.md, "Moving slots
online"), end to end: two replicas r0 and r1 with their own data directories, moved
with `qparams-cli reshard`, straight to each replica (--replica_addresses).

The switch pushes the new map (epoch + 1) to the target, then the source (SetSlotMap);
with --stop_before_switch the command stops after the copy (awaiting_switch) and the
test switches by restarting a replica on the new map file. Checked: a client observing
the moving sessions through the move (retrying UNAVAILABLE, following the new owner)
loses no acknowledged observation and applies none twice (the sessions end bit for bit
as one server's replay of the acknowledged observations); a move resumed after SIGKILL
of the source and of the target; a move rolled back with --abort, and refused once the
target owns the slots.

Every process is started here and stopped by its PID.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import qparams
from conftest import REPO, start_local_server
from helpers import ADMIN_TOKEN, admin_tokens_file, slot
from qparams.testing import LocalServer

MAP = "0:127 r0\n128:255 r1\n"
MOVED = "# epoch 1\n0:63 r1\n64:127 r0\n128:255 r1\n"
LOW, HIGH = 0, 63
TIMEOUT = 30  # seconds: the deadline of every wait below


def names_in_range(count: int) -> list[str]:
    out, i = [], 0
    while len(out) < count:
        name = f"move/s{i}"
        if LOW <= slot(name) <= HIGH:
            out.append(name)
        i += 1
    return out


def tensor(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(32).astype(np.float32)


def cli(*args: str) -> subprocess.CompletedProcess:
    binary = os.environ.get("QPARAMS_CLI") or str(REPO / "build/tools/qparams-cli")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120)


class Pair:
    """Replicas r0 and r1 on data directories of their own, restartable on a map; they
    take admin calls with ADMIN_TOKEN, which every reshard below carries."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.directory = directory
        (directory / "old.map").write_text(MAP)
        (directory / "new.map").write_text(MOVED)
        self.admin_tokens_file = admin_tokens_file(directory)
        self.servers: dict[str, LocalServer] = {}
        self.stopped: list[LocalServer] = []

    def start(self, replica: str, map_name: str = "old.map") -> LocalServer:
        data = self.directory / f"data-{replica}"
        data.mkdir(exist_ok=True)
        server = start_local_server(f"--replica_id={replica}",
                                    f"--slot_map={self.directory / map_name}",
                                    f"--data_dir={data}", "--durability=always",
                                    f"--admin_tokens_file={self.admin_tokens_file}")
        self.servers[replica] = server
        return server

    def stop(self, replica: str, sig: int = signal.SIGTERM) -> None:
        server = self.servers.pop(replica)
        self.stopped.append(server)
        server.process.send_signal(sig)
        server.process.wait(timeout=TIMEOUT)

    def restart(self, replica: str, map_name: str, sig: int = signal.SIGTERM) -> LocalServer:
        self.stop(replica, sig)
        return self.start(replica, map_name)

    def addresses(self) -> str:
        return ",".join(f"{r}={s.target}" for r, s in self.servers.items())

    def run_reshard(self, *flags: str) -> subprocess.CompletedProcess:
        """qparams-cli reshard LOW:HIGH r0 r1 `flags`, straight to each replica."""
        return cli(f"--target={self.servers['r0'].target}", f"--token={ADMIN_TOKEN}", "reshard",
                   f"{LOW}:{HIGH}", "r0", "r1", f"--replica_addresses={self.addresses()}", *flags)

    def reshard(self, *flags: str) -> dict:
        run = self.run_reshard(*flags)
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)

    def close(self) -> None:
        for server in list(self.servers.values()) + self.stopped:
            server.stop()


@pytest.fixture
def pair(tmp_path: pathlib.Path) -> Iterator[Pair]:
    p = Pair(tmp_path)
    try:
        p.start("r0")
        p.start("r1")
        yield p
    finally:
        p.close()


def create(target: str, names: list[str]) -> None:
    with qparams.Client(target) as c:
        for name in names:
            c.create_session(name, calculator="global_minmax", target="activation", dtype="int8",
                             qscheme="asymmetric")


def state(target: str, names: list[str]) -> dict[str, tuple]:
    """Each session's observation count and qparams bytes, asked straight."""
    out = {}
    with qparams.Client(target) as c:
        for name in names:
            s = c.get_session(name)
            q = c.get_qparams(name)
            out[name] = (s.observation_count, list(s.running_min), list(s.running_max),
                         q.scale.tobytes(), q.zero_point.tobytes())
    return out


class Observer:
    """Observes the sessions round-robin, one call at a time, until stopped: an
    UNAVAILABLE (a frozen slot, a replica restarting) or a CANCELLED (a replica
    shutting down as the call arrives; had it been applied, the replay below would
    differ) is retried with backoff, and a refusal naming another owner is followed. Every acknowledged observation is kept,
    in order, by session."""

    def __init__(self, pair: Pair, names: list[str]) -> None:
        self.pair, self.names = pair, names
        self.acknowledged: dict[str, list[int]] = {n: [] for n in names}
        self.refusals = 0
        self.redirects = 0
        self.count = 0
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        owner, seed = "r0", 0
        try:
            while not self.stopping.is_set():
                name = self.names[seed % len(self.names)]
                while True:
                    server = self.pair.servers.get(owner)
                    if server is None:  # restarting
                        time.sleep(0.01)
                        continue
                    try:
                        with qparams.Client(server.target, timeout=5) as c:
                            c.observe(name, tensor(seed))
                        break
                    except (qparams.Unavailable, qparams.Cancelled):
                        self.refusals += 1
                        time.sleep(0.01)  # backoff before the retry
                    except qparams.FailedPrecondition as e:
                        assert e.owner in ("r0", "r1"), e
                        owner = e.owner
                        self.redirects += 1
                self.acknowledged[name].append(seed)
                self.count += 1
                seed += 1
        except BaseException as e:  # reported by stop()
            self.error = e

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        while self.count < count:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"only {self.count} observations"
            time.sleep(0.01)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(TIMEOUT)
        if self.error is not None:
            raise self.error


def replayed(names: list[str], acknowledged: dict[str, list[int]]) -> dict[str, tuple]:
    """The sessions one server ends with when it applies the acknowledged
    observations, in order."""
    with start_local_server() as one:
        create(one.target, names)
        with qparams.Client(one.target) as c:
            for name in names:
                for seed in acknowledged[name]:
                    c.observe(name, tensor(seed))
        return state(one.target, names)


def test_move_while_observing_loses_and_repeats_nothing(pair: Pair) -> None:
    names = names_in_range(12)
    outside = "move/outside"
    assert slot(outside) > HIGH and slot(outside) < 128
    create(pair.servers["r0"].target, names + [outside])
    observer = Observer(pair, names)
    observer.wait_for(50)

    done = pair.reshard()
    assert done["outcome"] == "done"
    assert done["sessions_copied"] == len(names)
    assert done["sessions_dropped"] == len(names)
    assert done["next_map"].splitlines() == ["# epoch 1", "# slots   replica", "0:63 r1",
                                             "64:127 r0", "128:255 r1"]
    observer.wait_for(observer.count + 50)
    observer.stop()
    assert observer.redirects == 1  # followed r1 once, never back

    assert state(pair.servers["r1"].target, names) == replayed(names, observer.acknowledged)
    with qparams.Client(pair.servers["r0"].target) as c:
        c.observe(outside, tensor(1))  # the rest of r0's slots never stopped
        with pytest.raises(qparams.FailedPrecondition) as refused:
            c.get_session(names[0])
        assert refused.value.owner == "r1"
    # r0 kept no copy, and the new map: restarted on the old map file, it restores
    # only the session outside the range and still names r1 the owner.
    pair.restart("r0", "old.map")
    assert any("restored 1 session(s)" in line for line in pair.servers["r0"].log)
    with qparams.Client(pair.servers["r0"].target) as c:
        with pytest.raises(qparams.FailedPrecondition):
            c.get_session(names[0])


def test_move_resumes_after_sigkill_of_source_and_target(pair: Pair) -> None:
    names = names_in_range(20)
    create(pair.servers["r0"].target, names)
    with qparams.Client(pair.servers["r0"].target) as c:
        for i, name in enumerate(names):
            c.observe(name, tensor(i))
    before = state(pair.servers["r0"].target, names)

    assert pair.reshard("--stop_before_switch")["outcome"] == "awaiting_switch"
    # The source dies: restarted, its slots are still frozen, and the copy runs again.
    pair.restart("r0", "old.map", signal.SIGKILL)
    # retry_total=0: the refusal itself, not 30 s of the client's retries of it.
    with qparams.Client(pair.servers["r0"].target, retry_total=0) as c:
        with pytest.raises(qparams.Unavailable, match="is moving to r1; retry"):
            c.observe(names[0], tensor(99))
    again = pair.reshard("--resume", "--stop_before_switch")
    assert again["outcome"] == "awaiting_switch"
    assert again["sessions_copied"] == len(names)
    # The target dies too, and comes back with what it imported; the move finishes.
    pair.restart("r1", "old.map", signal.SIGKILL)
    assert pair.reshard("--resume")["outcome"] == "done"
    assert state(pair.servers["r1"].target, names) == before
    # Resuming a finished move changes nothing.
    assert pair.reshard("--resume")["sessions_dropped"] == 0


def test_abort_rolls_back_before_the_switch(pair: Pair) -> None:
    names = names_in_range(5)
    create(pair.servers["r0"].target, names)
    assert pair.reshard("--stop_before_switch")["outcome"] == "awaiting_switch"
    run = pair.run_reshard()
    assert run.returncode == 1 and "a move is under way" in run.stderr, run.stderr
    pair.restart("r1", "old.map", signal.SIGKILL)
    aborted = pair.reshard("--abort")
    assert aborted["outcome"] == "aborted"
    assert aborted["sessions_dropped"] == len(names)
    with qparams.Client(pair.servers["r0"].target) as c:
        c.observe(names[0], tensor(1))  # r0 takes writes again
    pair.restart("r1", "old.map")
    assert any("restored 0 session(s)" in line for line in pair.servers["r1"].log)
    # A move past its switch (here: the target restarted on the new map file, of a
    # greater epoch) cannot be rolled back.
    assert pair.reshard("--stop_before_switch")["outcome"] == "awaiting_switch"
    pair.restart("r1", "new.map")
    run = pair.run_reshard("--abort")
    assert run.returncode == 1 and "cannot be rolled back" in run.stderr, run.stderr
