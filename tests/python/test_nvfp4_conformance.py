"""The NVFP4 vectors ($QPARAMS_NVFP4_VECTORS, default tests/data/nvfp4.jsonl;
nvfp4.md §10) through the Python package, bit for bit, each kind of case by its
runner (RUNNERS):

- session cases (no kind): the dynamic and static cases Compute can run through
  compute, and every case through sessions the ways test_conformance.py runs
  vectors.jsonl (observe with whole tensors, with block ranges, the default
  reduce="auto", observe_many and observe_batch);
- group cases: their sessions, forwards and scale groups (§4) through the client's
  session and scale-group calls, each case twice (observe with whole tensors, then
  with block ranges), as tests/server/service_conformance_test.cc runs them;
- qdq cases: through qparams.nvfp4's quantize and dequantize (§5), on the host.

Prints `nvfp4 conformance via <way>: N of M cases match` per way, then
`nvfp4 conformance: N of M cases match` over every case run (a case matches when it
matches every way), then how many cases of kinds without a runner are not run, if
any."""

from __future__ import annotations

import base64
import collections
import json
import os
from typing import Any, Callable

import numpy as np
import pytest

import torch

import qparams
from conftest import REPO
from helpers import f32_bits
from qparams import nvfp4
from test_conformance import (MODES, judge, report, run_steps, run_ways, session_calls,
                              spec_of, tensor)
from test_conformance import differs as plain_differs


def nvfp4_vectors() -> str:
    """$QPARAMS_NVFP4_VECTORS, else the project's copy of the NVFP4 vectors."""
    return os.environ.get("QPARAMS_NVFP4_VECTORS") or str(REPO / "tests/data/nvfp4.jsonl")


@pytest.fixture(scope="module")
def all_cases() -> list[dict]:
    with open(nvfp4_vectors()) as f:
        cases = [json.loads(line) for line in f if line.strip()]
    assert cases, f"no cases in {nvfp4_vectors()}"
    return cases


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


def run_qdq(case: dict) -> str:
    """What differs between a qdq case (§10) and qparams.nvfp4's quantize, then
    dequantize of its packed result; "" if nothing."""
    x = tensor(case["input"])
    x = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x))
    gs = np.array([case["global_scale"]], np.uint32).view(np.float32)[0].item()
    static = None
    if case["mode"] == "static":
        static = torch.tensor(case["scale_e4m3"], dtype=torch.uint8)
    try:
        packed, codes = nvfp4.quantize(x, gs, case["convention"], static)
        dequant = nvfp4.dequantize(packed, codes, gs, case["convention"])
    except nvfp4.NVFP4Error as e:
        if case.get("expect_error") == "invalid_argument":
            return ""
        return f"raised {e!r}"
    if "expect_error" in case:
        return f"expected {case['expect_error']}, got a result"
    expect = case["expect"]
    if "scale_e4m3" in expect and expect["scale_e4m3"] != codes.ravel().tolist():
        return f"scale_e4m3: expected {expect['scale_e4m3']}, got {codes.ravel().tolist()}"
    if base64.b64decode(expect["packed"]) != packed.numpy().tobytes():
        return f"packed: expected {expect['packed']}, got {base64.b64encode(packed.numpy())}"
    if base64.b64decode(expect["dequant"]) != dequant.numpy().tobytes():
        return "dequant: the float32 bit patterns differ"
    return ""


def run_session_cases(client: qparams.Client, cases: list[dict],
                      capsys: pytest.CaptureFixture) -> dict[str, str]:
    """The session cases every way; the first difference of each failed case, by id."""
    failed = run_ways(client, cases, MODES, run_case, "nvfp4 ", capsys)
    return {cases[i]["id"]: d for i, d in failed.items()}


