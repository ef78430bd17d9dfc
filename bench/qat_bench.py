#!/usr/bin/env python3
"""QAT training with RemoteFakeQuantize against torch.ao's local fake-quantize
(docs/qat.md, "Training with RemoteFakeQuantize"), measured: the issue's targets are
a training step with RemoteFakeQuantize at L = 1, W = 2 of at most 1.10x the step with
torch.ao's fake-quantize on the same model, and one RPC per rank per step.

Starts its own qparams-server on 127.0.0.1 (port 0; stopped by PID), then spawns
W = 2 ranks (torch.multiprocessing, gloo over a FileStore, torch.set_num_threads(1)
each: one core a rank on the 2-core VM). For each model, every rank builds one
trainer per variant: the same model (seeded), the same batches, DistributedDataParallel
with its defaults (broadcast_buffers=True), SGD (lr 0.05, momentum 0.9):

torch        torch.ao's default QAT qconfig, get_default_qat_qconfig("qnnpack"):
             FusedMovingAvgObsFakeQuantize (one fused C++ observe + fake-quantize op),
             per-tensor affine quint8 activations, per-tensor symmetric qint8 weights;
             each rank its own statistics (DDP broadcasts rank 0's buffers).
torch-fq     (information) torch.ao's classic default_qat_qconfig: FakeQuantize and a
             MovingAverageMinMaxObserver (calculate_qparams in Python every forward).
remote       RemoteFakeQuantize, the same dtypes and qschemes (moving_average, constant
             0.01), QATRun at lag 1: one Client.step call per rank at the start of
             every step, as docs/qat.md shows.
torch-nobb,  (information, --variants) the same with DDP(broadcast_buffers=False):
remote-nobb  RemoteFakeQuantize's buffers are the same bits on every rank already.

Each trainer first takes WARMUP untimed steps (the first steps of a remote run
fake-quantize no activation yet), then the trainers take turns of STEPS timed steps,
ROUNDS rounds, the order rotating, each trainer continuing its own training: short
turns, so that the VM's drift and other processes' load fall on all alike.
Reported per model: each variant's median step time (run.step + forward + loss +
backward + optimizer step; rank 0's, rank 1's beside it) and its phases; the ratio
remote / torch (the median of the per-round ratios of the turns' medians; target
<= 1.10); inside run.step: building the request, the Step RPC (from the stub's
future() to its result()) and setting the buffers, and of the RPC the wait for the
other rank's call (both ranks' monotonic clocks), beside a Health.Check round trip
back to back and after 20 ms idle; the CPU a step of rank 0 and of the server; and
the RPCs per rank per timed step, counted exactly: every call through the client's
service stub (Step, GetTopology, ...; the calls of QATRun.finish after the last step
are not a step's), beside the Client.step invocations, and the Step request's size.

Models (sklearn's digits, global batch 64, 32 a rank; ReLUs fused into the layer
before them, as fuse_modules_qat does):
digits   (information: the smallest) tests/python/qat_digits.py's CNN on the 8x8
         images: Conv(1, 8), Conv(8, 16), each + ReLU + MaxPool, Linear(64, 10):
         4 activation + 3 weight fake-quantize modules.
cnn      the digits upsampled to 32x32: 3 x (Conv3x3 + ReLU + MaxPool) of 16, 32, 64
         channels, Linear(1024, 128) + ReLU, Linear(128, 10): 6 + 5 modules.
deep     the same with two convs a stage (16, 16, 32, 32, 64, 64): 9 + 8 modules.

    PYTHONPATH=build/python /usr/bin/python3 bench/qat_bench.py \\
        --server=build/server/qparams-server --json=out.json

--profile trains 30 more (untimed) steps of each variant under cProfile on rank 0
and prints its top functions. The machine's load average is printed before and after;
with a 1-minute load above --max-load the script waits up to --wait seconds first.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

# The rank processes' side, beside this file (sys.path[0] when run as a script).
from qat_ranks import BATCH, SHAPES, WORLD, median, rank_main

REPO = pathlib.Path(__file__).resolve().parents[1]

TARGET_RATIO = 1.10   # remote step time / torch.ao's, at most
TARGET_RPCS = 1.0     # RPCs per rank per step
VARIANTS = ("torch", "torch-fq", "remote", "torch-nobb", "remote-nobb")
DEFAULT_VARIANTS = ("torch", "torch-fq", "remote")
# The ratios reported: (remote variant, baseline); the first is the target's.
PAIRS = (("remote", "torch"), ("remote", "torch-fq"), ("remote-nobb", "torch-nobb"),
         ("remote-nobb", "torch"))
LABELS = {"torch": "torch.ao default (FusedMovingAvgObsFakeQuantize)",
          "torch-fq": "torch.ao FakeQuantize (default_qat_qconfig)",
          "torch-nobb": "torch.ao default, broadcast_buffers=False",
          "remote": "RemoteFakeQuantize", "remote-nobb": "RemoteFakeQuantize, "
          "broadcast_buffers=False"}
MODELS = tuple(SHAPES)
DEFAULT_MODELS = ("digits", "cnn", "deep")


# --------------------------------------------------------------------------- report

def summarize(ranks: list[dict[str, Any]], models: list[str], variants: list[str],
              rounds: int, steps: int) -> dict[str, Any]:
    """The figures of every model from both ranks' turns."""
    out: dict[str, Any] = {}
    for kind in models:
        turns = [[t for t in r["turns"] if t["model"] == kind] for r in ranks]
        per: dict[str, Any] = {}
        for variant in variants:
            mine = [[t for t in rt if t["variant"] == variant] for rt in turns]
            steps0 = [m[4] - m[0] for t in mine[0] for m in t["marks"]]
            n0 = len(steps0)
            steps1 = [m[4] - m[0] for t in mine[1] for m in t["marks"]]
            wall = [(t["marks"][-1][4] - t["marks"][0][0]) / len(t["marks"]) for t in mine[0]]
            phase = {
                "run_step": [m[1] - m[0] for t in mine[0] for m in t["marks"]],
                "forward": [m[2] - m[1] for t in mine[0] for m in t["marks"]],
                "backward": [m[3] - m[2] for t in mine[0] for m in t["marks"]],
                "optimizer": [m[4] - m[3] for t in mine[0] for m in t["marks"]],
            }
            entry: dict[str, Any] = {
                "step_ms": median(steps0) * 1e3, "step_ms_rank1": median(steps1) * 1e3,
                "mean_step_ms": median(wall) * 1e3,
                "by_round_ms": [median([m[4] - m[0] for m in t["marks"]]) * 1e3
                                for t in mine[0]],
                # CPU per step over all the variant's timed steps: the server's
                # (/proc, measured by rank 0), rank 0's own (all its threads).
                "server_cpu_ms": sum(t["server_cpu"] for t in mine[0]) / n0 * 1e3,
                "rank_cpu_ms": sum(t["process_cpu"] for t in mine[0]) / n0 * 1e3,
                **{f"{k}_ms": median(v) * 1e3 for k, v in phase.items()},
            }
            if variant.startswith("remote"):
                # Inside run.step, and the Step RPC's wait for the other rank: rank r's
                # RPC of step i starts at a_r; the server can answer once both arrived.
                prep, rpc, post, service, skew = [], [], [], [], []
                wait: list[list[float]] = [[], []]
                for t0, t1 in zip(mine[0], mine[1]):
                    for m, (a0, e0), (a1, _) in zip(t0["marks"], t0["rpcs"], t1["rpcs"]):
                        prep.append(a0 - m[0])
                        rpc.append(e0 - a0)
                        post.append(m[1] - e0)
                        wait[0].append(max(0.0, a1 - a0))
                        wait[1].append(max(0.0, a0 - a1))
                        skew.append(abs(a1 - a0))
                        service.append(e0 - max(a0, a1))
                calls: dict[str, int] = {}
                invocations = 0
                for rt in mine:
                    for t in rt:
                        invocations += t["step_invocations"]
                        for method, n in t["calls"].items():
                            calls[method] = calls.get(method, 0) + n
                rank_steps = WORLD * sum(len(t["marks"]) for t in mine[0])
                entry.update({
                    "prep_ms": median(prep) * 1e3, "rpc_ms": median(rpc) * 1e3,
                    "post_ms": median(post) * 1e3,
                    "wait_for_other_rank_ms": median(wait[0]) * 1e3,
                    "wait_for_other_rank_mean_ms": statistics.fmean(wait[0]) * 1e3,
                    "rank1_wait_for_rank0_mean_ms": statistics.fmean(wait[1]) * 1e3,
                    "arrival_skew_ms": median(skew) * 1e3,
                    "rpc_after_both_arrived_ms": median(service) * 1e3,
                    "rpcs_per_rank_step": sum(calls.values()) / rank_steps,
                    "step_rpcs_per_rank_step": calls.get("Step", 0) / rank_steps,
                    "client_step_calls_per_rank_step": invocations / rank_steps,
                    "rpcs_by_method": calls, "rank_steps": rank_steps,
                    "step_request_bytes": mine[0][0]["step_bytes"],
                    "activations": mine[0][0]["modules"][0],
                    "weights": mine[0][0]["modules"][1],
                })
            else:
                calls = {}
                for rt in mine:
                    for t in rt:
                        for method, n in t["calls"].items():
                            calls[method] = calls.get(method, 0) + n
                entry["rpcs"] = sum(calls.values())
            per[variant] = entry
        ratios = {}
        for remote, base in PAIRS:
            if remote in per and base in per:
                by_round = [r / b for r, b in zip(per[remote]["by_round_ms"],
                                                  per[base]["by_round_ms"])]
                ratios[f"{remote}/{base}"] = {
                    "ratio": median(by_round), "min": min(by_round), "max": max(by_round),
                    "ratio_of_medians": per[remote]["step_ms"] / per[base]["step_ms"]}
        out[kind] = {"variants": per, "ratios": ratios,
                     "health_rtt_ms": ranks[0]["health_rtt"] * 1e3,
                     "health_cold_rtt_ms": ranks[0]["health_cold_rtt"] * 1e3}
    return out


