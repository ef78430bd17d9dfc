#!/usr/bin/env python3
"""The histogram calculators' Python-side benchmark (issue 24), run by `make bench`
(bench/run.sh) after core_bench, which writes the data this reads.

binning  torch's ways to histogram a 256 MiB float32 tensor, on the very bytes
         core_bench's binning benchmark bins (core_bench --histogram_data=PATH writes
         them, raw little-endian float32, and its histogram of them to PATH.json:
         64M N(0, 1) draws with 16 outliers of 20 to 35):
           - torch.histc as ModelOpt's HistogramCalibrator.collect calls it: x.abs(),
             its max, then torch.histc(x, bins=4096, min=0, max=amax) (float32 edges
             and counts);
           - torch.bincount as histogram.md 5.5's client does: aminmax of x, the
             canonical exponent e, then torch.bincount(floor(|x| * 2^-e).long(),
             minlength=M) (exact int64 counts), checked equal to the core's counts;
           - each of the two again with its temporaries written into buffers allocated
             once ("reused"): a fresh 256 MiB tensor costs about a second of page
             faults on this VM, which the calls as written pay every time;
           - for the bandwidth at the time, a read-and-sum of the same bytes in torch
             (x.sum()).
         Each figure is GB/s of the tensor's bytes, the median of --rounds turns taken
         in rotation. run.sh divides core_bench's binning GB/s by these (target: the
         core >= 3x torch.histc, held against the faster, reused-buffer histc). torch
         runs on as many intra-op threads as the machine has cores
         (torch.set_num_threads(os.cpu_count())), like core_bench's OpenMP.

client   Observe of a 16 MiB float32 tensor (4M N(0, 1) values) into an entropy session
         (num_bins 4096, omit_qparams): Client.observe(reduce="always"), which builds
         the histogram here (qparams.local_histogram, torch.bincount) and sends a
         HistogramObservation, against reduce="never", which sends the tensor whole.
         Reports the serialized ObserveRequest bytes of each and the seconds per
         observation (the call, local binning included), medians of --client-rounds
         turns; checks both sessions end with the same histogram. Information, no
         target. Starts its own qparams-server (--server-binary).

Output: the figures for people, then one JSON object (also written to --json OUTPUT).

    PYTHONPATH=build/python /usr/bin/python3 bench/histogram_bench.py \\
        --data=build/bench-results/histogram_data.f32 \\
        --server-binary=build/server/qparams-server --json=out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import qparams
from qparams.testing import LocalServer

REPO = pathlib.Path(__file__).resolve().parents[1]
NUM_BINS = 4096


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def take_turns(rounds: int, sides: dict[str, Callable[[], float]],
               unit: str) -> dict[str, list[float]]:
    """Runs every side once per round, the order rotating from round to round (so
    that each goes first equally often and drift falls on all alike); returns each
    side's figures by round."""
    names = list(sides)
    figures: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            figures[name].append(sides[name]())
        line = ", ".join(f"{name} {figures[name][-1]:.4g}" for name in names)
        print(f"  round {r + 1}/{rounds} ({unit}): {line}", flush=True)
    return figures


def canonical_exponent(amax: float, num_bins: int) -> int:
    """histogram.md 2.2 (frexp is exact)."""
    if amax == 0:
        return -126
    return max(-126, math.frexp(amax)[1] - (num_bins.bit_length() - 1))


# --------------------------------------------------------------------------- binning

def histc_modelopt(x: torch.Tensor) -> torch.Tensor:
    """ModelOpt's HistogramCalibrator.collect on a first batch: |x| in float32 (a new
    tensor), its max, torch.histc over [0, max] with float32 edges and counts."""
    a = x.float().abs()
    amax = a.max()
    return torch.histc(a, bins=NUM_BINS, min=0, max=float(amax))