def run_qdq_cases(client: qparams.Client, cases: list[dict],
                  capsys: pytest.CaptureFixture) -> dict[str, str]:
    """The qdq cases through qparams.nvfp4; the difference of each failed case, by id."""
    failed = {}
    for c in cases:
        try:
            d = run_qdq(c)
        except Exception as e:  # counted, so that one odd case does not hide the rest
            d = f"raised {e!r}"
        if d:
            failed[c["id"]] = f"{c['id']} (qparams.nvfp4): {d}"
    report(capsys, "nvfp4 conformance via qparams.nvfp4 quantize/dequantize",
           len(cases) - len(failed), len(cases))
    return failed


# The status code each expect_error of a group case names (nvfp4.md §10).
GROUP_ERRORS = {"invalid_argument": qparams.InvalidArgument,
                "failed_precondition": qparams.FailedPrecondition,
                "already_exists": qparams.AlreadyExists, "not_found": qparams.NotFound}
# The ways group cases observe: whole tensors, then block ranges.
GROUP_MODES = ("never", "always")


def group_result_differs(expect: dict, r: qparams.GroupQParams, unprefixed: Callable[[str], str]
                         ) -> str:
    """What differs between a get_group_qparams expectation (§10) and r; "" if
    nothing (the checks of GroupResultDifference in tests/support/conformance_vectors.cc)."""
    if expect["initialized"] != r.initialized:
        return f"initialized: expected {expect['initialized']}, got {r.initialized}"
    uncalibrated = [unprefixed(n) for n in r.uncalibrated]
    if expect.get("uncalibrated", []) != uncalibrated:
        return f"uncalibrated: expected {expect.get('uncalibrated', [])}, got {uncalibrated}"
    if not r.initialized:
        return ""
    if "members" in expect:
        for field in ("amax", "global_scale"):
            if expect[field] != u32(getattr(r, field)):
                return f"{field}: expected {expect[field]}, got {u32(getattr(r, field))}"
        if len(expect["members"]) != len(r.members):
            return f"members: expected {len(expect['members'])}, got {len(r.members)}"
        for i, (want, got) in enumerate(zip(expect["members"], r.members)):
            if want["name"] != unprefixed(got.name):
                return f"members[{i}].name: expected {want['name']}, got {unprefixed(got.name)}"
            # Every member carries the group's global scale.
            if d := differs(dict(want, global_scale=u32(r.global_scale)), got.qparams):
                return f"members[{i}] ({want['name']}): {d}"
            if u32(got.amax) != u32(got.qparams.amax):
                return f"members[{i}].amax differs from its qparams' amax"
        return ""
    for field in ("min", "max"):
        if expect[field] != u32(getattr(r, field)):
            return f"{field}: expected {expect[field]}, got {u32(getattr(r, field))}"
    if r.qparams is None:
        return "qparams: missing"
    if d := plain_differs(expect["qparams"], r.qparams):
        return f"qparams: {d}"
    return ""


def group_step_differs(step: dict, outcome: Any, unprefixed: Callable[[str], str]) -> str:
    """What differs between a group case's step and its outcome; "" if nothing."""
    if step["op"] not in ("create_group", "get_group_qparams"):
        if "scale_e4m3" in step.get("expect", {}):
            return nvfp4_judge(step, outcome)
        # A union_range member's forward (integer, fp8): vectors.jsonl's keys.
        return judge(step, outcome.qparams if isinstance(outcome, qparams.ObserveResult)
                     else outcome)
    if "expect_error" in step:
        wanted = GROUP_ERRORS[step["expect_error"]]
        return "" if isinstance(outcome, wanted) else (
            f"expected {wanted.__name__}, got {outcome!r}")
    if isinstance(outcome, Exception):
        return f"expected success, got {outcome}"
    if step["op"] == "get_group_qparams":
        return group_result_differs(step["expect"], outcome, unprefixed)
    return ""


def group_state(client: qparams.Client, prefix: str) -> tuple:
    """Everything under `prefix`, sessions and groups, to check that a failed step
    changed nothing."""
    sessions = []
    for session in client.list_sessions(prefix, page_size=1000):
        session.ClearField("update_time")
        sessions.append(session.SerializeToString())
    return tuple(sessions), tuple(client.list_scale_groups(prefix, page_size=1000))


