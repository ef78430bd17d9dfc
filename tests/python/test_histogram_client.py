"""The Python client's histogram calculators: sessions with histogram parameters, local
histograms (qparams.local_histogram) equal to the server's bit for bit in every input
dtype, histograms merged across parts equal to the whole, observe_histogram, get_histogram,
the calibration beside the qparams, and the client's errors (integers beyond their
wire fields included)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import qparams
import qparams.torch


def data(seed: int = 0, n: int = 50_000) -> np.ndarray:
    """N(0, 1) with a few outliers, float32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.integers(0, n, 5)] = rng.choice([-1, 1], 5) * 30
    return x


def same_histogram(a: qparams.Histogram, b: qparams.Histogram) -> bool:
    return (a.num_bins, a.exponent, a.counts.tolist(), a.zero_count, a.negative_count,
            a.nan_count, a.posinf_count, a.neginf_count, a.min, a.max) == (
        b.num_bins, b.exponent, b.counts.tolist(), b.zero_count, b.negative_count,
        b.nan_count, b.posinf_count, b.neginf_count, b.min, b.max)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_local_histograms_equal_the_servers(client, name, dtype) -> None:
    x = torch.from_numpy(data()).to(dtype)
    x[7] = 0.0
    x[8] = -0.0
    wide = dtype in (torch.float32, torch.float64)
    x[9] = 2.0 ** -140 if wide else 0.0  # a subnormal float32
    client.create_session(name, target="activation", dtype="int8", calculator="entropy",
                          histogram={"num_bins": 1024})
    client.observe(name, x, reduce="never")
    local = qparams.local_histogram(x, 1024)
    assert same_histogram(client.get_histogram(name), local)
    assert local.zero_count == (2 if wide else 3) and local.min == float(x.min())
    if dtype != torch.bfloat16:  # numpy has no bfloat16
        assert same_histogram(qparams.local_histogram(x.numpy(), 1024), local)


def test_parts_merge_into_the_whole_in_any_order(client, name) -> None:
    x = data(1)
    parts = [x[:10], x[10:30_000], np.abs(x[30_000:40_000]), x[40_000:]]
    whole = np.concatenate(parts)
    histograms = [qparams.local_histogram(p, 4096) for p in parts]
    merged = histograms[3].merged(histograms[0]).merged(histograms[2].merged(histograms[1]))
    assert same_histogram(merged, qparams.local_histogram(whole, 4096))

    client.create_session(name, target="activation", dtype="int8", calculator="percentile",
                          histogram={"percentile": 99.9})
    result = client.observe_histogram(name, merged)
    assert result.calibration is not None and result.calibration.total_count == whole.size
    other = name + ".tensors"
    client.create_session(other, target="activation", dtype="int8", calculator="percentile",
                          histogram={"percentile": 99.9})
    for p in reversed(parts):
        client.observe(other, p, reduce="never", omit_qparams=True)
    assert client.get_qparams(other) == client.get_qparams(name) == result.qparams
    client.delete_session(other)


def test_calibration_and_lazy_results(client, name) -> None:
    x = data(2)
    client.create_session(name, target="activation", dtype="uint8", qscheme="asymmetric",
                          calculator="mse")
    r = client.observe(name, x, omit_qparams=True)
    assert r.qparams is None and r.calibration is None and r.observation_count == 1
    q = client.get_qparams(name)
    c = q.calibration
    assert c is not None and c.exponent == qparams.canonical_exponent(30.0, 4096)
    assert c.kl_margin is None and 0 < c.amax < 30
    session = client.get_session(name)
    assert session.histogram.num_bins == 4096 and session.histogram.start_bin == 128


def test_auto_sends_large_tensors_as_histograms(client, name) -> None:
    client.create_session(name, target="activation", dtype="int8", calculator="percentile",
                          histogram={"num_bins": 256, "nonfinite": "ignore"})
    big = torch.from_numpy(data(3))
    big[0] = float("nan")
    big[1] = float("-inf")
    request = client._request(name, big, "auto", False)
    assert request.WhichOneof("observation") == "histogram"
    assert request.histogram.nan_count == 1 and request.histogram.neginf_count == 1
    small = torch.ones(4)
    assert client._request(name, small, "auto", False).WhichOneof("observation") == "tensor"
    client.observe(name, big)
    h = client.get_histogram(name)
    assert h.nan_count == 1 and h.total == big.numel() - 2


