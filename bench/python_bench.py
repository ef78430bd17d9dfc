#!/usr/bin/env python3
"""The Python client's benchmark (issue 13), run by `make bench` (bench/run.sh).

Starts its own qparams-server on 127.0.0.1 (port 0, the port read from the server's
"listening on" log line), runs two scenarios against it, and stops it by PID:

calib    A calibration pass of a CPU model of 24 Linear(1024, 1024), batch 64, 50
         batches, each Linear's output observed per channel (qint8,
         per_channel_affine, ch_axis 1) by the observer torch.ao's eager `prepare`
         attaches for the model's qconfig: torch.ao's in-process
         PerChannelMinMaxObserver against qparams.torch.RemoteObserver
         (global_minmax), which reduces each activation to its per-channel min and max
         and queues that for the client's background thread, which sends the queue
         in ObserveBatch calls of up to 64. Each round runs both on
         fresh copies of the model (the remote one with fresh sessions: a new run
         prefix). The remote time includes the final flush: calculate_qparams() of
         every observer, which waits until every observation is acknowledged. Both
         must end with the same scales and zero points (global_minmax is
         PerChannelMinMaxObserver's rule, bit for bit); the script checks it. Target:
         remote <= 1.25x in-process. Also measured (on one more, untimed, pass): the
         serialized size of the ObserveRequests RemoteObserver queues against the raw
         activation's bytes and how many observations an ObserveBatch call carried;
         and for information the observers alone on precomputed activations. torch's
         GEMMs run on the BLAS libblas.so.3 points to: OpenBLAS after `make bench`
         (scripts/install-deps.sh bench), as a user's torch would; the reference BLAS
         is 20x slower and would hide the observers' cost.

observe  Observe of 64 float32 values, sequential unary calls: qparams.Client.observe
         (reduce="never") against the same RPC through a bare generated stub on the
         client's channel with a prebuilt ObserveRequest (no deadline, no metadata),
         and for information the default reduce="auto" (which sends the tensor's min
         and max). Target: the client >= 0.8x the stub's calls per second.

The sides take turns, round after round, the order rotating so that each goes first
equally often; every comparison reports the medians over the rounds and the median of
the per-round ratios. torch keeps its default intra-op thread count (printed). Output:
the figures for people, then one JSON object (also written to --json OUTPUT).

    PYTHONPATH=build/python /usr/bin/python3 bench/python_bench.py \\
        --server-binary=build/server/qparams-server --json=out.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np
import torch
from torch import nn
from torch.ao.quantization import PerChannelMinMaxObserver, QConfig, default_weight_observer
from torch.ao.quantization import prepare as ao_prepare

import qparams
from qparams.testing import LocalServer
from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc

REPO = pathlib.Path(__file__).resolve().parents[1]

CALIB_TARGET = 1.25   # remote time / in-process time, at most
OBSERVE_TARGET = 0.8  # client calls per second / bare stub's, at least


# --------------------------------------------------------------------------- helpers

def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def take_turns(rounds: int, sides: dict[str, Callable[[], float]],
               unit: str) -> dict[str, list[float]]:
    """Runs every side once per round, the order rotating from round to round (so
    that each goes first equally often and drift falls on all alike); returns each
    side's figures by round. Prints the figures of at most 20 rounds, evenly spread."""
    names = list(sides)
    figures: dict[str, list[float]] = {name: [] for name in names}
    shown = -(-rounds // 20)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            figures[name].append(sides[name]())
        if (r + 1) % shown == 0 or r + 1 == rounds:
            line = ", ".join(f"{name} {figures[name][-1]:.4g}" for name in names)
            print(f"  round {r + 1}/{rounds} ({unit}): {line}", flush=True)
    return figures


# --------------------------------------------------------------------------- calib

def make_model(layers: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers))).eval()


def observers(model: nn.Module) -> list[Any]:
    """The activation observers `prepare` attached, in module order."""
    return [m.activation_post_process for m in model.modules()
            if isinstance(m, nn.Linear) and hasattr(m, "activation_post_process")]


