"""The README's Python section runs as printed, against a server found through
$QPARAMS_TARGET (as `make run`'s would be):
  * its ```python blocks, in order, in one interpreter, each printing exactly the
    ```text block that follows it, where there is one;
  * its script (```python calibrate.py), under torchrun with two ranks as the README's
    command runs it; every rank's observations land in the same sessions."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import torch
from torch.ao.quantization import MinMaxObserver

import qparams
from conftest import REPO

# Runs each block of a JSON list in one namespace; prints a JSON list of their outputs.
DRIVER = """
import contextlib, io, json, sys
outputs, namespace = [], {"__name__": "__main__"}
for block in json.load(sys.stdin):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(block, "README.md", "exec"), namespace)
    outputs.append(buffer.getvalue())
print(json.dumps(outputs))
"""


def python_section_fences() -> list[tuple[str, str]]:
    """(info string, body) of every fenced block of the README's Python section."""
    readme = (REPO / "README.md").read_text()
    section = re.search(r"^## Python\n(.*?)(?=^## )", readme, re.S | re.M).group(1)
    return re.findall(r"^```([^\n]*)\n(.*?)^```", section, re.S | re.M)


def test_python_snippets_run_as_printed(server) -> None:
    fences = python_section_fences()
    blocks = []
    for i, (info, body) in enumerate(fences):
        if info == "python":
            following = fences[i + 1] if i + 1 < len(fences) else None
            blocks.append((body, following[1] if following and following[0] == "text" else None))
    assert len(blocks) >= 5
    env = {**os.environ, "QPARAMS_TARGET": server.target}
    run = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps([b for b, _ in blocks]),
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    outputs = json.loads(run.stdout.splitlines()[-1])
    for (code, expected), output in zip(blocks, outputs):
        if expected is not None:
            assert output == expected, f"the block\n{code}\nprinted\n{output}"


def test_data_parallel_script_runs_under_torchrun(server, client, tmp_path) -> None:
    scripts = {info.split()[1]: body for info, body in python_section_fences()
               if info.startswith("python ")}
    (tmp_path / "calibrate.py").write_text(scripts["calibrate.py"])
    command = next(body for info, body in python_section_fences()
                   if info == "sh" and "torch.distributed.run" in body).split()
    assert command[0].startswith("QPARAMS_TARGET=") and command[1] == "QPARAMS_RUN=readme-dp"
    env = {**os.environ, "QPARAMS_TARGET": server.target, "QPARAMS_RUN": "readme-dp"}
    # The README's command, run by this Python (the interpreter the tests run on).
    assert command[2:5] == ["python3", "-m", "torch.distributed.run"]
    argv = [sys.executable, *command[3:]]
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "quantized.pt").is_file()

    # Both ranks' shards are in the one session of the QuantStub's input, whose qparams
    # are torch.ao's MinMaxObserver's over all the data.
    session = client.get_session("readme-dp/0.output")
    assert session.observation_count == 64
    data = torch.randn(64, 32, 16, generator=torch.Generator().manual_seed(1))
    reference = MinMaxObserver(dtype=torch.quint8)
    reference(data)
    scale, zero_point = reference.calculate_qparams()
    q = qparams.QParams.from_proto(session.qparams)
    assert q.scale.ravel().view("uint32").tolist() == \
        scale.numpy().astype("float32").view("uint32").tolist()
    assert q.zero_point.ravel().tolist() == zero_point.tolist()
    for s in client.list_sessions("readme-dp/"):
        client.delete_session(s.name)
