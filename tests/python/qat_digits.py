"""What test_qat_torch.py's data-parallel QAT runs on: sklearn's digits, a small CNN
prepared for QAT with RemoteFakeQuantize or with torch.ao's default QAT qconfig, the
global batches of each epoch, and the rank process torch.multiprocessing spawns
(gloo over a FileStore: no port)."""

from __future__ import annotations

import copy
import json
import pathlib
import sys
from typing import Any

import torch
import torch.nn as nn
from torch.ao.quantization import (QConfig, convert, fuse_modules_qat, get_default_qat_qconfig,
                                   prepare_qat)

import qparams
from qparams.torch import QATRun, RemoteFakeQuantize

BATCH = 64       # the global batch; each of W ranks takes BATCH / W of it
SEED = 0


# The example's model and data, so that the test trains what the docs show.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from qat_torchrun import DigitsCNN, digits  # noqa: E402


def remote_qconfig() -> QConfig:
    """torch.ao's qnnpack QAT qconfig, with RemoteFakeQuantize in FakeQuantize's place."""
    return QConfig(activation=RemoteFakeQuantize.with_args(dtype=torch.quint8),
                   weight=RemoteFakeQuantize.with_args(dtype=torch.qint8,
                                                       qscheme=torch.per_tensor_symmetric))


def prepared(kind: str) -> nn.Module:
    """The CNN (seeded), fused and prepared for QAT: kind "remote" or "torch"."""
    torch.manual_seed(SEED)
    model = DigitsCNN().train()
    model = fuse_modules_qat(model, [["conv1", "relu1"], ["conv2", "relu2"]])
    model.qconfig = remote_qconfig() if kind == "remote" else get_default_qat_qconfig("qnnpack")
    return prepare_qat(model)


def batches(n: int, epoch: int) -> list[torch.Tensor]:
    """The index tensors of epoch `epoch`'s global batches over n samples (whole
    batches only)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(100 + epoch))
    return [order[i:i + BATCH] for i in range(0, n - BATCH + 1, BATCH)]


def fake_quant_state(model: nn.Module) -> dict[str, list]:
    """Every RemoteFakeQuantize's (scale bits, zero points), by session name."""
    out = {}
    for module in model.modules():
        if isinstance(module, RemoteFakeQuantize):
            out[module.session_name] = [module.scale.view(torch.int32).tolist(),
                                        module.zero_point.tolist()]
    return out


def accuracy(quantized: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((quantized(x).argmax(1) == y).float().mean()) * 100.0


def train(model: nn.Module, run: QATRun | None, x: torch.Tensor, y: torch.Tensor, *,
          epochs: int, lr: float, rank: int = 0, world: int = 1, split: int = 1,
          limit: int | None = None) -> list[dict[str, list]]:
    """QAT of `model` over the global batches: rank `rank` of `world` takes its slice
    of each, forwarded in `split` parts (W = 1 forwarding W parts gives each forward
    the shapes a rank's has); gradients averaged over the ranks (gloo all_reduce).
    Returns the fake-quant state after each step's hook (with a run)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    states, s = [], 0
    for epoch in range(epochs):
        for index in batches(len(x), epoch):
            if limit is not None and s == limit:
                break
            if run is not None:
                run.step(s)
                states.append(fake_quant_state(model))
            mine = index.chunk(world)[rank]
            # The global batch's mean loss: the ranks' gradient sums, averaged below.
            for part in mine.chunk(split):
                (loss_fn(model(x[part]), y[part]) / len(index) * world).backward()
            if world > 1:
                for p in model.parameters():
                    torch.distributed.all_reduce(p.grad)
                    p.grad /= world
            optimizer.step()
            optimizer.zero_grad()
            s += 1
    if run is not None:
        run.finish()
    return states


def convert_int8(model: nn.Module) -> nn.Module:
    torch.backends.quantized.engine = "qnnpack"
    return convert(copy.deepcopy(model).eval())


def rank_main(rank: int, world: int, store: str, target: str, prefix: str, out: str,
              epochs: int, lr0_steps: int) -> None:
    """One rank (torch.multiprocessing.spawn): lr=0 steps into prefix "lr0/", then
    QAT for `epochs` into "train/"; writes its fake-quant states and (rank 0) the
    int8 accuracy to out/rank{rank}.json."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                                         world_size=world)
    x, y, x_test, y_test = digits()
    with qparams.Client(target) as client:
        model = prepared("remote")
        run = QATRun(client, model, prefix + "lr0/")
        lr0 = train(model, run, x, y, epochs=1, lr=0.0, rank=rank, world=world,
                    limit=lr0_steps)
        model = prepared("remote")
        run = QATRun(client, model, prefix + "train/")
        states = train(model, run, x, y, epochs=epochs, lr=0.05, rank=rank, world=world)
        report: dict[str, Any] = {"lr0": lr0, "train": states,
                                  "final": fake_quant_state(model)}
        if rank == 0:
            report["accuracy"] = accuracy(convert_int8(model), x_test, y_test)
    pathlib.Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
