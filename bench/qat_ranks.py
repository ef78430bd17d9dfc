"""The rank side of bench/qat_bench.py: each of the W ranks (a process torch.multiprocessing
spawns) builds one trainer per variant on the same seeded model and batches, trains
them in turns and writes its measurements to rank<r>.json, which qat_bench.py
summarizes. Everything torch is imported inside the rank processes and the functions
they run.
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pathlib
import pstats
import statistics
import time
import warnings
from collections.abc import Sequence
from typing import Any

WORLD = 2
BATCH = 64            # global; BATCH / WORLD a rank
SEED = 0
# Model: (input side, stages of (in channels, out channels, convs), hidden Linear or 0).
SHAPES = {
    "digits": (8, ((1, 8, 1), (8, 16, 1)), 0),          # tests/python/qat_digits.py's CNN
    "cnn": (32, ((1, 16, 1), (16, 32, 1), (32, 64, 1)), 128),
    "deep": (32, ((1, 16, 2), (16, 32, 2), (32, 64, 2)), 128),
}
PROFILE_STEPS = 30


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def build_model(kind: str) -> Any:
    import torch.nn as nn
    from torch.ao.quantization import DeQuantStub, QuantStub

    def stage(cin: int, cout: int, convs: int, index: int) -> tuple[list[tuple[str, Any]],
                                                                      list[list[str]]]:
        layers, fuse = [], []
        for k in range(convs):
            name = f"conv{index}_{k}"
            layers += [(name, nn.Conv2d(cin if k == 0 else cout, cout, 3, padding=1)),
                       (f"relu{index}_{k}", nn.ReLU())]
            fuse.append([name, f"relu{index}_{k}"])
        layers.append((f"pool{index}", nn.MaxPool2d(2)))
        return layers, fuse

    size, stages, hidden = SHAPES[kind]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.quant = QuantStub()
            self.fuse_groups: list[list[str]] = []
            names = []
            for i, (cin, cout, convs) in enumerate(stages):
                layers, fuse = stage(cin, cout, convs, i + 1)
                for name, module in layers:
                    self.add_module(name, module)
                    names.append(name)
                self.fuse_groups += fuse
            self.features = names
            flat = stages[-1][1] * (size >> len(stages)) ** 2
            self.head = nn.Sequential()
            if hidden:
                self.head = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(),
                                          nn.Linear(hidden, 10))
                self.fuse_groups.append(["head.0", "head.1"])
            else:
                self.head = nn.Sequential(nn.Linear(flat, 10))
            self.dequant = DeQuantStub()

        def forward(self, x: Any) -> Any:
            x = self.quant(x)
            for name in self.features:
                x = getattr(self, name)(x)
            return self.dequant(self.head(x.flatten(1)))

    return Net()


def prepared(kind: str, variant: str) -> Any:
    """The model (seeded: the same weights for every variant and rank), fused and
    prepared for QAT with the variant's qconfig."""
    import torch
    from torch.ao.quantization import (QConfig, default_qat_qconfig, fuse_modules_qat,
                                       get_default_qat_qconfig, prepare_qat)

    from qparams.torch import RemoteFakeQuantize
    torch.manual_seed(SEED)
    model = build_model(kind).train()
    model = fuse_modules_qat(model, model.fuse_groups)
    if variant == "remote":
        model.qconfig = QConfig(
            activation=RemoteFakeQuantize.with_args(dtype=torch.quint8),
            weight=RemoteFakeQuantize.with_args(dtype=torch.qint8,
                                                qscheme=torch.per_tensor_symmetric))
    elif variant == "torch":
        model.qconfig = get_default_qat_qconfig("qnnpack")
    else:
        model.qconfig = default_qat_qconfig
    return prepare_qat(model)


def rank_batches(rank: int, steps: int, size: int) -> list[tuple[Any, Any]]:
    """This rank's half of every step's global batch: sklearn's digits, centred and
    scaled, upsampled to size x size; each epoch a seeded order."""
    import torch
    from sklearn.datasets import load_digits
    data = load_digits()
    x = (torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) - 5.0) / 6.0
    if size != x.shape[-1]:
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear",
                                            align_corners=False).contiguous()
    y = torch.tensor(data.target, dtype=torch.long)
    per_epoch = len(x) // BATCH
    out = []
    for s in range(steps):
        epoch, i = divmod(s, per_epoch)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(100 + epoch))
        mine = order[i * BATCH:(i + 1) * BATCH].chunk(WORLD)[rank]
        out.append((x[mine].contiguous(), y[mine].contiguous()))
    return out