def load() -> tuple[float, float, float]:
    return os.getloadavg()


def busy_seconds() -> float:
    """CPU seconds every process on the machine has run (user, nice, system, irq,
    softirq, steal of /proc/stat), 0 where there is no /proc."""
    try:
        fields = pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds of this process and its waited-for children (the ranks, the server)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def busy_others() -> str:
    """The few processes using the most CPU right now (ps), for the record."""
    try:
        import subprocess
        text = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu"], capture_output=True,
                              text=True, timeout=5).stdout.splitlines()[1:5]
        return "; ".join(" ".join(line.split()) for line in text)
    except Exception:  # noqa: BLE001 - information only
        return "?"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", "--server-binary", dest="server",
                   default=str(REPO / "build/server/qparams-server"),
                   help="the qparams-server to start (default: %(default)s)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help=f"comma-separated, of {', '.join(MODELS)} (default: "
                   f"{','.join(DEFAULT_MODELS)})")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help=f"comma-separated, of {', '.join(VARIANTS)} (default: "
                   f"{','.join(DEFAULT_VARIANTS)}; -nobb: DDP(broadcast_buffers=False))")
    p.add_argument("--rounds", type=int, default=30, help="turns of each variant (30)")
    p.add_argument("--steps", type=int, default=6, help="timed steps a turn (6)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed steps of each variant before the first round (5)")
    p.add_argument("--max-load", type=float, default=1.5,
                   help="wait while the 1-minute load average is above this (1.5)")
    p.add_argument("--wait", type=float, default=60.0,
                   help="at most this many seconds (60)")
    p.add_argument("--profile", action="store_true",
                   help="one more turn of each variant under cProfile on rank 0")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: the cnn model, 2 rounds of 3 steps after 3")
    p.add_argument("--json", metavar="OUTPUT", help="also write the JSON summary here")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.rounds, args.warmup, args.steps, args.wait = "cnn", 2, 3, 3, 0.0
    args.models = [m for m in args.models.split(",") if m]
    args.variants = [v for v in args.variants.split(",") if v]
    for m in args.models:
        if m not in MODELS:
            p.error(f"--models: {m!r} is not one of {', '.join(MODELS)}")
    for v in args.variants:
        if v not in VARIANTS:
            p.error(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
    if not any(r in args.variants and b in args.variants for r, b in PAIRS):
        p.error("--variants needs a remote variant and a torch one (the comparison)")
    if args.rounds < 1 or args.steps < 1 or args.warmup < 2:
        p.error("--rounds >= 1, --steps >= 1 and --warmup >= 2 (lag 1 reads from step 1)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import grpc
    import torch
    import torch.multiprocessing as mp

    from qparams.testing import LocalServer

    before = load()
    waited = 0.0
    while before[0] > args.max_load and waited < args.wait:
        if waited == 0:
            print(f"qat_bench: load average {before[0]:.2f} > {args.max_load}: waiting up to "
                  f"{args.wait:.0f} s (busiest: {busy_others()})", flush=True)
        time.sleep(5)
        waited += 5
        before = load()
    noisy = before[0] > args.max_load
    print(f"qat_bench: load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}"
          f"{f' (waited {waited:.0f} s)' if waited else ''}"
          f"{' - ABOVE ' + str(args.max_load) + ', figures may be noisy' if noisy else ''}; "
          f"{os.cpu_count()} cores", flush=True)
    try:
        server = LocalServer(args.server)
    except (FileNotFoundError, RuntimeError) as e:
        raise SystemExit(f"qat_bench: {e}; build first or pass --server")
    print(f"qat_bench: qparams-server pid {server.pid} on {server.target}; Python "
          f"{sys.version.split()[0]}, torch {torch.__version__}, grpcio {grpc.__version__}; "
          f"W = {WORLD} ranks (gloo, 1 torch thread each), global batch {BATCH}, lag 1; "
          f"per model, {args.warmup} untimed steps of each variant, then {args.rounds} rounds "
          f"of {args.steps} timed steps of each", flush=True)
    start = time.monotonic()
    busy0, own0 = busy_seconds(), own_seconds()
    try:
        with tempfile.TemporaryDirectory(prefix="qat-bench-") as tmp:
            store = os.path.join(tmp, "store")
            mp.spawn(rank_main, nprocs=WORLD, join=True,
                     args=(store, server.target, server.pid, tmp, args.models, args.variants,
                           args.rounds, args.warmup, args.steps, args.profile))
            ranks = [json.loads(pathlib.Path(tmp, f"rank{r}.json").read_text())
                     for r in range(WORLD)]
    finally:
        status = server.stop()
    elapsed = time.monotonic() - start
    others = max(0.0, (busy_seconds() - busy0) - (own_seconds() - own0)) / elapsed
    after = load()
    if status != 0:
        print(f"qat_bench: qparams-server exited with {status}:\n{''.join(server.log)}",
              file=sys.stderr)
        return 1
    figures = summarize(ranks, args.models, args.variants, args.rounds, args.steps)
    summary: dict[str, Any] = {
        "world": WORLD, "batch": BATCH, "lag": 1, "rounds": args.rounds, "steps": args.steps,
        "warmup": args.warmup, "torch": torch.__version__, "torch_threads": 1,
        "load_before": [round(v, 2) for v in before],
        "load_after": [round(v, 2) for v in after], "seconds": round(elapsed, 1),
        "other_processes_cores": round(others, 2),
        "models": figures}
    for kind, f in figures.items():
        # Flat keys for bench/run.sh's table.
        for name, e in f["variants"].items():
            key = f"{kind}_{name.replace('-', '_')}"
            summary[f"{key}_ms"] = round(e["step_ms"], 3)
            if name.startswith("remote"):
                summary[f"{key}_run_step_ms"] = round(e["run_step_ms"], 3)
                summary[f"{key}_rpc_ms"] = round(e["rpc_ms"], 3)
                summary[f"{key}_rpcs_per_rank_step"] = round(e["rpcs_per_rank_step"], 4)
                summary[f"{kind}_modules"] = e["activations"] + e["weights"]
        for pair, r in f["ratios"].items():
            summary[f"{kind}_ratio_{pair.replace('/', '_vs_').replace('-', '_')}"] = round(
                r["ratio"], 4)
        summary[f"{kind}_health_cold_ms"] = round(f["health_cold_rtt_ms"], 3)
    for kind, f in figures.items():
        v = f["variants"]
        rem = v.get("remote") or v.get("remote-nobb") or {}
        print(f"== {kind}: {rem.get('activations')} activation + {rem.get('weights')} weight "
              f"fake-quantize modules; medians of {args.rounds} x {args.steps} steps (rank 0; "
              f"rank 1 in brackets)", flush=True)
        for name in args.variants:
            e = v[name]
            line = (f"  {name:11s} {e['step_ms']:7.2f} ms/step [{e['step_ms_rank1']:.2f}]  "
                    f"run.step {e['run_step_ms']:.3f}, forward {e['forward_ms']:.2f}, backward "
                    f"{e['backward_ms']:.2f}, optimizer {e['optimizer_ms']:.2f} ms; CPU a step: "
                    f"rank 0 {e['rank_cpu_ms']:.2f} ms, server {e['server_cpu_ms']:.2f} ms")
            print(line, flush=True)
        for pair, r in f["ratios"].items():
            remote, base = pair.split("/")
            target = (remote, base) == PAIRS[0]
            verdict = "met" if r["ratio"] <= TARGET_RATIO else "MISSED"
            tail = f", target <= {TARGET_RATIO}: {verdict}" if target else " (information)"
            print(f"  {LABELS[remote]} / {LABELS[base]}: {r['ratio']:.3f} (median of rounds, "
                  f"range {r['min']:.3f}..{r['max']:.3f}){tail}", flush=True)
        for name in [n for n in args.variants if n.startswith("remote")]:
            rem = v[name]
            rpc_verdict = "met" if rem["rpcs_per_rank_step"] <= TARGET_RPCS else "MISSED"
            print(f"  {name}: RPCs per rank per step {rem['rpcs_per_rank_step']:.3f} "
                  f"({rem['rpcs_by_method']} over {rem['rank_steps']} rank-steps; "
                  f"Client.step calls {rem['client_step_calls_per_rank_step']:.3f}), target "
                  f"{TARGET_RPCS:g}: {rpc_verdict}; Step request {rem['step_request_bytes']:.0f} B",
                  flush=True)
            print(f"  {name}: inside run.step (rank 0): request {rem['prep_ms']:.3f} ms, Step "
                  f"RPC {rem['rpc_ms']:.3f} ms (of which after both ranks' calls were sent "
                  f"{rem['rpc_after_both_arrived_ms']:.3f} ms; rank 0 waiting for rank 1's "
                  f"median {rem['wait_for_other_rank_ms']:.3f} / mean "
                  f"{rem['wait_for_other_rank_mean_ms']:.3f} ms, rank 1 for rank 0's mean "
                  f"{rem['rank1_wait_for_rank0_mean_ms']:.3f} ms), buffers "
                  f"{rem['post_ms']:.3f} ms; a Health.Check round trip alone "
                  f"{f['health_rtt_ms']:.3f} ms back to back, {f['health_cold_rtt_ms']:.3f} ms "
                  "after 20 ms idle", flush=True)
    print(f"qat_bench: load average after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f}; other "
          f"processes kept {others:.2f} of {os.cpu_count()} cores busy over the {elapsed:.0f} s "
          f"of the ranks and the server", flush=True)
    for r in ranks[:1]:
        for key, text in r["profiles"].items():
            print(f"== cProfile, rank 0, {key}\n{text}", flush=True)
    text = json.dumps(summary)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
