"""When each calibrator helps: a small CNN's activations at 4 bits, through the qparams
service, on four kinds of data.

A CNN (conv 1 -> 8, ReLU, conv 8 -> 16 stride 2, ReLU, linear 256 -> 10) is trained in
a second on scikit-learn's digits (8x8 images, pixels scaled to [0, 1]; python3-
sklearn ships them). Its three activations (the input and both ReLU outputs) are then
fake-quantized per tensor, asymmetric, to 4 bits (0..15), with qparams from each of the
service's calculators through qparams.torch.RemoteObserver (weights stay float; entropy
also with start_bin=32), and the test accuracy is measured on four kinds of data:

- "no outliers": the digits as they are;
- "three pixels x50": three pixels inked in 2-3% of the digits multiplied by 50 in every
  image (the model is trained so): 0.08% of the input's values are outliers, at
  3x to 40x the bulk (a pixel is k/16, so they take few distinct values);
- "three hot pixels": three corner pixels read 50 in 0.1% of the images (the model is
  trained so): four outlier values in the training set, all 50x the bulk, with empty
  bins between;
- "one channel x16": the model of "no outliers" with the first conv's channel of the
  largest mean scaled up 16x (its filter and bias times 16, the second conv's weights
  of that channel divided by 16): the float model's outputs are unchanged, but one
  value in eight of that activation is up to 16x the others, spread continuously.

    python3 examples/calibrator_choice.py [--server HOST:PORT]

(default $QPARAMS_TARGET, else 127.0.0.1:50051, e.g. `make run`; with PYTHONPATH=
build/python, or the qparams package installed). It prints the accuracy table and the
clipping range each calibrator chose at the activation holding the outliers, as
docs/histograms.md shows them;
tests/python/test_calibrator_choice.py runs it and checks the page's tables against
it. Each run calibrates under its own run name and deletes its sessions at the end.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

import torch
from torch import nn

import qparams
from qparams.torch import RemoteObserver, delete_run

# The sibling example's tapped model, training, calibration and fake-quantized accuracy
# (a script run from examples/ finds it beside itself).
from histogram_calibration import (RANGES, Tapped, accuracy, batches_of, calibrate, fit,
                                   qparams_of)

#: The table's columns: the service's calculators with their defaults, and entropy
#: with candidates from bin 32 (histogram.md 6.3): {label: (calculator, histogram=)}.
METHODS = {"global_minmax": ("global_minmax", None), "moving_average": ("moving_average", None),
           "percentile": ("percentile", None), "entropy": ("entropy", None),
           "entropy start_bin=32": ("entropy", {"start_bin": 32}), "mse": ("mse", None)}
#: The kinds of data, in the order the table shows them, each with the activation that
#: holds its outliers.
CASES = {"no outliers": "input", "three pixels x50": "input",
         "three hot pixels": "input", "one channel x16": "conv1"}
POINTS = ("input", "conv1", "conv2")
BITS = 4  # asymmetric: the activations are non-negative
QUANT_MIN, QUANT_MAX = RANGES[BITS]
#: Pixels (row-major in the 8x8 image) inked in 2-3% of the digits, times 50.
PIXELS, PIXEL_FACTOR = (7, 23, 47), 50.0
#: Pixels of the corners, which read 50 in 0.1% of the images (seeded).
HOT_PIXELS, HOT_VALUE, HOT_FRACTION = (0, 7, 63), 50.0, 0.001
CHANNEL_FACTOR = 16.0


def digits(pixels: Sequence[int] = (), factor: float = 1.0, hot: float = 0.0
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train x, train y, test x, test y): the 1797 digits as [N, 1, 8, 8] images with
    pixels in [0, 1], shuffled (seeded), 360 for test. `pixels` are multiplied by
    `factor`, or with `hot`, set to `factor` in that fraction of the images (seeded)."""
    from sklearn.datasets import load_digits
    d = load_digits()
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(d.target), generator=generator)
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    if hot:
        stuck = torch.rand(len(x), len(pixels), generator=generator) < hot
        x[:, list(pixels)] = torch.where(stuck, factor, x[:, list(pixels)])
    else:
        x[:, list(pixels)] *= factor
    x = x[order].reshape(-1, 1, 8, 8)
    y = torch.tensor(d.target)[order]
    return x[:-360], y[:-360], x[-360:], y[-360:]