def test_errors(client, name) -> None:
    with pytest.raises(ValueError, match="unknown key 'bins'"):
        client.create_session(name, target="activation", calculator="entropy",
                              histogram={"bins": 1024})
    with pytest.raises(ValueError, match="nonfinite 'drop'"):
        client.create_session(name, target="activation", calculator="entropy",
                              histogram={"nonfinite": "drop"})
    with pytest.raises(qparams.InvalidArgument, match="num_bins"):
        client.create_session(name, target="activation", calculator="entropy",
                              histogram={"num_bins": 1000})
    with pytest.raises(qparams.InvalidArgument):  # histogram= with another calculator
        client.create_session(name, target="activation", calculator="global_minmax",
                              histogram={})
    with pytest.raises(ValueError, match="power of two"):
        qparams.local_histogram(np.ones(3, np.float32), 1000)
    with pytest.raises(ValueError, match="NaN"):
        qparams.local_histogram(np.array([np.nan], np.float32), 256)

    client.create_session(name, target="activation", dtype="int8", calculator="entropy")
    with pytest.raises(qparams.InvalidArgument, match="num_bins"):
        client.observe_histogram(name, qparams.local_histogram(data(), 256))
    with pytest.raises(qparams.InvalidArgument, match="NaN|nan|finite"):
        client.observe(name, np.array([1.0, np.nan], np.float32), reduce="always")
    assert not client.get_qparams(name).initialized

    minmax = name + ".minmax"
    client.create_session(minmax, target="activation", calculator="global_minmax")
    with pytest.raises(qparams.InvalidArgument):
        client.observe_histogram(minmax, qparams.local_histogram(data(), 4096))
    with pytest.raises(qparams.InvalidArgument):
        client.get_histogram(minmax)
    client.delete_session(minmax)


@pytest.mark.parametrize("field, value", [
    ("num_bins", 2**40), ("num_bins", -2**31 - 1), ("start_bin", 2**32), ("stride", 2**31)])
def test_integers_beyond_the_wire_name_their_field(client, name, field, value) -> None:
    """An integer parameter an int32 field cannot hold is refused before any call,
    naming the field and the wire's range (protobuf's own error names none); one it can
    hold is the server's to judge, with its rule."""
    calculator = "percentile" if field == "num_bins" else "entropy"
    expected = (rf"^histogram\.{field} is {value}, outside the int32 range "
                r"\[-2147483648, 2147483647\] of its wire field$")
    with pytest.raises(ValueError, match=expected):
        client.create_session(name, target="activation", calculator=calculator,
                              histogram={field: value})
    with pytest.raises(ValueError, match=expected):
        qparams.torch.RemoteObserver(calculator=calculator, histogram={field: value},
                                     name=name)
    with pytest.raises(qparams.NotFound):
        client.get_session(name)  # nothing was sent
    with pytest.raises(qparams.InvalidArgument, match=rf"histogram\.{field} is 2147483647; "):
        client.create_session(name, target="activation", calculator=calculator,
                              histogram={field: 2**31 - 1})


def test_histograms_beyond_the_wire_name_their_field(client, name) -> None:
    """observe_histogram of a Histogram whose integers a wire field cannot hold: a
    ValueError naming the field, before any call; the server judges the rest."""
    client.create_session(name, target="activation", dtype="int8", calculator="entropy")
    h = qparams.local_histogram(data(), 4096)
    counts = h.counts.copy()
    counts[3] = -1
    for bad, field, wire in [
            (dict(num_bins=2**40), "num_bins", "int32"),
            (dict(exponent=-2**31 - 1), "exponent", "int32"),
            (dict(zero_count=2**64), "zero_count", "uint64"),
            (dict(nan_count=-1), "nan_count", "uint64"),
            (dict(counts=counts), r"counts\[3\]", "uint64")]:
        with pytest.raises(ValueError, match=rf"^histogram\.{field} is -?\d+, outside the "
                                             rf"{wire} range .* of its wire field$"):
            client.observe_histogram(name, dataclasses.replace(h, **bad))
    assert client.get_session(name).observation_count == 0
    with pytest.raises(qparams.InvalidArgument, match="num_bins"):
        client.observe_histogram(name, dataclasses.replace(h, num_bins=2**31 - 1))
    assert client.observe_histogram(name, h).observation_count == 1
