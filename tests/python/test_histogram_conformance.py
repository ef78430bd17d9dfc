"""The histogram calculators' conformance vectors ($QPARAMS_HISTOGRAM_VECTORS, default
tests/data/histogram.jsonl) through the Python client, bit for bit, four ways: every
forward's tensor sent whole (reduce="never"), every forward binned here into a histogram
(reduce="always", qparams.local_histogram), observe_many and observe_batch (the default
reduce="auto"). Prints `histogram conformance: N of M cases match` per way and overall (a
case matches when it matches every way); a case's failed steps must leave its session
unchanged."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import qparams
from conftest import REPO
from helpers import f32_bits
from test_conformance import run_every_way, run_steps, session_calls, spec_of

ERRORS = {"invalid_argument": qparams.InvalidArgument,
          "failed_precondition": qparams.FailedPrecondition,
          "resource_exhausted": qparams.ResourceExhausted}
MODES = ("never", "always", "observe_many", "observe_batch")


def histogram_vectors() -> str:
    """$QPARAMS_HISTOGRAM_VECTORS, else the project's copy of the histogram vectors."""
    return (os.environ.get("QPARAMS_HISTOGRAM_VECTORS")
            or str(REPO / "tests/data/histogram.jsonl"))


def load_cases() -> list[dict]:
    with open(histogram_vectors()) as f:
        return [json.loads(line) for line in f if line.strip()]


def counts_of(counts: list | dict) -> list[int]:
    """A JSON counts field, sparse or not, as the list it stands for."""
    if isinstance(counts, list):
        return counts
    out = [0] * counts["length"]
    for k, c in counts["nonzero"]:
        out[k] = c
    return out


def double(text: str | None) -> float | None:
    """A hexadecimal float (or inf, -inf, nan) of the vectors."""
    if text is None:
        return None
    return float(text) if text in ("inf", "-inf", "nan") else float.fromhex(text)


def histogram_message(h: dict) -> qparams.pb.HistogramObservation:
    """The HistogramObservation of a vector's JSON histogram, exactly (counts above
    2^63 and invalid extrema included, for the error steps)."""
    message = qparams.pb.HistogramObservation(
        num_bins=h["num_bins"], exponent=h["exponent"], counts=counts_of(h["counts"]),
        zero_count=h["zero_count"], negative_count=h["negative_count"],
        nan_count=h["nan_count"], posinf_count=h["posinf_count"],
        neginf_count=h["neginf_count"])
    for field in ("min", "max"):
        if h[field] is not None:
            setattr(message, field, double(h[field]))
    return message


def differs(expect: dict, q: qparams.QParams | None,
            calibration: qparams.Calibration | None) -> str:
    """What differs between an expected result and the qparams and calibration."""
    if q is None:
        return "no qparams"
    zp = None if q.zero_point is None else q.zero_point.ravel().tolist()
    mv = f32_bits(q.minval)
    for field, ours in (("shape", list(q.shape)), ("scale", f32_bits(q.scale)),
                        ("zero_point", zp), ("minval", mv),
                        ("initialized", q.initialized)):
        if expect[field] != ours:
            return f"{field}: expected {expect[field]}, got {ours}"
    if not expect["initialized"]:
        return "" if calibration is None else f"a calibration before any value: {calibration}"
    if calibration is None:
        return "no calibration"
    amax_bits = int(np.float64(calibration.amax).view(np.uint64))
    for field, ours in (("amax_bits", amax_bits), ("bin_index", calibration.bin_index),
                        ("exponent", calibration.exponent),
                        ("total_count", calibration.total_count)):
        if expect[field] != ours:
            return f"{field}: expected {expect[field]}, got {ours}"
    return ""


def histogram_differs(expect: dict, h: qparams.Histogram) -> str:
    """What differs between an expected histogram and the session's."""
    ours = {"num_bins": h.num_bins, "exponent": h.exponent, "counts": h.counts.tolist(),
            "zero_count": h.zero_count, "negative_count": h.negative_count,
            "nan_count": h.nan_count, "posinf_count": h.posinf_count,
            "neginf_count": h.neginf_count}
    for field, value in ours.items():
        wanted = counts_of(expect[field]) if field == "counts" else expect[field]
        if wanted != value:
            return f"histogram {field}: expected {str(wanted)[:80]}, got {str(value)[:80]}"
    for field in ("min", "max"):
        wanted, got = double(expect[field]), getattr(h, field)
        same = (wanted is None and got is None) or (
            wanted is not None and got is not None and wanted.hex() == got.hex())
        if not same:
            return f"histogram {field}: expected {expect[field]}, got {got!r}"
    return ""


def judge(step: dict, outcome: Any) -> str:
    """Compares a step's outcome: an ObserveResult, QParams, Histogram, exception or None."""
    if "expect_error" in step:
        wanted = ERRORS[step["expect_error"]]
        if isinstance(outcome, wanted):
            return ""
        return f"expected {wanted.__name__} ({step.get('rule', '')}), got {outcome!r}"
    if isinstance(outcome, Exception):
        return f"expected success, got {outcome}"
    if "expect" not in step:
        return ""
    if isinstance(outcome, qparams.Histogram):
        return histogram_differs(step["expect"], outcome)
    if isinstance(outcome, qparams.ObserveResult):
        return differs(step["expect"], outcome.qparams, outcome.calibration)
    return differs(step["expect"], outcome, outcome.calibration)


def create(client: qparams.Client, case: dict, name: str) -> str | None:
    """Creates the case's session: "" when construction failed as expected, an error
    text when it did not, None when the session exists and its steps are to run."""
    try:
        client.create_session(name, spec_of(case), calculator=case["calculator"],
                              histogram=case.get("histogram"))
    except (qparams.InvalidArgument, ValueError, TypeError) as e:
        return "" if "construct_error" in case else f"create_session: {e}"
    if "construct_error" in case:
        return "create_session: expected InvalidArgument"
    return None


def run_case(client: qparams.Client, case: dict, name: str, mode: str) -> str:
    failed = create(client, case, name)
    if failed is not None:
        return failed
    calls = session_calls(client, name, "never" if mode == "never" else "always")
    calls.update({
        "observe_histogram": lambda step: client.observe_histogram(
            name, histogram_message(step["histogram"])),
        "get_histogram": lambda step: client.get_histogram(name),
    })
    d = run_steps(client, name, case["steps"], mode, calls, judge)
    if not d:
        client.delete_session(name)
    return d


@pytest.fixture(scope="module")
def cases() -> list[dict]:
    cases = load_cases()
    assert cases, f"no cases in {histogram_vectors()}"
    return cases


def test_every_case_four_ways(client, cases, capsys) -> None:
    run_every_way(client, cases, MODES, run_case, "histogram ", capsys)
