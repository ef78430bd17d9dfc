"""The conformance vectors ($QPARAMS_VECTORS, default tests/data/vectors.jsonl) through
the Python client, bit for bit: single-forward cases through compute, and every case
through sessions five ways: observe with whole tensors, observe with block ranges
(reduce="always"), the default reduce="auto", observe_many (the forwards of a case
pipelined over one stream) and observe_batch (the same runs of forwards, each run in
one ObserveBatch call). Prints `conformance: N of M cases match` per way and
overall (a case matches when it matches every way)."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

import qparams
from conftest import vectors_path
from helpers import f32_bits

ERRORS = {"invalid_argument": qparams.InvalidArgument,
          "failed_precondition": qparams.FailedPrecondition}
MODES = ("never", "always", "auto", "observe_many", "observe_batch")
MANY = {"observe_many": qparams.Client.observe_many, "observe_batch": qparams.Client.observe_batch}


def load_cases() -> list[dict]:
    with open(vectors_path()) as f:
        return [json.loads(line) for line in f if line.strip()]


def tensor(spec: dict) -> Any:
    """The input of a step: a numpy array (float32/float16) or a torch bfloat16 tensor."""
    shape, data = spec["shape"], base64.b64decode(spec["data"])
    if spec["dtype"] == "bfloat16":
        raw = np.frombuffer(data, np.int16).copy().reshape(shape)
        return torch.from_numpy(raw).view(torch.bfloat16)
    return np.frombuffer(data, {"float32": np.float32, "float16": np.float16}[spec["dtype"]]
                         ).reshape(shape)


def differs(expect: dict, q: qparams.QParams) -> str:
    """What differs between an expected result and q; "" if nothing."""
    zp = None if q.zero_point is None else q.zero_point.ravel().tolist()
    for field, ours in (("shape", list(q.shape)), ("scale", f32_bits(q.scale)), ("zero_point", zp),
                        ("minval", f32_bits(q.minval))):
        if expect[field] != ours:
            return f"{field}: expected {expect[field]}, got {ours}"
    if "initialized" in expect and expect["initialized"] != q.initialized:
        return f"initialized: expected {expect['initialized']}, got {q.initialized}"
    return ""


def judge(step: dict, outcome: qparams.QParams | Exception | None) -> str:
    """Compares a step's outcome (qparams, an exception, or None for no result)."""
    if "expect_error" in step:
        wanted = ERRORS[step["expect_error"]]
        # A ValueError is the client refusing a malformed value before any call.
        if isinstance(outcome, wanted) or (isinstance(outcome, ValueError)
                                           and wanted is qparams.InvalidArgument):
            return ""
        return f"expected {wanted.__name__}, got {outcome!r}"
    if isinstance(outcome, Exception):
        return f"expected success, got {outcome}"
    if "expect" in step:
        return differs(step["expect"], outcome)
    return ""


def spec_of(case: dict) -> dict:
    spec = dict(case["spec"])
    spec["float_range"] = tuple(spec["float_range"])
    return spec


def run_compute(client: qparams.Client, case: dict) -> str:
    if "construct_error" in case:
        try:
            client.compute(np.zeros(1, np.float32), spec_of(case), calculator=case["calculator"])
            return "compute: expected InvalidArgument"
        except (qparams.InvalidArgument, ValueError):
            return ""
    step = case["steps"][0]
    try:
        outcome: Any = client.compute(tensor(step["input"]), spec_of(case),
                                      calculator=case["calculator"])
    except (qparams.QParamsError, ValueError) as e:
        outcome = e
    return judge(step, outcome)


def run_steps(client: qparams.Client, name: str, steps: list[dict], mode: str,
              calls: dict[str, Callable[[dict], Any]],
              judge: Callable[[dict, Any], str] = judge) -> str:
    """Runs a case's steps on the session `name`: in the modes of MANY, each run of
    forwards in one observe_many/observe_batch call (observe_many: default reduce),
    else each step through calls[op](step). Returns what first differs ("" if
    nothing); a failed step must leave the session as it was."""
    i = 0
    while i < len(steps):
        step = steps[i]
        if step["op"] == "forward" and mode in MANY:
            j = i
            while j < len(steps) and steps[j]["op"] == "forward":
                j += 1
            outcomes = list(MANY[mode](client, [(name, tensor(s["input"])) for s in steps[i:j]]))
            for k, outcome in enumerate(outcomes):
                if d := judge(steps[i + k], outcome):
                    return f"step {i + k}: {d}"
            i = j
            continue
        before = client.get_session(name)
        try:
            outcome = calls[step["op"]](step)
        except (qparams.QParamsError, ValueError) as e:
            outcome = e
        if d := judge(step, outcome):
            return f"step {i} ({step['op']}): {d}"
        if isinstance(outcome, Exception) and client.get_session(name) != before:
            return f"step {i} ({step['op']}): a failed step changed the session"
        i += 1
    return ""


