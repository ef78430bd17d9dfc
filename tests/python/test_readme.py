"""The README's Python section runs as printed: its ```python blocks in order, in one
interpreter, against a server found through $QPARAMS_TARGET (as `make run`'s would be),
each printing exactly the ```text block that follows it, where there is one."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

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


def python_section_blocks() -> list[tuple[str, str | None]]:
    """(code, expected output or None) for each python block of the README's Python
    section."""
    readme = (REPO / "README.md").read_text()
    section = re.search(r"^## Python\n(.*?)(?=^## )", readme, re.S | re.M).group(1)
    fences = re.findall(r"^```(\w*)\n(.*?)^```", section, re.S | re.M)
    blocks = []
    for i, (lang, body) in enumerate(fences):
        if lang == "python":
            following = fences[i + 1] if i + 1 < len(fences) else None
            blocks.append((body, following[1] if following and following[0] == "text" else None))
    return blocks


def test_python_snippets_run_as_printed(server) -> None:
    blocks = python_section_blocks()
    assert len(blocks) >= 4
    env = {**os.environ, "QPARAMS_TARGET": server.target}
    run = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps([b for b, _ in blocks]),
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr
    outputs = json.loads(run.stdout.splitlines()[-1])
    for (code, expected), output in zip(blocks, outputs):
        if expected is not None:
            assert output == expected, f"the block\n{code}\nprinted\n{output}"
