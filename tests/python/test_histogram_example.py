"""examples/histogram_calibration.py, run as docs/histograms.md shows it, and the property the
histogram calculators promise on its model: four processes calibrating one run over
different shards of the data (each binning its batches locally and sending histograms)
give bit-identical qparams to one process sending the tensors in another order."""

from __future__ import annotations

import multiprocessing
import sys

import torch

import qparams
from conftest import REPO

sys.path.insert(0, str(REPO / "examples"))
import histogram_calibration as example  # noqa: E402


def test_the_table(server, capsys) -> None:
    table = example.run_table(server.target)
    with capsys.disabled():
        print("\n" + example.format_table(table))
    assert set(table) == {"float", *example.METHODS}
    assert table["float"][8] > 0.95
    for method in example.METHODS:
        assert table[method][8] > 0.95, method  # int8 tolerates the outliers
    # At 4 bits the outlier channel costs the min/max range most of its accuracy, and
    # mse's clipping gets most of it back.
    assert table["global_minmax"][4] < 0.5 < 0.9 < table["mse"][4]


def qparams_by_session(client: qparams.Client, run: str) -> dict[str, tuple]:
    """Every session of the run, by its name below the run: scale, zero point and
    calibration, exactly."""
    out = {}
    for session in client.list_sessions(run + "/"):
        q = client.get_qparams(session.name)
        key = session.name[len(run) + 1:]
        out[key] = (q.scale.tobytes(), q.zero_point.tobytes(), q.calibration)
    return out


def test_four_processes_and_another_order_give_identical_qparams(server, client) -> None:
    torch.set_num_threads(1)
    x, y, _, _ = example.digits()
    model = example.trained_model(x, y)
    ranks = "histogram-example/ranks"
    spawn = multiprocessing.get_context("spawn")
    workers = [spawn.Process(target=example.calibrate_shard,
                             args=(model.state_dict(), ranks, server.target, shard, 4))
               for shard in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
        assert w.exitcode == 0, f"rank {workers.index(w)} exited with {w.exitcode}"

    single = "histogram-example/single"
    for method in example.SERVICE_METHODS:
        found = example.observers(method, 4, f"{single}/{method}", server.target,
                                  reduce="never")
        example.calibrate(model, found, reversed(example.batches_of(x)))

    by_ranks = qparams_by_session(client, ranks)
    by_one = qparams_by_session(client, single)
    assert len(by_ranks) == len(example.SERVICE_METHODS) * len(example.POINTS)
    assert by_ranks == by_one
    for method in ("percentile", "entropy", "mse"):
        calibration = by_ranks[f"{method}/hidden2"][2]
        assert calibration is not None and calibration.total_count == len(x) * 128
    for run in (ranks, single):
        qparams.torch.delete_run(run, server=server.target)
