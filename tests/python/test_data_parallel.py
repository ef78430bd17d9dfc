"""Data-parallel calibration: four processes ("ranks"), each observing its own shard
of the same seeded data through RemoteObserver, in its own order and its own batch
split, into the same global_minmax sessions, end with qparams bit-identical to one
process observing all of it.

Each rank is a child process of Debian's Python running rank_main() below; every child
is waited for (or killed) by its PID.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch
from torch.ao.quantization import QConfig, convert, prepare
from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver

import qparams.torch as qtorch
from qparams.torch import RemoteObserver, name_observers
from helpers import Net, f32_bits

WORLD = 4
HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients():
    """The server waits for open streams when it stops: close them first."""
    yield
    qtorch.close_clients()


# ---------------------------------------------------------------- shared by every rank

def dataset() -> list[torch.Tensor]:
    """The calibration data: 24 batches of (6, 16), channels of different ranges."""
    g = torch.Generator().manual_seed(2024)
    spread = torch.linspace(0.5, 4.0, 16)
    return [torch.randn(6, 16, generator=g) * spread + 0.1 * (i % 5 - 2) for i in range(24)]


def observer_args() -> dict:
    return dict(dtype=torch.qint8, qscheme=torch.per_channel_affine, ch_axis=1,
                target="weight")


def qconfig(run: str, target: str) -> QConfig:
    return QConfig(
        activation=RemoteObserver.with_args(run=run, server=target),
        weight=RemoteObserver.with_args(run=run, server=target, dtype=torch.qint8,
                                        qscheme=torch.per_channel_symmetric, target="weight"))


def my_shard(rank: int, resplit: bool = True) -> list[torch.Tensor]:
    """This rank's batches (every WORLD-th), shuffled by a rank-seeded permutation and,
    with `resplit`, split differently per rank: one tensor, halves, or batch by batch.

    A model's shard keeps the batches whole: an optimized BLAS (OpenBLAS) may round a
    Linear's output differently, by an ulp, for another batch shape, and the reference
    calibrates on the batches as they are."""
    shard = dataset()[rank::WORLD]
    order = torch.randperm(len(shard), generator=torch.Generator().manual_seed(100 + rank))
    shard = [shard[i] for i in order.tolist()]
    if not resplit:
        return shard
    if rank == 0:
        return [torch.cat(shard)]
    if rank == 1:
        return [half for x in shard for half in x.split(3)]
    return shard


def rank_main(mode: str, target: str, run: str, rank: str) -> None:
    """One rank: observe this rank's shard, flush, print what it did as JSON."""
    shard = my_shard(int(rank), resplit=mode == "observer")
    if mode == "observer":
        obs = RemoteObserver(run=run, server=target, **observer_args())  # run/observer.0
        for x in shard:
            obs(x)
        obs.flush()
        print(json.dumps({"names": [obs.session_name], "forwards": len(shard)}))
    elif mode == "model":
        torch.manual_seed(0)
        model = Net().eval()
        model.qconfig = qconfig(run, target)
        prepared = prepare(model)
        names = name_observers(prepared, run)
        with torch.no_grad():
            for x in shard:
                prepared(x)
        qtorch.flush_all()
        print(json.dumps({"names": sorted(names), "forwards": len(shard)}))
    else:
        raise SystemExit(f"unknown mode {mode}")


# ---------------------------------------------------------------- the parent

def run_ranks(mode: str, target: str, run: str) -> list[dict]:
    """Starts WORLD ranks at once and waits for each by its PID; their JSON reports."""
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import test_data_parallel as t; "
            "t.rank_main(*sys.argv[1:])")
    procs = [subprocess.Popen([sys.executable, "-c", code, mode, target, run, str(rank)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(WORLD)]
    reports = []
    try:
        for rank, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"rank {rank} (pid {p.pid}) failed:\n{err}"
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return reports


def test_four_ranks_into_one_per_channel_session_equal_one_process(server, client,
                                                                     name) -> None:
    reports = run_ranks("observer", server.target, name)
    shared = f"{name}/observer.0"  # the same default name in every rank
    assert [r["names"] for r in reports] == [[shared]] * WORLD
    forwards = sum(r["forwards"] for r in reports)
    assert forwards == 1 + 12 + 6 + 6  # the splits differ by rank
    session = client.get_session(shared)
    assert (session.calculator, session.observation_count) == ("global_minmax", forwards)

    # One process, all the data, in order, into another session; and torch.ao.
    single = RemoteObserver(name=f"{name}/single", server=server.target, **observer_args())
    torch_ao = PerChannelMinMaxObserver(ch_axis=1, dtype=torch.qint8,
                                        qscheme=torch.per_channel_affine)
    for x in dataset():
        single(x)
        torch_ao(x)
    reader = RemoteObserver(name=shared, server=server.target, **observer_args())
    got, want = reader.get_qparams(), single.get_qparams()
    assert got.shape == want.shape == (1, 16)
    assert f32_bits(got.scale) == f32_bits(want.scale)
    assert f32_bits(got.minval) == f32_bits(want.minval)
    assert got.zero_point.tolist() == want.zero_point.tolist()
    scale, zero_point = reader.calculate_qparams()
    expected = torch_ao.calculate_qparams()
    assert (f32_bits(scale), zero_point.tolist()) == (f32_bits(expected[0]),
                                                      expected[1].tolist())


def test_four_ranks_calibrate_one_model_then_any_process_converts(server, client,
                                                                  name) -> None:
    reports = run_ranks("model", server.target, name)
    names = [f"{name}/{m}.output" for m in ("fc1", "fc2", "quant")]
    assert [r["names"] for r in reports] == [names] * WORLD
    forwards = sum(r["forwards"] for r in reports)
    assert all(client.get_session(n).observation_count == forwards for n in names)

    # The converting process observed nothing itself: it reads what the ranks observed.
    torch.manual_seed(0)
    model = Net().eval()
    model.qconfig = qconfig(name, server.target)
    prepared = prepare(model)
    name_observers(prepared, name)
    quantized = convert(prepared)

    torch.manual_seed(0)
    reference = Net().eval()
    reference.qconfig = QConfig(
        activation=MinMaxObserver.with_args(dtype=torch.quint8),
        weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8,
                                                  qscheme=torch.per_channel_symmetric))
    reference = prepare(reference)
    with torch.no_grad():
        for x in dataset():
            reference(x)
    expected = convert(reference)

    assert f32_bits(quantized.quant.scale) == f32_bits(expected.quant.scale)
    assert quantized.quant.zero_point.tolist() == expected.quant.zero_point.tolist()
    for layer in ("fc1", "fc2"):
        a, b = getattr(quantized, layer), getattr(expected, layer)
        assert (f32_bits(a.scale), a.zero_point) == (f32_bits(b.scale), b.zero_point)
        assert f32_bits(a.weight().q_per_channel_scales()) == \
            f32_bits(b.weight().q_per_channel_scales())
        assert torch.equal(a.weight().int_repr(), b.weight().int_repr())
    x = dataset()[0]
    assert torch.equal(quantized(x), expected(x))