def prepared(model: nn.Module, activation: Any) -> nn.Module:
    """A copy of model with an activation observer on the output of every Linear, as
    torch.ao's eager-mode prepare attaches them for a qconfig on the model."""
    m = copy.deepcopy(model)
    m.qconfig = QConfig(activation=activation, weight=default_weight_observer)
    return ao_prepare(m, inplace=False)


def calibrate(model: nn.Module, batches: Sequence[torch.Tensor]) -> tuple[float, list]:
    """Seconds for the forward passes plus every observer's calculate_qparams()."""
    obs = observers(model)
    start = time.perf_counter()
    with torch.no_grad():
        for x in batches:
            model(x)
    results = [o.calculate_qparams() for o in obs]
    return time.perf_counter() - start, results


def same_qparams(a: list, b: list) -> tuple[bool, str]:
    """Whether two observers' (scale, zero_point) lists hold the same values, scales
    bit for bit (zero points compared as integers, whatever their integer dtype)."""
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} observers"
    for i, ((sa, za), (sb, zb)) in enumerate(zip(a, b)):
        if sa.dtype != sb.dtype or sa.shape != sb.shape or za.shape != zb.shape:
            return False, (f"layer {i}: scale {sa.dtype}{list(sa.shape)} vs "
                           f"{sb.dtype}{list(sb.shape)}, zero point {list(za.shape)} vs "
                           f"{list(zb.shape)}")
        if not torch.equal(sa.view(torch.int32), sb.view(torch.int32)):
            n = int((sa.view(torch.int32) != sb.view(torch.int32)).sum())
            return False, f"layer {i}: {n} of {sa.numel()} scales differ"
        if not torch.equal(za.to(torch.int64), zb.to(torch.int64)):
            n = int((za.to(torch.int64) != zb.to(torch.int64)).sum())
            return False, f"layer {i}: {n} of {za.numel()} zero points differ"
    return True, (f"all {len(a)} layers x {a[0][0].numel()} channels; zero point dtype "
                  f"{a[0][1].dtype} vs {b[0][1].dtype}")


def measure_sent(run: Callable[[], Any]) -> tuple[list[int], list[int]]:
    """While `run` runs: the serialized size of every ObserveRequest the background
    queues take, and the number of observations of every ObserveBatch call they make
    (qparams' ObserveQueue.submit and _send, wrapped for the duration)."""
    from qparams import _background
    sizes: list[int] = []
    batches: list[int] = []
    queue = _background.ObserveQueue
    submit, send = queue.submit, queue._send

    def counted_submit(self: Any, request: pb.ObserveRequest) -> Any:
        sizes.append(request.ByteSize())
        return submit(self, request)

    def counted_send(self: Any, batch: list) -> Any:
        batches.append(len(batch))
        return send(self, batch)

    queue.submit, queue._send = counted_submit, counted_send  # type: ignore[method-assign]
    try:
        run()
    finally:
        queue.submit, queue._send = submit, send  # type: ignore[method-assign]
    return sizes, batches


def observe_only(observers_: Sequence[Any], activations: Sequence[torch.Tensor]) -> float:
    """Seconds for the observers alone: every activation through every observer, then
    every calculate_qparams() (for the remote ones, after all are acknowledged)."""
    start = time.perf_counter()
    with torch.no_grad():
        for a in activations:
            for o in observers_:
                o(a)
    for o in observers_:
        o.calculate_qparams()
    return time.perf_counter() - start


