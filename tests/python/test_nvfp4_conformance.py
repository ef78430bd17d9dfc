"""The session cases of the NVFP4 vectors ($QPARAMS_NVFP4_VECTORS, default
tests/data/nvfp4.jsonl; nvfp4.md §10) through the Python client, bit for bit: the
dynamic and static cases Compute can run through compute, and every case through
sessions the ways test_conformance.py runs vectors.jsonl (observe with whole tensors,
with block ranges, the default reduce="auto", observe_many and observe_batch). Prints
`nvfp4 conformance: N of M cases match` per way and overall (a case matches when it
matches every way), then how many group and qdq cases are not run here: the group
cases need scale groups (§4), the qdq cases check the §5 helpers."""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import numpy as np
import pytest

import qparams
from conftest import REPO
from helpers import f32_bits
from test_conformance import (MODES, judge, run_every_way, run_steps, session_calls, spec_of,
                              tensor)


def nvfp4_vectors() -> str:
    """$QPARAMS_NVFP4_VECTORS, else the project's copy of the NVFP4 vectors."""
    return os.environ.get("QPARAMS_NVFP4_VECTORS") or str(REPO / "tests/data/nvfp4.jsonl")


@pytest.fixture(scope="module")
def all_cases() -> list[dict]:
    with open(nvfp4_vectors()) as f:
        cases = [json.loads(line) for line in f if line.strip()]
    assert cases, f"no cases in {nvfp4_vectors()}"
    return cases


@pytest.fixture(scope="module")
def cases(all_cases) -> list[dict]:
    return [c for c in all_cases if not c.get("kind")]


def u32(value: float | None) -> int | None:
    return None if value is None else f32_bits(value)[0]


def differs(expect: dict, q: qparams.QParams) -> str:
    """What differs between an NVFP4 expectation (nvfp4.md §10) and q; "" if nothing."""
    codes = [] if q.scale_e4m3 is None else q.scale_e4m3.ravel().tolist()
    zp = None if q.zero_point is None else q.zero_point.ravel().tolist()
    for field, ours in (("shape", list(q.shape)), ("scale", f32_bits(q.scale)),
                        ("scale_e4m3", codes), ("global_scale", u32(q.global_scale)),
                        ("amax", u32(q.amax)), ("zero_point", zp),
                        ("minval", f32_bits(q.minval))):
        if expect.get(field) != ours:
            return f"{field}: expected {expect.get(field)}, got {ours}"
    if "initialized" in expect and expect["initialized"] != q.initialized:
        return f"initialized: expected {expect['initialized']}, got {q.initialized}"
    return ""


def nvfp4_judge(step: dict, outcome: Any) -> str:
    """test_conformance.judge, with the NVFP4 expectation's keys compared."""
    if isinstance(outcome, qparams.ObserveResult):
        outcome = outcome.qparams
    if "expect_error" in step or isinstance(outcome, Exception) or "expect" not in step:
        return judge(step, outcome)
    return differs(step["expect"], outcome)


def through_compute(case: dict) -> bool:
    """Whether compute runs the case: a dynamic or static case's construction error or
    single forward, or each forward of a dynamic case made of forwards only."""
    if case["calculator"] not in ("dynamic", "static"):
        return False
    if "construct_error" in case:
        return True
    ops = [s["op"] for s in case["steps"]]
    if ops == ["forward"]:
        return True
    return case["calculator"] == "dynamic" and bool(ops) and set(ops) == {"forward"}


def run_compute(client: qparams.Client, case: dict) -> str:
    if "construct_error" in case:
        try:
            client.compute(np.zeros((1, 16), np.float32), spec_of(case),
                           calculator=case["calculator"])
            return "compute: expected InvalidArgument"
        except (qparams.InvalidArgument, ValueError):
            return ""
    for i, step in enumerate(case["steps"]):
        try:
            outcome: Any = client.compute(tensor(step["input"]), spec_of(case),
                                          calculator=case["calculator"])
        except (qparams.QParamsError, ValueError) as e:
            outcome = e
        if d := nvfp4_judge(step, outcome):
            return f"compute, step {i}: {d}"
    return ""


def run_session(client: qparams.Client, case: dict, name: str, mode: str) -> str:
    refused = "construct_error" in case or case["calculator"] == "dynamic"
    try:
        client.create_session(name, spec_of(case), calculator=case["calculator"],
                              averaging_constant=case.get("averaging_constant"))
    except (qparams.InvalidArgument, ValueError):
        # Sessions refuse the stateless calculator as they refuse a bad spec.
        return "" if refused else "create_session: refused"
    if refused:
        return "create_session: expected InvalidArgument"
    d = run_steps(client, name, case["steps"], mode, session_calls(client, name, mode),
                  nvfp4_judge)
    if not d:
        client.delete_session(name)
    return d


def run_case(client: qparams.Client, case: dict, name: str, mode: str) -> str:
    """A case run `mode` through sessions, and (with the first mode) through compute."""
    if mode == MODES[0] and through_compute(case):
        if d := run_compute(client, case):
            return d
    return run_session(client, case, name, mode)


def test_every_session_case_every_way(client, all_cases, cases, capsys) -> None:
    not_run = collections.Counter(c["kind"] for c in all_cases if c.get("kind"))
    try:
        run_every_way(client, cases, MODES, run_case, "nvfp4 ", capsys)
    finally:
        if not_run:
            counts = " and ".join(f"{n} {kind}" for kind, n in sorted(not_run.items()))
            with capsys.disabled():
                print(f"nvfp4 conformance: {counts} cases not run through the Python client "
                      f"({nvfp4_vectors()})")