def session_calls(client: qparams.Client, name: str,
                  reduce: str) -> dict[str, Callable[[dict], Any]]:
    """The calls of the steps every stateful vector has, by op."""
    return {
        "forward": lambda step: client.observe(name, tensor(step["input"]), reduce=reduce),
        "get_qparams": lambda step: client.get_qparams(name),
        "set_export_mode": lambda step: client.set_export_mode(name, step["enabled"]),
        "set_granularity": lambda step: client.set_granularity(name, step["granularity"]),
    }


def run_session(client: qparams.Client, case: dict, name: str, mode: str) -> str:
    try:
        client.create_session(name, spec_of(case), calculator=case["calculator"],
                              averaging_constant=case.get("averaging_constant"))
    except (qparams.InvalidArgument, ValueError):
        # Sessions refuse the stateless calculator as they refuse a bad spec.
        if "construct_error" in case or case["calculator"] == "dynamic":
            return ""
        raise
    if "construct_error" in case or case["calculator"] == "dynamic":
        return "create_session: expected InvalidArgument"
    d = run_steps(client, name, case["steps"], mode, session_calls(client, name, mode),
                  lambda step, outcome: judge(step, outcome.qparams if isinstance(
                      outcome, qparams.ObserveResult) else outcome))
    if not d:
        client.delete_session(name)
    return d


def run_ways(client: qparams.Client, cases: list[dict], modes: Sequence[str],
             run_case: Callable[[qparams.Client, dict, str, str], str], what: str,
             capsys: pytest.CaptureFixture) -> dict[int, str]:
    """Runs every case each way (sessions named what/mode/index), printing
    `{what}conformance via <way>: N of M cases match` per way; returns the first
    difference of each case that failed some way, by case index."""
    failed: dict[int, str] = {}
    for mode in modes:
        mode_failures = 0
        for i, c in enumerate(cases):
            try:
                d = run_case(client, c, f"{what.strip() or 'vectors'}-conformance/{mode}/{i}", mode)
            except Exception as e:  # counted, so that one odd case does not hide the rest
                d = f"raised {e!r}"
            if d:
                mode_failures += 1
                failed.setdefault(i, f"{c['id']} ({mode}): {d}")
        way = mode if mode in MANY else f"observe, reduce={mode}"
        report(capsys, f"{what}conformance via {way}", len(cases) - mode_failures, len(cases))
    return failed


def run_every_way(client: qparams.Client, cases: list[dict], modes: Sequence[str],
                  run_case: Callable[[qparams.Client, dict, str, str], str], what: str,
                  capsys: pytest.CaptureFixture) -> None:
    """run_ways, then `{what}conformance: N of M cases match` overall; fails listing
    the first differences."""
    failed = run_ways(client, cases, modes, run_case, what, capsys)
    report(capsys, f"{what}conformance", len(cases) - len(failed), len(cases))
    assert not failed, "\n".join(list(failed.values())[:20])


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    cases = load_cases()
    assert cases, f"no cases in {vectors_path()}"
    return cases


def report(capsys: pytest.CaptureFixture, what: str, matched: int, total: int) -> None:
    with capsys.disabled():
        print(f"\n{what}: {matched} of {total} cases match")


def test_single_forward_cases_through_compute(client, cases, capsys) -> None:
    failures = []
    chosen = [c for c in cases if c["calculator"] in ("dynamic", "static") and (
        "construct_error" in c or (len(c["steps"]) == 1 and c["steps"][0]["op"] == "forward"))]
    for c in chosen:
        try:
            d = run_compute(client, c)
        except Exception as e:
            d = f"raised {e!r}"
        if d:
            failures.append(f"{c['id']} (compute): {d}")
    report(capsys, "conformance via compute", len(chosen) - len(failures), len(chosen))
    assert chosen and not failures, "\n".join(failures[:20])


def test_every_case_through_sessions(client, cases, capsys) -> None:
    run_every_way(client, cases, MODES, run_session, "", capsys)