def run_group_case(client: qparams.Client, case: dict, prefix: str, mode: str) -> str:
    """A group case with names under `prefix`, observing `mode` (reduce); "" if it
    matched, else the step and what differed. On success its sessions and groups are
    deleted."""
    def unprefixed(name: str) -> str:
        return name[len(prefix):] if name.startswith(prefix) else name

    for s in case["sessions"]:
        try:
            client.create_session(prefix + s["name"], spec_of(s), calculator=s["calculator"],
                                  averaging_constant=s.get("averaging_constant"))
        except (qparams.QParamsError, ValueError) as e:
            return f"creating session {s['name']}: {e}"
    for i, step in enumerate(case["steps"]):
        op = step["op"]
        before = group_state(client, prefix) if "expect_error" in step else None
        try:
            if op == "create_group":
                outcome: Any = client.create_scale_group(
                    prefix + step["group"], [prefix + m for m in step["members"]],
                    step["share"], fill_uncalibrated=step.get("fill_uncalibrated", False))
            elif op == "get_group_qparams":
                outcome = client.get_group_qparams(prefix + step["group"])
            else:
                outcome = session_calls(client, prefix + step["session"], mode)[op](step)
        except (qparams.QParamsError, ValueError) as e:
            outcome = e
        if d := group_step_differs(step, outcome, unprefixed):
            return f"step {i} ({op}): {d}"
        if before is not None and group_state(client, prefix) != before:
            return f"step {i} ({op}): a failed step changed the sessions or groups"
    for group in client.list_scale_groups(prefix, page_size=1000):
        client.delete_scale_group(group.name)
    for s in case["sessions"]:
        client.delete_session(prefix + s["name"])
    return ""


def run_group_cases(client: qparams.Client, cases: list[dict],
                    capsys: pytest.CaptureFixture) -> dict[str, str]:
    """The group cases each way of GROUP_MODES; the first difference of each failed
    case, by id."""
    failed = {}
    for mode in GROUP_MODES:
        mode_failures = 0
        for i, c in enumerate(cases):
            try:
                d = run_group_case(client, c, f"nvfp4-group/{mode}/{i}/", mode)
            except Exception as e:  # counted, so that one odd case does not hide the rest
                d = f"raised {e!r}"
            if d:
                mode_failures += 1
                failed.setdefault(c["id"], f"{c['id']} (groups, reduce={mode}): {d}")
        report(capsys, f"nvfp4 conformance via scale groups, observe reduce={mode}",
               len(cases) - mode_failures, len(cases))
    return failed


# The runner of each kind of case ("" for session cases); the cases of a kind not
# here are counted as not run.
RUNNERS: dict[str, Callable[[qparams.Client, list[dict], pytest.CaptureFixture],
                            dict[str, str]]] = {
    "": run_session_cases,
    "group": run_group_cases,
    "qdq": run_qdq_cases,
}


def test_every_case_every_way(client, all_cases, capsys) -> None:
    by_kind: dict[str, list[dict]] = collections.defaultdict(list)
    for c in all_cases:
        by_kind[c.get("kind", "")].append(c)
    not_run = {kind: len(cs) for kind, cs in by_kind.items() if kind not in RUNNERS}
    total = sum(len(cs) for kind, cs in by_kind.items() if kind in RUNNERS)
    failed: dict[str, str] = {}
    try:
        for kind, runner in RUNNERS.items():
            if by_kind.get(kind):
                failed.update(runner(client, by_kind[kind], capsys))
        report(capsys, "nvfp4 conformance", total - len(failed), total)
    finally:
        if not_run:
            counts = " and ".join(f"{n} {kind}" for kind, n in sorted(not_run.items()))
            with capsys.disabled():
                print(f"nvfp4 conformance: {counts} cases not run through the Python client "
                      f"({nvfp4_vectors()})")
    assert total and not failed, "\n".join(list(failed.values())[:20])