def calib_scenario(target: str, args: argparse.Namespace) -> dict[str, Any]:
    from qparams.torch import RemoteObserver, name_observers, shared_client

    layers, width, batch = args.layers, args.width, args.batch_size
    model = make_model(layers, width)
    torch.manual_seed(1)
    batches = [torch.randn(batch, width) for _ in range(args.batches)]
    inprocess = PerChannelMinMaxObserver.with_args(
        dtype=torch.qint8, qscheme=torch.per_channel_affine, ch_axis=1)
    prefix = f"bench-{os.getpid()}-{int(time.time())}"
    serial = [0]

    def remote_args() -> tuple[Any, str]:
        serial[0] += 1
        run = f"{prefix}-{serial[0]}"  # fresh sessions every time
        return RemoteObserver.with_args(
            dtype=torch.qint8, qscheme=torch.per_channel_affine, ch_axis=1,
            calculator="global_minmax", target="activation", run=run, server=target), run

    def remote_model() -> nn.Module:
        observer, run = remote_args()
        m = prepared(model, observer)
        name_observers(m, run)
        return m

    print(f"== calib: {layers} x Linear({width}, {width}), batch {batch}, "
          f"{args.batches} batches, per-channel qint8 activations (ch_axis 1); "
          f"torch {torch.__version__}, {torch.get_num_threads()} intra-op thread(s) "
          f"(torch's default here)", flush=True)

    # Warm-up on one batch (not timed): torch's allocator and kernels, the channel and
    # the background thread.
    warm_batches = batches[:1]
    _, warm_in = calibrate(prepared(model, inprocess), warm_batches)
    _, warm_rm = calibrate(remote_model(), warm_batches)
    warm_match, _ = same_qparams(warm_in, warm_rm)

    last: dict[str, list] = {}

    def run_inprocess() -> float:
        m = prepared(model, inprocess)
        t, last["inprocess"] = calibrate(m, batches)
        return t

    def run_remote() -> float:
        t, last["remote"] = calibrate(remote_model(), batches)
        return t

    turns = take_turns(args.rounds, {"in-process": run_inprocess, "remote": run_remote},
                       "calibration pass, s")
    t_in, t_rm = turns["in-process"], turns["remote"]
    ratios = [r / i for i, r in zip(t_in, t_rm)]
    match, detail = same_qparams(last["inprocess"], last["remote"])

    # What RemoteObserver sent over one more pass (untimed: the counting costs time).
    sizes, calls = measure_sent(lambda: calibrate(remote_model(), batches))
    raw = batch * width * 4
    n = layers * args.batches
    if len(sizes) != n:
        print(f"  note: {len(sizes)} requests queued for one pass, {n} expected", flush=True)
    per_obs = median(sizes) if sizes else float("nan")

    # For information: the observers alone, without the model (its GEMMs dominate the
    # pass), on the first layer's activations, layers x batches observations again.
    with torch.no_grad():
        activations = [model[0](x) for x in batches]

    def only_inprocess() -> float:
        return observe_only([inprocess() for _ in range(layers)], activations)

    def only_remote() -> float:
        observer, run = remote_args()
        obs = [observer(name=f"{run}/only.{i}") for i in range(layers)]
        return observe_only(obs, activations)

    only_remote()  # warm-up
    turns = take_turns(args.rounds, {"in-process": only_inprocess, "remote": only_remote},
                       "observers alone, s")
    o_in, o_rm = turns["in-process"], turns["remote"]
    shared_client(target).close()

    result = {
        "calib_layers": layers, "calib_width": width, "calib_batch": batch,
        "calib_batches": args.batches, "calib_rounds": args.rounds,
        "torch_threads": torch.get_num_threads(),
        "calib_inprocess_s": round(median(t_in), 4),
        "calib_remote_s": round(median(t_rm), 4),
        "calib_ratio": round(median(ratios), 4),
        "calib_ratio_min": round(min(ratios), 4), "calib_ratio_max": round(max(ratios), 4),
        "calib_observations": n,
        "bytes_per_observation": int(per_obs),
        "raw_bytes_per_observation": raw,
        "bytes_ratio": round(per_obs / raw, 5),
        "observe_batch_calls": len(calls),
        "observations_per_batch_call": round(sum(calls) / len(calls), 1) if calls else 0,
        "calib_qparams_match": bool(match and warm_match),
        "observers_only_inprocess_s": round(median(o_in), 4),
        "observers_only_remote_s": round(median(o_rm), 4),
        "observers_only_ratio": round(median([r / i for i, r in zip(o_in, o_rm)]), 4),
        "observers_only_remote_us_per_observation": round(median(o_rm) / n * 1e6, 1),
        "observers_only_inprocess_us_per_observation": round(median(o_in) / n * 1e6, 1),
    }
    verdict = "met" if result["calib_ratio"] <= CALIB_TARGET else "MISSED"
    print(f"  in-process {result['calib_inprocess_s']:.3f} s, remote "
          f"{result['calib_remote_s']:.3f} s (medians of {args.rounds}); ratio "
          f"{result['calib_ratio']:.3f} (median of rounds, range "
          f"{result['calib_ratio_min']:.3f}..{result['calib_ratio_max']:.3f}), target "
          f"<= {CALIB_TARGET}: {verdict}", flush=True)
    print(f"  {n} observations per pass, {int(per_obs)} bytes each as sent vs {raw} raw "
          f"({raw / per_obs:.1f}x smaller), in {len(calls)} ObserveBatch calls "
          f"({result['observations_per_batch_call']} observations each on average)",
          flush=True)
    print(f"  scales and zero points, remote vs PerChannelMinMaxObserver: "
          f"{'match' if result['calib_qparams_match'] else 'DIFFER'} ({detail})", flush=True)
    print(f"  observers alone (information): in-process {result['observers_only_inprocess_s']:.3f}"
          f" s ({result['observers_only_inprocess_us_per_observation']:.0f} us/observation), "
          f"remote {result['observers_only_remote_s']:.3f} s "
          f"({result['observers_only_remote_us_per_observation']:.0f} us/observation), ratio "
          f"{result['observers_only_ratio']:.2f}", flush=True)
    return result


