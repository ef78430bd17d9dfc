"""Quantization-aware training on data-parallel ranks with qparams.torch.RemoteFakeQuantize
(docs/qat.md, "Training with RemoteFakeQuantize"): a small CNN on sklearn's digits,
DistributedDataParallel over gloo on CPU, every rank's fake-quantize modules backed
by one step-merged session each, a checkpoint every few steps and a restart from
the last one.

    QPARAMS_TARGET=127.0.0.1:50051 python3 -m torch.distributed.run --nnodes=1 \\
        --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:0 \\
        --redirects=1 --tee=1 examples/qat_torchrun.py --prefix=job42/

Each rank takes its half of every global batch of 64. At the start of step s,
run.step(s) makes this rank's one Step call: the activations' ranges of step s-1,
the weights' ranges of step s, and the reads of the activations as of step s-1
(lag 1) and of the weights as of step s; every rank then fake-quantizes with the same
bits. Every --checkpoint-every steps all ranks call run.state_dict() and rank 0 saves
it with the model and the optimizer; started again with the checkpoint file present,
the job resumes from it (--stop-after ends a job early, as a preemption would, to try
that). Rank 0 prints the int8 accuracy of the converted model and a digest of every
module's final qparams: an interrupted and resumed job prints the uninterrupted one's.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.ao.quantization import (DeQuantStub, QConfig, QuantStub, convert, fuse_modules_qat,
                                   prepare_qat)

import qparams
from qparams.torch import QATRun, RemoteFakeQuantize

BATCH = 64


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quant = QuantStub()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(2)
        self.fc = nn.Linear(64, 10)
        self.dequant = DeQuantStub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(self.quant(x))))
        x = self.pool2(self.relu2(self.conv2(x)))
        return self.dequant(self.fc(x.flatten(1)))


def digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """sklearn's 8x8 digits, centred and scaled: (x_train, y_train, x_test, y_test)."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = (torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) - 5.0) / 6.0
    y = torch.tensor(data.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    half = len(x) // 2
    return x[order[:half]], y[order[:half]], x[order[half:]], y[order[half:]]


def global_batch(step: int, n: int) -> torch.Tensor:
    """The indexes of training step `step`'s global batch: each epoch a seeded order."""
    per_epoch = n // BATCH
    epoch, i = divmod(step, per_epoch)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(100 + epoch))
    return order[i * BATCH:(i + 1) * BATCH]


def qparams_digest(model: nn.Module, prefix: str) -> str:
    """A digest of every fake-quantize module's scale and zero point, by layer name."""
    h = hashlib.sha256()
    modules = sorted((m.session_name[len(prefix):], m) for m in model.modules()
                     if isinstance(m, RemoteFakeQuantize))
    for name, m in modules:
        h.update(name.encode() + m.scale.numpy().tobytes() + m.zero_point.numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default="qat-example/", help="the sessions' name prefix")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--checkpoint", default="qat_checkpoint.pt")
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--stop-after", type=int, default=None,
                        help="end the job after this step, as a preemption would")
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y, x_test, y_test = digits()

    torch.manual_seed(0)  # the same model on every rank
    model = fuse_modules_qat(DigitsCNN().train(), [["conv1", "relu1"], ["conv2", "relu2"]])
    model.qconfig = QConfig(
        activation=RemoteFakeQuantize.with_args(dtype=torch.quint8),
        weight=RemoteFakeQuantize.with_args(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric))
    model = prepare_qat(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    client = qparams.Client()  # $QPARAMS_TARGET
    # Names the sessions after the layers ("job42/conv1.output", "job42/fc.weight", ...)
    # and creates them; rank and world size come from torch.distributed.
    run = QATRun(client, model, args.prefix, lag=1)

    first = 0
    if os.path.exists(args.checkpoint):  # a restart: every rank loads the same file
        saved = torch.load(args.checkpoint)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        run.resume(saved["qat"])  # rank 0 resets the sessions, then a barrier
        first = saved["qat"]["next_step"]
        if rank == 0:
            print(f"resumed at step {first}")
    ddp = nn.parallel.DistributedDataParallel(model)

    total = args.epochs * (len(x) // BATCH)
    for s in range(first, total):
        if s > first and s % args.checkpoint_every == 0:
            # The end of step s-1: every rank contributes its ranges of s-1 and reads the
            # sessions' checkpoints; rank 0 saves them beside the model's state.
            qat_state = run.state_dict()
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "qat": qat_state}, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
        if args.stop_after is not None and s > args.stop_after:
            if rank == 0:
                print(f"stopped after step {args.stop_after}")
            dist.destroy_process_group()
            return
        run.step(s)  # this rank's one Step call of step s
        mine = global_batch(s, len(x)).chunk(world)[rank]
        loss = nn.functional.cross_entropy(ddp(x[mine]), y[mine])
        loss.backward()  # DDP averages the gradients over the ranks
        optimizer.step()
        optimizer.zero_grad()
    run.finish()  # the last step's ranges: the buffers hold the state after it

    if rank == 0:
        torch.backends.quantized.engine = "qnnpack"
        quantized = convert(copy.deepcopy(model).eval())
        with torch.no_grad():
            accuracy = (quantized(x_test).argmax(1) == y_test).float().mean().item()
        print(f"int8 accuracy {accuracy:.3f}, qparams {qparams_digest(model, args.prefix)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
