"""The documentation runs as printed: README.md and every page under docs/ except
docs/reference/ (the vendored specification), against the test server, found
through $QPARAMS_TARGET as `make run`'s would be.

Each page runs in document order, in a fresh temporary directory of its own:
  * its ```python blocks in one fresh interpreter per page (names carry over from one
    block to the next, as a reader typing them would have them);
  * its ```sh blocks through bash, with qparams-cli first on PATH: every command of
    such a block starts with `qparams-cli` (a redirection of its output is fine);
  * a block followed by a ```text block prints exactly that text, after one
    normalisation: ISO 8601 timestamps (`2026-11-30T14:10:06+00:00`) read as
    `<timestamp>` on both sides, since a session's creation time is the clock's;
  * a block that cannot run here (make, podman, docker, kubectl, HAProxy, curl, a
    server with other flags, torchrun, a build tree's binaries) is fenced with an info
    string holding `norun` (```sh norun) and is only counted; any other ```sh block
    fails the test, and so does a ```console, ```bash or ```shell block;
  * a ```sh sharded block is a command of the operator's runbook for a sharded
    deployment, docs/runbook.md: it is counted here, and tests/python/test_runbook.py
    runs the runbook's sharded blocks in order, as printed, against three replicas
    behind HAProxy (its commands start with `qparams-cli` too, and only the runbook
    may hold such blocks, since nothing else runs them);
  * a ```python NAME block is the script NAME, not run with the page: the data-parallel
    script of docs/python.md runs under torchrun with two ranks, as its command says.
    docs/qat.md's torchrun command runs examples/qat_torchrun.py likewise, and again
    interrupted and resumed from its checkpoint.
Sessions a page leaves behind are deleted after it."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
from torch.ao.quantization import MinMaxObserver

import qparams
from conftest import REPO

# The one page whose ```sh sharded blocks a test runs (test_runbook.py).
RUNBOOK = REPO / "docs/runbook.md"

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.S | re.M)
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)")

# Runs the blocks it reads, one JSON line each, in one namespace; answers each with a
# JSON line on the original stdout (fd 1 then goes to stderr, so that nothing else
# writes into the answers).
DRIVER = r"""
import contextlib, io, json, os, sys, traceback
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    request = json.loads(line)
    buffer, error = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(buffer):
            exec(compile(request["code"], request["where"], "exec"), namespace)
    except BaseException:
        error = traceback.format_exc()
    answers.write(json.dumps({"output": buffer.getvalue(), "error": error}) + "\n")
    answers.flush()
"""


def pages() -> list[pathlib.Path]:
    docs = sorted(p for p in (REPO / "docs").rglob("*.md")
                  if (REPO / "docs/reference") not in p.parents)
    return [REPO / "README.md", *docs]


def fences(page: pathlib.Path) -> list[tuple[str, str, int]]:
    """(info string, body, line) of every fenced block of a page."""
    text = page.read_text()
    return [(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1)
            for m in FENCE.finditer(text)]


def commands(body: str) -> list[str]:
    """A shell block's commands: continuation lines joined, comments and blanks left out."""
    joined = re.sub(r"\\\n", " ", body)
    return [line.strip() for line in joined.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def blocks(page: pathlib.Path) -> list[dict]:
    """The page's blocks that run or are counted, each with the text it must print."""
    found = fences(page)
    out = []
    for i, (info, body, line) in enumerate(found):
        words = info.split()
        if not words or words[0] not in ("python", "sh"):
            continue
        following = found[i + 1] if i + 1 < len(found) else None
        expected = following[1] if following and following[0] == "text" else None
        if "norun" in words:
            kind = "norun"
        elif words == ["sh", "sharded"]:
            kind = "sharded"
        elif words[0] == "python":
            kind = "python" if len(words) == 1 else "script"
        else:
            kind = "sh"
        out.append({"kind": kind, "body": body, "line": line, "expected": expected})
    return out


def normalised(text: str) -> str:
    return TIMESTAMP.sub("<timestamp>", text)


def cli_path() -> str:
    return os.path.dirname(os.path.abspath(
        os.environ.get("QPARAMS_CLI") or REPO / "build/tools/qparams-cli"))


def relative(page: pathlib.Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", pages(), ids=relative)
def test_sh_blocks_run_or_say_norun(page) -> None:
    for info, _, line in fences(page):
        assert info.split()[:1] not in (["console"], ["bash"], ["shell"], ["shell-session"]), (
            f"{relative(page)}:{line}: a ```{info} block; commands go in ```sh blocks (their "
            "output in a ```text block after them), or ```sh norun")
    for block in blocks(page):
        if block["kind"] == "sharded":
            assert page == RUNBOOK, (
                f"{relative(page)}:{block['line']}: a ```sh sharded block outside "
                f"{relative(RUNBOOK)}, which no test runs; use ```sh norun")
        if block["kind"] in ("sh", "sharded"):
            for command in commands(block["body"]):
                assert command.startswith("qparams-cli"), (
                    f"{relative(page)}:{block['line']}: `{command}` is not a qparams-cli "
                    "command; fence the block as ```sh norun if it cannot run in a test")


@pytest.mark.parametrize("page", pages(), ids=relative)
def test_page_runs_as_printed(page, server, client, tmp_path) -> None:
    runnable = [b for b in blocks(page) if b["kind"] in ("python", "sh")]
    counts = {kind: sum(b["kind"] == kind for b in blocks(page))
              for kind in ("python", "sh", "norun", "script", "sharded")}
    compared = sum(b["expected"] is not None for b in runnable)
    print(f"{relative(page)}: {counts['python']} python, {counts['sh']} sh, "
          f"{compared} compared with their text, {counts['norun']} norun, "
          f"{counts['script']} scripts, {counts['sharded']} sharded (test_runbook.py)")
    if not runnable:
        return
    before = {s.name for s in client.list_sessions("")}
    env = {**os.environ, "QPARAMS_TARGET": server.target,
           "PATH": cli_path() + os.pathsep + os.environ.get("PATH", "")}
    env.pop("QPARAMS_TOKEN", None)
    stderr = open(tmp_path / "interpreter.stderr", "w+")
    work = tmp_path / "work"
    work.mkdir()
    interpreter = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=stderr, text=True,
                                   env=env, cwd=work)
    try:
        for block in runnable:
            where = f"{relative(page)}:{block['line']}"
            if block["kind"] == "python":
                interpreter.stdin.write(json.dumps({"code": block["body"], "where": where}) + "\n")
                interpreter.stdin.flush()
                answer = interpreter.stdout.readline()
                assert answer, f"{where}: the interpreter exited\n" + \
                    (tmp_path / "interpreter.stderr").read_text()
                answer = json.loads(answer)
                assert answer["error"] is None, f"{where}: the block raised\n{answer['error']}"
                output = answer["output"]
            else:
                run = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block["body"]],
                                     cwd=work, env=env, capture_output=True, text=True,
                                     timeout=300)
                assert run.returncode == 0, f"{where}: exit {run.returncode}\n{run.stderr}"
                output = run.stdout
            if block["expected"] is not None:
                assert normalised(output) == normalised(block["expected"]), \
                    f"{where}: the block\n{block['body']}\nprinted\n{output}"
    finally:
        interpreter.stdin.close()
        interpreter.wait(timeout=60)
        stderr.close()
        for s in client.list_sessions(""):
            if s.name not in before:
                client.delete_session(s.name)