class Counter:
    """Counts every call through a qparams.Client's service stub (by method) and every
    Client.step invocation, and times each Step RPC (the blocking call to one replica,
    or from the stub's future() to its result() when split), with the request's
    serialized size."""

    def __init__(self, client: Any) -> None:
        self.calls: dict[str, int] = {}
        self.step_invocations = 0
        self.step_bytes: list[int] = []
        self.rpc: list[tuple[float, float]] = []  # (start, end) of each Step RPC
        stub = client._stub
        for method in list(vars(stub)):
            setattr(stub, method, _Counted(method, getattr(stub, method), self))
        step = client.step

        def counted_step(*a: Any, **k: Any) -> Any:
            self.step_invocations += 1
            return step(*a, **k)

        client.step = counted_step

    def _count(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1

    def reset(self) -> None:
        self.calls, self.step_invocations, self.step_bytes, self.rpc = {}, 0, [], []


class _Counted:
    """A stub's multicallable, counted (and a Step call's future timed)."""

    def __init__(self, name: str, inner: Any, counter: Counter) -> None:
        self.name, self.inner, self.counter = name, inner, counter

    def __call__(self, request: Any, *a: Any, **k: Any) -> Any:
        self.counter._count(self.name)
        if self.name != "Step":
            return self.inner(request, *a, **k)
        start = time.perf_counter()  # Client.step's call to one replica: blocking
        self.counter.step_bytes.append(request.ByteSize())
        try:
            return self.inner(request, *a, **k)
        finally:
            self.counter.rpc.append((start, time.perf_counter()))

    def with_call(self, request: Any, *a: Any, **k: Any) -> Any:
        self.counter._count(self.name)
        return self.inner.with_call(request, *a, **k)

    def future(self, request: Any, *a: Any, **k: Any) -> Any:
        self.counter._count(self.name)
        if self.name != "Step":
            return self.inner.future(request, *a, **k)
        start = time.perf_counter()
        self.counter.step_bytes.append(request.ByteSize())
        return _TimedFuture(self.inner.future(request, *a, **k), start, self.counter)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)


class _TimedFuture:
    def __init__(self, future: Any, start: float, counter: Counter) -> None:
        self._future, self._start, self._counter = future, start, counter

    def result(self, *a: Any, **k: Any) -> Any:
        try:
            return self._future.result(*a, **k)
        finally:
            self._counter.rpc.append((self._start, time.perf_counter()))

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._future, attr)


def cpu_seconds(pid: int) -> float:
    """The CPU seconds (user + system) process `pid` has run, from /proc (0 without)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Trainer:
    """One variant's training on one rank: its model (seeded, the same initial weights
    for every variant), SGD, DDP and, for the remote variants, its QATRun; trained in
    blocks of steps that continue from block to block."""

    def __init__(self, kind: str, variant: str, client: Any, prefix: str) -> None:
        import torch
        import torch.nn as nn

        from qparams.torch import QATRun
        self.variant = variant
        base = variant.removesuffix("-nobb")
        self.model = prepared(kind, base)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.run = QATRun(client, self.model, prefix, lag=1) if base == "remote" else None
        self.ddp = nn.parallel.DistributedDataParallel(
            self.model, broadcast_buffers=not variant.endswith("-nobb"))
        self.loss_fn = nn.CrossEntropyLoss()
        self.s = 0  # the next step
        self.modules = ((len(self.run.activations), len(self.run.weights))
                        if self.run is not None else None)

    def block(self, n: int, data: list[tuple[Any, Any]], counter: Counter, server_pid: int,
              profile: cProfile.Profile | None = None) -> dict[str, Any]:
        """n training steps; each one's phase boundaries (monotonic clock), its Step
        RPC's (start, end), the RPCs made, the CPU time of this rank and the server."""
        import torch.distributed as dist
        dist.barrier()
        counter.reset()
        server_cpu, process_cpu = cpu_seconds(server_pid), time.process_time()
        marks: list[tuple[float, ...]] = []
        rpcs: list[tuple[float, float]] = []
        if profile is not None:
            profile.enable()
        for _ in range(n):
            x, y = data[self.s]
            t0 = time.perf_counter()
            if self.run is not None:
                self.run.step(self.s)
            t1 = time.perf_counter()
            loss = self.loss_fn(self.ddp(x), y)
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            self.optimizer.step()
            self.optimizer.zero_grad()
            t4 = time.perf_counter()
            marks.append((t0, t1, t2, t3, t4))
            rpcs.append(counter.rpc[-1] if self.run is not None and counter.rpc else (t0, t0))
            self.s += 1
        if profile is not None:
            profile.disable()
        return {"marks": marks, "rpcs": rpcs, "calls": dict(counter.calls),
                "step_invocations": counter.step_invocations,
                "server_cpu": cpu_seconds(server_pid) - server_cpu,
                "process_cpu": time.process_time() - process_cpu,
                "step_bytes": median(counter.step_bytes) if counter.step_bytes else 0,
                "loss": float(loss), "modules": self.modules}

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()  # after the last step: not a training step, not counted