def histc_reused(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    """The same with |x| written into a preallocated buffer: no page faults (a fresh
    256 MiB tensor costs about a second of them on this VM)."""
    torch.abs(x, out=buf)
    amax = buf.max()
    return torch.histc(buf, bins=NUM_BINS, min=0, max=float(amax))


def bincount_spec(x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """histogram.md 5.5's client: the canonical exponent of the finite values'
    largest magnitude, then bincount of floor(|x| * 2^-e) (exact int64 counts). x is
    finite here (the data has no NaN or infinity), so the isfinite filter is left out."""
    lo, hi = (float(v) for v in torch.aminmax(x))
    amax = max(abs(lo), abs(hi))
    e = canonical_exponent(amax, NUM_BINS)
    occupied = math.floor(math.ldexp(amax, -e)) + 1
    bins = x.abs().mul_(math.ldexp(1.0, -e)).floor_().long()
    return e, torch.bincount(bins, minlength=occupied)


def bincount_reused(x: torch.Tensor, buf: torch.Tensor, longs: torch.Tensor) -> torch.Tensor:
    """The same into preallocated buffers (float32 |x|·2^-e, then int64 bins)."""
    lo, hi = (float(v) for v in torch.aminmax(x))
    amax = max(abs(lo), abs(hi))
    e = canonical_exponent(amax, NUM_BINS)
    occupied = math.floor(math.ldexp(amax, -e)) + 1
    torch.abs(x, out=buf).mul_(math.ldexp(1.0, -e)).floor_()
    longs.copy_(buf)
    return torch.bincount(longs, minlength=occupied)


def read_and_sum(x: torch.Tensor) -> float:
    """Every byte read once: x.sum() (float32, vectorized; torch's int32 sum is not)."""
    return float(x.sum())


def timed_gbps(nbytes: int, fn: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        fn()
        return nbytes / (time.perf_counter() - start) / 1e9
    return run


def binning_scenario(args: argparse.Namespace) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if args.data:
        x = torch.from_numpy(np.fromfile(args.data, dtype="<f4"))
        meta_path = pathlib.Path(args.data + ".json")
        if meta_path.exists():
            meta = json.loads(meta_path.read_text())
        source = f"{args.data} (core_bench --histogram_data)"
    else:  # --quick without core_bench's data: a small tensor of the same kind
        g = torch.Generator().manual_seed(0)
        x = torch.randn(args.quick_elements, generator=g, dtype=torch.float32)
        x[:: max(1, x.numel() // 16)] *= 20
        source = f"{x.numel()} N(0, 1) values generated here (--quick)"
    nbytes = x.numel() * 4
    print(f"== binning: {x.numel()} float32 values, {nbytes / 2**20:.0f} MiB, {source}; "
          f"{NUM_BINS} bins; torch threads {torch.get_num_threads()}", flush=True)

    # Correctness, untimed: the spec's bincount equals the core's histogram.
    e, counts = bincount_spec(x)
    result: dict[str, Any] = {"binning_elements": x.numel(), "binning_bytes": nbytes,
                              "torch_threads": torch.get_num_threads(),
                              "binning_exponent": e}
    if "counts" in meta:
        result["bincount_matches_core"] = (
            e == meta["exponent"] and counts.tolist() == meta["counts"])
        print(f"  torch.bincount histogram equals the core's (exponent {e}, "
              f"{len(meta['counts'])} bins): {result['bincount_matches_core']}", flush=True)
    buf, longs = torch.empty_like(x), torch.empty(x.numel(), dtype=torch.int64)
    assert torch.equal(bincount_reused(x, buf, longs), counts)
    histc_reused(x, buf)
    read_and_sum(x)

    turns = take_turns(args.rounds, {
        "read-and-sum": timed_gbps(nbytes, lambda: read_and_sum(x)),
        "histc": timed_gbps(nbytes, lambda: histc_modelopt(x)),
        "histc reused": timed_gbps(nbytes, lambda: histc_reused(x, buf)),
        "bincount": timed_gbps(nbytes, lambda: bincount_spec(x)),
        "bincount reused": timed_gbps(nbytes, lambda: bincount_reused(x, buf, longs)),
    }, "GB/s")
    result.update({
        "binning_rounds": args.rounds,
        "torch_read_gbps": round(median(turns["read-and-sum"]), 3),
        "torch_histc_gbps": round(median(turns["histc"]), 3),
        "torch_histc_reused_gbps": round(median(turns["histc reused"]), 3),
        "torch_bincount_gbps": round(median(turns["bincount"]), 3),
        "torch_bincount_reused_gbps": round(median(turns["bincount reused"]), 3),
    })
    print(f"  medians (GB/s): torch read-and-sum {result['torch_read_gbps']}; histc as "
          f"ModelOpt calls it {result['torch_histc_gbps']}, into a reused |x| buffer "
          f"{result['torch_histc_reused_gbps']}; the spec's bincount "
          f"{result['torch_bincount_gbps']}, into reused buffers "
          f"{result['torch_bincount_reused_gbps']}", flush=True)
    return result


# --------------------------------------------------------------------------- client

def client_scenario(target: str, args: argparse.Namespace) -> dict[str, Any]:
    elements = args.client_elements
    x = torch.randn(elements, generator=torch.Generator().manual_seed(1), dtype=torch.float32)
    prefix = f"bench-histogram-{os.getpid()}-{int(time.time())}"
    names = {r: f"{prefix}/{r}" for r in ("always", "never")}
    print(f"== client: Observe of {elements} float32 values ({elements * 4 / 2**20:.0f} MiB) "
          f"into entropy sessions ({NUM_BINS} bins, omit_qparams), sequential", flush=True)
    client = qparams.Client(target)
    try:
        for name in names.values():
            client.create_session(name, calculator="entropy", dtype="int8",
                                  target="activation", histogram={"num_bins": NUM_BINS})

        # The bytes each sends, untimed: the ObserveRequests observe builds (counted on
        # the client's own call path).
        sent: dict[str, int] = {}
        call = client._call

        def counting_call(method: str, request: Any, *a: Any, **k: Any) -> Any:
            if method == "Observe":
                sent[request.name] = request.ByteSize()
                sent[request.name + ":kind"] = request.WhichOneof("observation")
            return call(method, request, *a, **k)

        client._call = counting_call  # type: ignore[method-assign]
        try:
            for reduce, name in names.items():
                client.observe(name, x, reduce=reduce, omit_qparams=True)
        finally:
            client._call = call  # type: ignore[method-assign]

        def observe(reduce: str) -> Callable[[], float]:
            def run() -> float:
                start = time.perf_counter()
                client.observe(names[reduce], x, reduce=reduce, omit_qparams=True)
                return time.perf_counter() - start
            return run

        turns = take_turns(args.client_rounds, {r: observe(r) for r in names}, "s")
        h = {r: client.get_histogram(n) for r, n in names.items()}
        same = (h["always"].exponent == h["never"].exponent
                and np.array_equal(h["always"].counts, h["never"].counts)
                and h["always"].min == h["never"].min and h["always"].max == h["never"].max)
        # The local histogram alone, for information (torch.bincount on the CPU).
        local = [timed_local(x) for _ in range(max(3, args.client_rounds // 2))]
    finally:
        for name in names.values():
            try:
                client.delete_session(name)
            except qparams.QParamsError:
                pass
        client.close()
    result = {
        "client_elements": elements, "client_tensor_bytes": elements * 4,
        "client_rounds": args.client_rounds,
        "client_always_kind": sent[names["always"] + ":kind"],
        "client_never_kind": sent[names["never"] + ":kind"],
        "client_always_request_bytes": sent[names["always"]],
        "client_never_request_bytes": sent[names["never"]],
        "client_always_ms": round(1e3 * median(turns["always"]), 2),
        "client_never_ms": round(1e3 * median(turns["never"]), 2),
        "client_local_histogram_ms": round(1e3 * median(local), 2),
        "client_histograms_equal": same,
    }
    result["client_bytes_ratio"] = round(
        result["client_never_request_bytes"] / result["client_always_request_bytes"], 1)
    result["client_time_ratio"] = round(result["client_never_ms"] / result["client_always_ms"], 3)
    print(f"  reduce=\"always\" ({result['client_always_kind']}): "
          f"{result['client_always_request_bytes']} bytes, {result['client_always_ms']} ms "
          f"(local_histogram alone {result['client_local_histogram_ms']} ms); "
          f"reduce=\"never\" ({result['client_never_kind']}): "
          f"{result['client_never_request_bytes']} bytes, {result['client_never_ms']} ms; "
          f"histograms equal: {same}", flush=True)
    return result


def timed_local(x: torch.Tensor) -> float:
    start = time.perf_counter()
    qparams.local_histogram(x, NUM_BINS).to_proto()
    return time.perf_counter() - start


# --------------------------------------------------------------------------- main

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="core_bench --histogram_data's file (binning); without "
                   "it, --quick generates a small tensor")
    p.add_argument("--server-binary", default=str(REPO / "build/server/qparams-server"),
                   help="the qparams-server to start (client; default: %(default)s)")
    p.add_argument("--rounds", type=int, default=5, help="binning: turns of each side (5)")
    p.add_argument("--client-rounds", type=int, default=10,
                   help="client: turns of each side (10)")
    p.add_argument("--client-elements", type=int, default=(16 << 20) // 4,
                   help="client: float32 values of the tensor (4M: 16 MiB)")
    p.add_argument("--scenario", choices=("all", "binning", "client"), default="all")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (ctest bench_smoke): 1 round each, 1M values generated "
                   "here unless --data, a 1 MiB client tensor")
    p.add_argument("--json", metavar="OUTPUT", help="also write the JSON summary here")
    args = p.parse_args(argv)
    args.quick_elements = 1 << 20
    if args.quick:
        args.rounds, args.client_rounds, args.client_elements = 1, 1, 1 << 18
    elif args.scenario in ("all", "binning") and not args.data:
        p.error("--data is needed (core_bench --histogram_data=PATH writes it), or --quick")
    for field in ("rounds", "client_rounds", "client_elements"):
        if getattr(args, field) < 1:
            p.error(f"--{field.replace('_', '-')} must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"histogram_bench: torch {torch.__version__}, {torch.get_num_threads()} intra-op "
          f"threads (set to the {os.cpu_count()} cores), numpy {np.__version__}", flush=True)
    summary: dict[str, Any] = {"quick": args.quick}
    if args.scenario in ("all", "binning"):
        summary.update(binning_scenario(args))
    if args.scenario in ("all", "client"):
        try:
            server = LocalServer(args.server_binary)
        except (FileNotFoundError, RuntimeError) as e:
            raise SystemExit(f"histogram_bench: {e}; build first or pass --server-binary")
        try:
            summary.update(client_scenario(server.target, args))
        finally:
            status = server.stop()
        if status != 0:
            print(f"histogram_bench: qparams-server exited with {status}:\n"
                  f"{''.join(server.log)}", file=sys.stderr)
            return 1
    text = json.dumps(summary)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