# --------------------------------------------------------------------------- observe

def observe_scenario(target: str, args: argparse.Namespace) -> dict[str, Any]:
    calls = args.calls
    prefix = f"bench-observe-{os.getpid()}-{int(time.time())}"
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    spec = dict(dtype="int8", granularity="per_tensor", target="weight")
    client = qparams.Client(target)
    # The bare stub on the client's own channel: one connection, so that both sides
    # reach the same server thread (two connections can differ by 5% on their own).
    stub = pb_grpc.QParamsServiceStub(client._channel)
    names = {k: f"{prefix}/{k}" for k in ("client", "stub", "auto")}
    for name in names.values():
        client.create_session(name, calculator="moving_average", **spec)
    request = pb.ObserveRequest(name=names["stub"], tensor=pb.Tensor(
        dtype=pb.FLOAT32, shape=list(x.shape), data=x.tobytes()))

    def via_client(reduce: str, name: str, n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            client.observe(name, x, reduce=reduce)
        return n / (time.perf_counter() - start)

    def via_stub(n: int) -> float:
        observe = stub.Observe
        start = time.perf_counter()
        for _ in range(n):
            observe(request)
        return n / (time.perf_counter() - start)

    rounds = args.observe_rounds
    print(f"== observe: 64 float32 values, sequential unary Observe calls, {calls} per "
          f"turn, {rounds} rounds", flush=True)
    warm = max(calls // 10, 20)
    via_client("never", names["client"], warm)
    via_client("auto", names["auto"], warm)
    via_stub(warm)

    turns = take_turns(rounds, {
        "client": lambda: via_client("never", names["client"], calls),
        "stub": lambda: via_stub(calls),
        "client auto": lambda: via_client("auto", names["auto"], calls)}, "calls/s")
    c_cps, s_cps, auto = turns["client"], turns["stub"], turns["client auto"]
    ratios = [c / s for c, s in zip(c_cps, s_cps)]
    auto_ratios = [a / s for a, s in zip(auto, s_cps)]
    # Each request was answered: the sessions counted every call.
    counts = {k: client.get_session(n).observation_count for k, n in names.items()}
    client.close()
    result = {
        "observe_calls": calls, "observe_rounds": rounds,
        "observe_client_cps": round(median(c_cps), 1),
        "observe_stub_cps": round(median(s_cps), 1),
        "observe_ratio": round(median(ratios), 4),
        "observe_ratio_min": round(min(ratios), 4), "observe_ratio_max": round(max(ratios), 4),
        "observe_auto_cps": round(median(auto), 1),
        "observe_auto_ratio": round(median(auto_ratios), 4),
        "observe_counts_ok": all(c == warm + calls * rounds for c in counts.values()),
    }
    verdict = "met" if result["observe_ratio"] >= OBSERVE_TARGET else "MISSED"
    print(f"  Client.observe(reduce=\"never\") {result['observe_client_cps']:.0f} calls/s, "
          f"bare stub {result['observe_stub_cps']:.0f} calls/s (medians); ratio "
          f"{result['observe_ratio']:.3f} (median of rounds, range "
          f"{result['observe_ratio_min']:.3f}..{result['observe_ratio_max']:.3f}), target "
          f">= {OBSERVE_TARGET}: {verdict}", flush=True)
    print(f"  Client.observe(reduce=\"auto\") {result['observe_auto_cps']:.0f} calls/s, "
          f"ratio {result['observe_auto_ratio']:.3f} (information)", flush=True)
    if not result["observe_counts_ok"]:
        print(f"  WARNING: observation counts {counts}", flush=True)
    return result


# --------------------------------------------------------------------------- main

def blas_library() -> str:
    """The BLAS this process's torch loaded (Debian's libblas.so.3 alternative)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "libblas.so" in path:
                return os.path.realpath(path)
    return "unknown"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-binary", default=str(REPO / "build/server/qparams-server"),
                   help="the qparams-server to start (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5,
                   help="calib: turns of each side (default 5)")
    p.add_argument("--observe-rounds", type=int, default=100,
                   help="observe: turns of each side (default 100)")
    p.add_argument("--batches", type=int, default=50, help="calibration batches (50)")
    p.add_argument("--batch-size", type=int, default=64, help="calibration batch (64)")
    p.add_argument("--layers", type=int, default=24, help="Linear layers (24)")
    p.add_argument("--width", type=int, default=1024, help="Linear features (1024)")
    p.add_argument("--calls", type=int, default=200,
                   help="observe: calls per turn (default 200: short turns pair the "
                   "sides closely in time on a machine whose speed drifts)")
    p.add_argument("--scenario", choices=("all", "calib", "observe"), default="all")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (ctest bench_smoke): 4 layers, 2 batches, 1 round, "
                   "100 calls per turn")
    p.add_argument("--json", metavar="OUTPUT", help="also write the JSON summary here")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.layers, args.rounds, args.observe_rounds, args.calls = 2, 4, 1, 1, 100
    for field in ("rounds", "observe_rounds", "batches", "batch_size", "layers", "width",
                  "calls"):
        if getattr(args, field) < 1:
            p.error(f"--{field.replace('_', '-')} must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        server = LocalServer(args.server_binary)
    except (FileNotFoundError, RuntimeError) as e:
        raise SystemExit(f"python_bench: {e}; build first or pass --server-binary")
    print(f"python_bench: qparams-server pid {server.process.pid} on {server.target}; "
          f"Python {sys.version.split()[0]}, grpcio {grpc.__version__}, "
          f"numpy {np.__version__}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), {os.cpu_count()} cores", flush=True)
    blas = blas_library()
    print(f"python_bench: torch's BLAS: {blas}", flush=True)
    summary: dict[str, Any] = {"quick": args.quick, "blas": blas}
    try:
        if args.scenario in ("all", "calib"):
            summary.update(calib_scenario(server.target, args))
        if args.scenario in ("all", "observe"):
            summary.update(observe_scenario(server.target, args))
    finally:
        status = server.stop()
    if status != 0:
        print(f"python_bench: qparams-server exited with {status}:\n{''.join(server.log)}",
              file=sys.stderr)
        return 1
    text = json.dumps(summary)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