def test_data_parallel_script_runs_under_torchrun(server, client, tmp_path) -> None:
    page = REPO / "docs/python.md"
    found = fences(page)
    scripts = {info.split()[1]: body for info, body, _ in found
               if info.startswith("python ") and "norun" not in info.split()}
    (tmp_path / "calibrate.py").write_text(scripts["calibrate.py"])
    command = next(body for info, body, _ in found
                   if info.startswith("sh") and "torch.distributed.run" in body).split()
    assert command[0].startswith("QPARAMS_TARGET=") and command[1] == "QPARAMS_RUN=dp"
    env = {**os.environ, "QPARAMS_TARGET": server.target, "QPARAMS_RUN": "dp"}
    # The page's command, run by this Python (the interpreter the tests run on).
    assert command[2:5] == ["python3", "-m", "torch.distributed.run"]
    argv = [sys.executable, *command[3:]]
    run = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "quantized.pt").is_file()

    # Both ranks' shards are in the one session of the QuantStub's input, whose qparams
    # are torch.ao's MinMaxObserver's over all the data.
    session = client.get_session("dp/0.output")
    assert session.observation_count == 64
    data = torch.randn(64, 32, 16, generator=torch.Generator().manual_seed(1))
    reference = MinMaxObserver(dtype=torch.quint8)
    reference(data)
    scale, zero_point = reference.calculate_qparams()
    q = qparams.QParams.from_proto(session.qparams)
    assert q.scale.ravel().view("uint32").tolist() == \
        scale.numpy().astype("float32").view("uint32").tolist()
    assert q.zero_point.ravel().tolist() == zero_point.tolist()
    for s in client.list_sessions("dp/"):
        client.delete_session(s.name)


def test_qat_example_runs_under_torchrun_and_resumes_bit_identically(server, client,
                                                                      tmp_path) -> None:
    """docs/qat.md's torchrun command of examples/qat_torchrun.py, as printed; then the
    same job interrupted after step 23 (its last checkpoint at step 20) and started
    again, which resumes and ends with the uninterrupted job's qparams and accuracy."""
    page = REPO / "docs/qat.md"
    command = next(body for info, body, _ in fences(page)
                   if info.startswith("sh") and "qat_torchrun.py" in body).split()
    assert command[0].startswith("QPARAMS_TARGET=")
    assert command[1:4] == ["python3", "-m", "torch.distributed.run"]
    script = command.index("examples/qat_torchrun.py")
    argv = [sys.executable, *command[2:script], str(REPO / "examples/qat_torchrun.py"),
            *command[script + 1:]]
    env = {**os.environ, "QPARAMS_TARGET": server.target}

    def launch(*extra: str) -> list[str]:
        run = subprocess.run(argv + list(extra), cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        return [line.split(":", 1)[1] for line in run.stdout.splitlines()
                if line.startswith("[default0]:")]

    whole = launch()
    final = whole[-1]
    assert re.fullmatch(r"int8 accuracy (0\.\d{3}), qparams [0-9a-f]{16}", final), whole
    assert float(final.split()[2].rstrip(",")) > 0.9
    interrupted = ["--prefix=job43/", "--checkpoint=interrupted.pt"]
    assert launch(*interrupted, "--stop-after=23")[-1] == "stopped after step 23"
    resumed = launch(*interrupted)
    assert resumed[0] == "resumed at step 20" and resumed[-1] == final
    for prefix in ("job42/", "job43/"):
        for s in client.list_sessions(prefix):
            client.delete_session(s.name)