class CNN(Tapped):
    """The model, with a hook at each activation the example quantizes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self._tap("input", x)
        x = self._tap("conv1", torch.relu(self.conv1(x)))
        x = self._tap("conv2", torch.relu(self.conv2(x)))
        return self.fc(x.flatten(1))


def trained(x: torch.Tensor, y: torch.Tensor) -> CNN:
    """The CNN trained on (x, y); deterministic (seeded, one thread's arithmetic)."""
    torch.manual_seed(0)
    model = CNN()
    fit(model, x, y, epochs=20, batch=128)
    return model.eval()


def with_outlier_channel(model: CNN, x: torch.Tensor) -> CNN:
    """A copy of `model` whose conv1 channel of the largest mean activation is scaled up
    CHANNEL_FACTOR times, and conv2's weights of that channel down as much: the same
    function (ReLU commutes with a positive factor), an outlier channel in conv1."""
    out = CNN()
    out.load_state_dict(model.state_dict())
    with torch.no_grad():
        channel = int(torch.relu(out.conv1(x)).mean((0, 2, 3)).argmax())
        out.conv1.weight[channel] *= CHANNEL_FACTOR
        out.conv1.bias[channel] *= CHANNEL_FACTOR
        out.conv2.weight[:, channel] /= CHANNEL_FACTOR
    return out.eval()


def observers(method: str, run: str, server: str | None) -> dict[str, RemoteObserver]:
    """One observer per activation point for the METHODS column `method`, its session
    named run/<point>."""
    calculator, histogram = METHODS[method]
    return {p: RemoteObserver(torch.quint8, torch.per_tensor_affine, quant_min=QUANT_MIN,
                              quant_max=QUANT_MAX, calculator=calculator, histogram=histogram,
                              name=f"{run}/{p}", server=server)
            for p in POINTS}


def activation(model: CNN, x: torch.Tensor, point: str) -> torch.Tensor:
    """The activation at `point` of the model on x."""
    seen = []
    model.taps = {point: lambda t: seen.append(t) or t}
    with torch.no_grad():
        model(x)
    model.taps = {}
    return seen[0]


def measure(server: str | None = None, run: str | None = None
            ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Trains, calibrates every case with every calculator on the training images and
    returns ({case: {"float" or calculator: test accuracy}}, {case: {calculator: the
    clipping range kept at the case's outlier activation, max_val / max |x|}})."""
    torch.set_num_threads(1)  # the training's arithmetic, the same on every run
    data = {"no outliers": digits(),
            "three pixels x50": digits(PIXELS, PIXEL_FACTOR),
            "three hot pixels": digits(HOT_PIXELS, HOT_VALUE, HOT_FRACTION)}
    models = {case: trained(x, y) for case, (x, y, _, _) in data.items()}
    data["one channel x16"] = data["no outliers"]
    models["one channel x16"] = with_outlier_channel(models["no outliers"],
                                                     data["no outliers"][0])
    run = run or f"calibrator-choice-{os.getpid()}-{time.time_ns()}"
    accuracies: dict[str, dict[str, float]] = {}
    kept: dict[str, dict[str, float]] = {}
    try:
        for k, (case, point) in enumerate(CASES.items()):
            model, (x, _, tx, ty) = models[case], data[case]
            accuracies[case] = {"float": accuracy(model, tx, ty, None, BITS)}
            kept[case] = {}
            largest = float(activation(model, x, point).max())
            for j, method in enumerate(METHODS):
                found = observers(method, f"{run}/{k}/{j}", server)
                calibrate(model, found, batches_of(x))
                accuracies[case][method] = accuracy(model, tx, ty, qparams_of(found), BITS)
                kept[case][method] = float(found[point].max_val) / largest
    finally:
        delete_run(run, server=server)
    return accuracies, kept


def format_tables(accuracies: dict[str, dict[str, float]],
                  kept: dict[str, dict[str, float]]) -> str:
    """The two tables as docs/histograms.md shows them, in Markdown."""
    rule = "|---" * (len(METHODS) + 1) + "|"
    lines = ["| test accuracy, activations at 4 bits | float | " + " | ".join(METHODS) + " |",
             rule + "---|"]
    for case, row in accuracies.items():
        lines.append(f"| {case} | " + " | ".join(f"{row[m]:.1%}" for m in ("float", *METHODS))
                     + " |")
    lines += ["", "| range kept (max_val / max \\|x\\|) at | " + " | ".join(METHODS) + " |",
              rule]
    for case, row in kept.items():
        lines.append(f"| {case}: {CASES[case]} | " + " | ".join(f"{row[m]:.3f}" for m in METHODS)
                     + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="the qparams server (default $QPARAMS_TARGET, "
                        f"else {qparams.DEFAULT_TARGET})")
    args = parser.parse_args(argv)
    print(format_tables(*measure(args.server)))


if __name__ == "__main__":
    main()