def rank_main(rank: int, store: str, target: str, server_pid: int, out: str, models: list[str],
              variants: list[str], rounds: int, warmup: int, steps: int,
              profile: bool) -> None:
    import torch
    import torch.distributed as dist

    import qparams
    warnings.filterwarnings("ignore", message="RemoteFakeQuantize")
    warnings.filterwarnings("ignore", category=UserWarning, module="torch.ao")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD)
    results: dict[str, Any] = {"turns": [], "profiles": {}}
    client = qparams.Client(target)
    counter = Counter(client)
    # The floor of an RPC's round trip here: sequential Health.Check calls, rank 0 alone.
    rtt: list[float] = []
    if rank == 0:
        for _ in range(300):
            t = time.perf_counter()
            client.health()
            rtt.append(time.perf_counter() - t)
    results["health_rtt"] = median(rtt[50:]) if rtt else 0.0
    # The same after 20 ms idle (as a Step call comes after a step's compute), through
    # future(), as Client.step calls: the threads that carry the call wake up first.
    cold: list[float] = []
    if rank == 0:
        from qparams._health.v1 import health_pb2
        request = health_pb2.HealthCheckRequest()
        for _ in range(60):
            time.sleep(0.02)
            t = time.perf_counter()
            client._health.Check.future(request, timeout=10).result()
            cold.append(time.perf_counter() - t)
    results["health_cold_rtt"] = median(cold[10:]) if cold else 0.0
    dist.barrier()
    for kind in models:
        data = rank_batches(rank, warmup + rounds * steps + (PROFILE_STEPS if profile else 0),
                            SHAPES[kind][0])
        trainers = {v: Trainer(kind, v, client, f"{kind}-{i}/") for i, v in enumerate(variants)}
        for trainer in trainers.values():
            trainer.block(warmup, data, counter, server_pid)  # untimed
        for r in range(rounds):
            k = r % len(variants)
            for variant in variants[k:] + variants[:k]:
                t = trainers[variant].block(steps, data, counter, server_pid)
                t.update(model=kind, variant=variant, round=r)
                results["turns"].append(t)
            if rank == 0 and (r + 1) % max(1, rounds // 5) == 0:
                shown = [t for t in results["turns"][-len(variants):]]
                print(f"  {kind} round {r + 1}/{rounds}: " + ", ".join(
                    f"{t['variant']} {median([m[4] - m[0] for m in t['marks']]) * 1e3:.2f}"
                    for t in sorted(shown, key=lambda t: variants.index(t["variant"])))
                    + " ms/step", flush=True)
        if profile:
            for variant in variants:
                prof = cProfile.Profile() if rank == 0 else None
                trainers[variant].block(PROFILE_STEPS, data, counter, server_pid, prof)
                if prof is not None:
                    text = io.StringIO()
                    stats = pstats.Stats(prof, stream=text)
                    stats.sort_stats("tottime").print_stats(15)
                    stats.sort_stats("cumulative").print_stats(
                        "qparams|distributed.py|fake_quant|_qat_run", 25)
                    results["profiles"][f"{kind}/{variant}"] = text.getvalue()
        for trainer in trainers.values():
            trainer.finish()
    client.close()
    pathlib.Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()

