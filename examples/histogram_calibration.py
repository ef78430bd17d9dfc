"""Outlier-robust activation calibration on a real model, through the qparams service.

A small MLP (64 -> 128 -> 128 -> 10, ReLU) is trained in about a second on
scikit-learn's digits (python3-sklearn ships them). Its hidden activations get one
outlier channel, injected the way large language models grow them: hidden unit 0 of
each layer (the one with the largest mean) is scaled up by OUTLIER (its fc row and bias
times OUTLIER, the next layer's column divided by OUTLIER), which leaves the float
model's outputs unchanged but puts values up to OUTLIER times larger than the rest, one
in 128, into every per-tensor hidden activation range.

The activations (the input and both hidden layers) are then quantized per tensor,
asymmetric (their values are non-negative), to 8 bits (0..255) and to 4 bits (0..15),
with qparams from each calibrator: the service's global_minmax (MinMaxObserver's range),
percentile (99.99), entropy and mse through qparams.torch.RemoteObserver, and torch.ao's
HistogramObserver in-process. Weights stay float, so the table shows the activation
calibration alone. It prints the test accuracy of each:

    python3 examples/histogram_calibration.py [--server HOST:PORT]

(default $QPARAMS_TARGET, else 127.0.0.1:50051, e.g. `make run`; with PYTHONPATH=
build/python, or the qparams package installed). Each run calibrates under its own run
name and deletes its sessions at the end. The functions are the ones
tests/python/test_histogram_example.py runs, with four processes over shards of the
calibration data as well.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.ao.quantization import HistogramObserver

import qparams
from qparams.torch import RemoteObserver, delete_run

OUTLIER = 16.0
#: The service's calculators the example compares, with torch.ao's HistogramObserver.
SERVICE_METHODS = ("global_minmax", "percentile", "entropy", "mse")
METHODS = SERVICE_METHODS + ("HistogramObserver",)
#: Bits -> the quantized range of the activations (asymmetric, non-negative).
RANGES = {8: (0, 255), 4: (0, 15)}
POINTS = ("input", "hidden1", "hidden2")


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train x, train y, test x, test y): the 1797 digits, pixels scaled to [0, 1],
    shuffled (seeded), 360 for test."""
    from sklearn.datasets import load_digits
    d = load_digits()
    order = torch.randperm(len(d.target), generator=torch.Generator().manual_seed(0))
    x = (torch.tensor(d.data, dtype=torch.float32) / 16.0)[order]
    y = torch.tensor(d.target)[order]
    return x[:-360], y[:-360], x[-360:], y[-360:]


class Tapped(nn.Module):
    """A model with a hook at each activation an example quantizes: its forward passes
    each named point's activation through _tap (examples/calibrator_choice.py's CNN is
    one too)."""

    def __init__(self) -> None:
        super().__init__()
        #: point name -> a function applied to that activation (identity by default).
        self.taps: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}

    def _tap(self, point: str, x: torch.Tensor) -> torch.Tensor:
        f = self.taps.get(point)
        return x if f is None else f(x)


class MLP(Tapped):
    """The model, with a hook at each activation the example quantizes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, 128), nn.Linear(128, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._tap("input", x)
        x = self._tap("hidden1", torch.relu(self.fc1(x)))
        x = self._tap("hidden2", torch.relu(self.fc2(x)))
        return self.fc3(x)


def fit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, batch: int) -> None:
    """Trains `model` on (x, y): Adam at 1e-2, cross-entropy, `epochs` passes over
    consecutive batches of `batch` rows."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        for i in range(0, len(x), batch):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + batch]), y[i:i + batch]).backward()
            optimizer.step()


def trained_model(x: torch.Tensor, y: torch.Tensor) -> MLP:
    """The MLP trained on (x, y) (deterministic: seeded, one thread's arithmetic), then
    given its outlier channels (the float outputs are unchanged up to rounding)."""
    torch.manual_seed(0)
    model = MLP()
    fit(model, x, y, epochs=60, batch=256)
    with torch.no_grad():
        for k, (fc, following) in enumerate(((model.fc1, model.fc2), (model.fc2, model.fc3))):
            hidden = torch.relu(model.fc1(x))
            if k:
                hidden = torch.relu(model.fc2(hidden))
            unit = int(hidden.mean(0).argmax())  # the unit with the largest mean
            fc.weight[unit] *= OUTLIER
            fc.bias[unit] *= OUTLIER
            following.weight[:, unit] /= OUTLIER
    return model.eval()


