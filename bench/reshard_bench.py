"""The online move of a slot range (qparams-cli reshard), measured: two replicas r0
and r1 on data directories (--durability=batched, the default, or --durability), SESSIONS sessions
(global_minmax, per-tensor, one observation each) in slots 0:63 of r0, moved to r1.

Reported: the move's copy time, the time its sessions were frozen (from MIGRATING to
the end of the switch: the new map pushed to r1, then r0) and the whole command; and the
observations per second that WRITERS threads sustain on the moving sessions (each
call a unary Observe of 64 floats, UNAVAILABLE retried after 10 ms, a refusal naming
the new owner followed) over a window before the move and over the whole move.

  bench/reshard_bench.py --server-binary=build/server/qparams-server \\
      --cli-binary=build/tools/qparams-cli [--sessions=10000] [--json=FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import tempfile
import threading
import time
import zlib

import numpy as np

import qparams
from qparams.testing import LocalServer

MAP = "0:127 r0\n128:255 r1\n"


def names_in_range(count: int) -> list[str]:
    """`count` session names of slots 0:63."""
    out, i = [], 0
    while len(out) < count:
        name = f"bench/s{i}"
        if zlib.crc32(name.encode()) % 256 < 64:
            out.append(name)
        i += 1
    return out


class Writers:
    """Threads observing the sessions round-robin until stopped, counting the
    acknowledged observations."""

    def __init__(self, servers: dict[str, LocalServer], names: list[str], threads: int) -> None:
        self.servers, self.names = servers, names
        self.count = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
        self.threads = [threading.Thread(target=self.run, args=(t,), daemon=True)
                        for t in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, index: int) -> None:
        owner, i = "r0", index
        clients: dict[str, qparams.Client] = {}
        while not self.stopping.is_set():
            server = self.servers.get(owner)
            if server is None:
                time.sleep(0.01)
                continue
            if server.target not in clients:
                clients[server.target] = qparams.Client(server.target, timeout=5)
            try:
                clients[server.target].observe(self.names[i % len(self.names)], self.x)
            except (qparams.Unavailable, qparams.Cancelled):
                time.sleep(0.01)
                continue
            except qparams.FailedPrecondition as e:
                owner = e.owner or owner
                continue
            with self.lock:
                self.count += 1
            i += len(self.threads)
        for c in clients.values():
            c.close()

    def rate_over(self, seconds: float) -> float:
        start, t0 = self.count, time.monotonic()
        time.sleep(seconds)
        return (self.count - start) / (time.monotonic() - t0)

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-binary", required=True)
    parser.add_argument("--cli-binary", required=True)
    parser.add_argument("--sessions", type=int, default=10000)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--window", type=float, default=3.0, help="seconds measured before")
    parser.add_argument("--durability", default="batched", help="the replicas' --durability")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="qparams-reshard-") as tmp:
        d = pathlib.Path(tmp)
        (d / "old.map").write_text(MAP)
        servers: dict[str, LocalServer] = {}
        stopped: list[LocalServer] = []

        def start(replica: str, map_name: str) -> None:
            (d / replica).mkdir(exist_ok=True)
            servers[replica] = LocalServer(args.server_binary, f"--replica_id={replica}",
                                           f"--slot_map={d / map_name}", f"--data_dir={d / replica}",
                                           f"--durability={args.durability}")

        def reshard(*flags: str) -> tuple[dict, float]:
            addresses = ",".join(f"{r}={s.target}" for r, s in servers.items())
            t0 = time.monotonic()
            run = subprocess.run([args.cli_binary, f"--target={servers['r0'].target}", "reshard",
                                  "0:63", "r0", "r1", f"--replica_addresses={addresses}",
                                  "--timeout=600s", *flags],
                                 capture_output=True, text=True, check=True)
            return json.loads(run.stdout), time.monotonic() - t0

        try:
            start("r0", "old.map")
            start("r1", "old.map")
            names = names_in_range(args.sessions)
            x = np.random.default_rng(1).standard_normal(64).astype(np.float32)
            t0 = time.monotonic()
            with qparams.Client(servers["r0"].target) as c:
                for name in names:
                    c.create_session(name, calculator="global_minmax", target="activation", dtype="int8",
                                     qscheme="asymmetric")
                    c.observe(name, x)
            fill = time.monotonic() - t0

            writers = Writers(servers, names, args.writers)
            before = writers.rate_over(args.window)
            moved_from = writers.count
            t_move = time.monotonic()
            done, command = reshard()
            move = time.monotonic() - t_move
            during = (writers.count - moved_from) / move
            after = writers.rate_over(args.window)
            writers.stop()
        finally:
            for s in list(servers.values()) + stopped:
                s.stop()

    result = {
        "sessions": args.sessions,
        "durability": args.durability,
        "writers": args.writers,
        "fill_seconds": round(fill, 3),
        "copy_seconds": round(done["copy_seconds"], 3),
        "frozen_seconds": round(done["frozen_seconds"], 3),
        "reshard_command_seconds": round(command, 3),
        "move_seconds": round(move, 3),
        "sessions_copied": done["sessions_copied"],
        "sessions_dropped": done["sessions_dropped"],
        "observe_per_s_before": round(before, 1),
        "observe_per_s_during_move": round(during, 1),
        "observe_per_s_after": round(after, 1),
    }
    text = json.dumps(result)
    print(text)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
