"""A local qparams-server for tests and benchmarks: the binary started as a child
process on a loopback port the OS picks, stopped by its PID.

    from qparams.testing import LocalServer

    with LocalServer("build/server/qparams-server") as server:
        with qparams.Client(server.target) as client:
            ...
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from typing import Any

__all__ = ["LocalServer"]

_LISTENING = re.compile(r"listening on (\S+)")


class LocalServer:
    """A qparams-server child process listening on 127.0.0.1, port 0 (the port the
    server logs, in `target`). Its log (stderr) is read continuously, so that the
    server never blocks on it, and kept in `log`.

    Args:
        binary: the qparams-server executable.
        *flags: more flags (e.g. "--max_sessions=1"); --listen is this class's.
        timeout: how long to wait for the server to listen, in seconds.

    Raises:
        FileNotFoundError: binary is not an executable.
        RuntimeError: the server exited, or did not listen within `timeout` (the
            message holds its log).
    """

    def __init__(self, binary: str, *flags: str, timeout: float = 30.0) -> None:
        if not os.access(binary, os.X_OK):
            raise FileNotFoundError(f"{binary} is not an executable qparams-server")
        self.argv = [binary, "--listen=127.0.0.1:0", *flags]
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            for line in self.process.stderr:
                self.log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, name="qparams-server-log", daemon=True).start()
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
                self.target: str = m.group(1)
                return

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, grace: float = 20.0) -> int:
        """Stops the server: SIGTERM, then SIGKILL if it has not exited after `grace`
        seconds (it drains open calls for its own --shutdown_grace first). Returns its
        exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> "LocalServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