def observers(method: str, bits: int, run: str, server: str | None,
              reduce: str = "auto") -> dict[str, nn.Module]:
    """One observer per activation point for `method` at `bits`; the service's named
    run/<point>, so that processes calibrating the same run share sessions. reduce:
    how RemoteObserver sends a batch ("auto": a histogram session's is binned here)."""
    quant_min, quant_max = RANGES[bits]
    if method == "HistogramObserver":
        return {p: HistogramObserver(dtype=torch.quint8, quant_min=quant_min,
                                     quant_max=quant_max) for p in POINTS}
    return {p: RemoteObserver(torch.quint8, torch.per_tensor_affine, quant_min=quant_min,
                              quant_max=quant_max, calculator=method, name=f"{run}/{p}",
                              server=server, reduce=reduce)
            for p in POINTS}


def calibrate(model: Tapped, found: dict[str, nn.Module],
              batches: Iterable[torch.Tensor]) -> None:
    """Runs the batches through the model with each observer watching its activation,
    and waits until the service has every observation."""
    model.taps = dict(found)
    with torch.no_grad():
        for batch in batches:
            model(batch)
    model.taps = {}
    for o in found.values():
        if isinstance(o, RemoteObserver):
            o.flush()


def qparams_of(found: dict[str, nn.Module]) -> dict[str, tuple[float, int]]:
    """(scale, zero point) of each point's observer, as torch.ao's convert takes them."""
    out = {}
    for point, o in found.items():
        scale, zero_point = o.calculate_qparams()
        out[point] = (float(scale.reshape(-1)[0]), int(zero_point.reshape(-1)[0]))
    return out


def accuracy(model: Tapped, x: torch.Tensor, y: torch.Tensor,
             found: dict[str, tuple[float, int]] | None, bits: int) -> float:
    """Test accuracy with each activation fake-quantized by its qparams (none: float)."""
    quant_min, quant_max = RANGES[bits]
    if found:
        model.taps = {p: (lambda t, s=s, z=z: torch.fake_quantize_per_tensor_affine(
            t, s, z, quant_min, quant_max)) for p, (s, z) in found.items()}
    with torch.no_grad():
        correct = (model(x).argmax(1) == y).float().mean().item()
    model.taps = {}
    return correct


def calibrate_shard(state: dict[str, torch.Tensor], run: str, server: str | None,
                    shard: int, shards: int) -> None:
    """One data-parallel rank: calibrates every service method at 4 bits on its shard
    of the training batches (batch k for k % shards == shard), into the run's shared
    sessions. Module-level, so that a spawned process can run it."""
    torch.set_num_threads(1)
    x = digits()[0]
    model = MLP()
    model.load_state_dict(state)
    for method in SERVICE_METHODS:
        found = observers(method, 4, f"{run}/{method}", server)
        calibrate(model, found, batches_of(x)[shard::shards])


def batches_of(x: torch.Tensor, size: int = 64) -> list[torch.Tensor]:
    """x in consecutive batches of `size` rows (the last may be shorter)."""
    return [x[i:i + size] for i in range(0, len(x), size)]


def run_table(server: str | None = None, run: str | None = None) -> dict[str, dict[int, float]]:
    """Trains, calibrates with every method at 8 and 4 bits on the training images, and
    returns {method: {bits: test accuracy}} (plus "float")."""
    torch.set_num_threads(1)  # the training's arithmetic, the same on every machine
    x, y, tx, ty = digits()
    model = trained_model(x, y)
    run = run or f"histogram-example-{os.getpid()}-{time.time_ns()}"
    table: dict[str, dict[int, float]] = {"float": {b: accuracy(model, tx, ty, None, b)
                                                    for b in RANGES}}
    try:
        for method in METHODS:
            table[method] = {}
            for bits in RANGES:
                found = observers(method, bits, f"{run}/{method}/{bits}", server)
                calibrate(model, found, batches_of(x))
                table[method][bits] = accuracy(model, tx, ty, qparams_of(found), bits)
    finally:
        delete_run(run, server=server)
    return table


def format_table(table: dict[str, dict[int, float]]) -> str:
    """The table as Markdown."""
    lines = ["| activations calibrated by | int8 accuracy | int4 accuracy |", "|---|---|---|"]
    for method, by_bits in table.items():
        lines.append(f"| {method} | {by_bits[8]:.1%} | {by_bits[4]:.1%} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="the qparams server (default $QPARAMS_TARGET, "
                        f"else {qparams.DEFAULT_TARGET})")
    args = parser.parse_args(argv)
    print(format_table(run_table(args.server)))


if __name__ == "__main__":
    main()
