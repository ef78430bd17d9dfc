#!/usr/bin/env python3
"""NVFP4 block scales in torch on the CPU, run by `make bench` (bench/run.sh) after
core_bench, which writes the data this reads.

core_bench --nvfp4_data=PATH writes its NVFP4 benchmark's weight (4096 x 4096
bfloat16, raw little-endian) to PATH, each convention's block codes to
PATH.CONVENTION.e4m3 and the global scales to PATH.json. This computes the same scales
"the obvious way" in torch: view as [rows, cols / 16, 16], abs().amax(-1), the global
scale from the tensor's amax, divide, round to float8_e4m3fn (torch 1.13 has no
float8 dtype: qparams.nvfp4.e4m3_encode, the torch encoder on the float32 bits), the
steps of nvfp4.md 3.2 (compressed_tensors) and 3.3 (modelopt) as the libraries spell
them. Outside the timing it checks that torch's codes and global scales equal the
core's, bit for bit. Each figure is GB/s of the bfloat16 input, the median of --rounds
turns taken in rotation with a read-and-sum of the same tensor in torch (x.sum()), for
the bandwidth at the time. run.sh divides core_bench's GB/s by these (the core should
beat torch several times); --core-json (core_bench --json's output) prints the ratio
here too. torch runs on as many intra-op threads as the machine has cores, like
core_bench's OpenMP.

Output: the figures for people, then one JSON object (also written to --json OUTPUT).

    PYTHONPATH=build/python /usr/bin/python3 bench/nvfp4_bench.py \\
        --data=build/bench-results/nvfp4_data.bf16 --json=out.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import struct
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from qparams.nvfp4 import e4m3_decode, e4m3_encode

BLOCK = 16
CONVENTIONS = ("compressed_tensors", "modelopt")
E4M3_MAX = 448.0
E4M3_EPS_CODE = 0x20  # compressed-tensors' _get_dtype_eps(float8_e4m3fn): 0.125


def take_turns(rounds: int, sides: dict[str, Callable[[], float]],
               unit: str) -> dict[str, list[float]]:
    """Runs every side once per round, the order rotating from round to round."""
    names = list(sides)
    figures: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            figures[name].append(sides[name]())
        line = ", ".join(f"{name} {figures[name][-1]:.4g}" for name in names)
        print(f"  round {r + 1}/{rounds} ({unit}): {line}", flush=True)
    return figures


def scales_compressed_tensors(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """compressed-tensors generate_gparam and calculate_qparams on the block amax, in
    the weight's dtype."""
    amax = w.view(w.shape[0], -1, BLOCK).abs().amax(-1)
    tiny = torch.finfo(w.dtype).tiny
    global_scale = torch.nan_to_num(448.0 * 6.0 / torch.clamp(amax.max(), min=tiny),
                                    nan=1.0, posinf=1.0, neginf=1.0).to(torch.float32)
    s = (global_scale.reshape([1]) * (amax / 6.0)).clamp(-E4M3_MAX, E4M3_MAX)
    codes = e4m3_encode(s)
    codes = torch.where(e4m3_decode(codes) == 0, torch.full_like(codes, E4M3_EPS_CODE), codes)
    return codes, global_scale


def scales_modelopt(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ModelOpt get_weights_scaling_factor_2 and get_weights_scaling_factor, in float32
    (with the service's floor and clamp, nvfp4.md 3.3)."""
    amax = w.view(w.shape[0], -1, BLOCK).abs().amax(-1).float()
    scale_2 = torch.clamp(amax.max(), min=2.0 ** -126) / (6.0 * 448.0)
    s = amax / (6.0 * scale_2)
    s[s == 0] = 1.0
    return e4m3_encode(s.clamp(max=E4M3_MAX)), scale_2


SCALES = {"compressed_tensors": scales_compressed_tensors, "modelopt": scales_modelopt}


def float_bits(t: torch.Tensor) -> int:
    return struct.unpack("<I", struct.pack("<f", float(t)))[0]


def timed_gbps(nbytes: int, fn: Callable[[], Any]) -> Callable[[], float]:
    def run() -> float:
        start = time.perf_counter()
        fn()
        return nbytes / (time.perf_counter() - start) / 1e9
    return run


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="core_bench --nvfp4_data's file; without it, --quick "
                   "generates a small weight and checks nothing against the core")
    p.add_argument("--core-json", help="core_bench --json's output, for the ratios")
    p.add_argument("--rounds", type=int, default=7, help="turns of each side (7)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run (ctest bench_smoke): 1 round of a 256 x 1024 weight "
                   "generated here unless --data")
    p.add_argument("--json", metavar="OUTPUT", help="also write the JSON summary here")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds = 1
    elif not args.data:
        p.error("--data is needed (core_bench --nvfp4_data=PATH writes it), or --quick")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"nvfp4_bench: torch {torch.__version__}, {torch.get_num_threads()} intra-op "
          f"threads (set to the {os.cpu_count()} cores)", flush=True)
    meta: dict[str, Any] = {}
    if args.data:
        meta = json.loads(pathlib.Path(args.data + ".json").read_text())
        raw = np.fromfile(args.data, dtype="<i2")
        w = torch.from_numpy(raw).view(torch.bfloat16).reshape(meta["rows"], meta["cols"])
        source = f"{args.data} (core_bench --nvfp4_data)"
    else:
        g = torch.Generator().manual_seed(0)
        w = (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16)
        source = "generated here (--quick)"
    nbytes = w.numel() * 2
    print(f"== NVFP4 block scales of a {w.shape[0]} x {w.shape[1]} bfloat16 weight "
          f"({nbytes / 2**20:.0f} MiB, {source}), blocks of {BLOCK}", flush=True)

    result: dict[str, Any] = {"quick": args.quick, "torch_threads": torch.get_num_threads(),
                              "nvfp4_rows": w.shape[0], "nvfp4_cols": w.shape[1],
                              "nvfp4_bytes": nbytes}
    # Correctness, untimed: torch's codes and global scale against the core's.
    for name in CONVENTIONS:
        codes, global_scale = SCALES[name](w)
        if name in meta:
            core = np.fromfile(f"{args.data}.{name}.e4m3", dtype=np.uint8)
            same_codes = bool(np.array_equal(codes.reshape(-1).numpy(), core))
            same_scale = float_bits(global_scale) == meta[name]["global_scale_bits"]
            result[f"nvfp4_{name}_matches_core"] = same_codes and same_scale
            print(f"  {name}: torch's block codes equal the core's: {same_codes}; global "
                  f"scale: {same_scale} ({float(global_scale):.9g})", flush=True)
    float(w.sum())

    sides: dict[str, Callable[[], float]] = {
        "read-and-sum": timed_gbps(nbytes, lambda: float(w.sum()))}
    for name in CONVENTIONS:
        sides[name] = timed_gbps(nbytes, lambda name=name: SCALES[name](w))
    turns = take_turns(args.rounds, sides, "GB/s")
    result["nvfp4_rounds"] = args.rounds
    result["nvfp4_torch_read_gbps"] = round(statistics.median(turns["read-and-sum"]), 3)
    for name in CONVENTIONS:
        result[f"nvfp4_torch_{name}_gbps"] = round(statistics.median(turns[name]), 4)
    line = ", ".join(f"{n} {result[f'nvfp4_torch_{n}_gbps']}" for n in CONVENTIONS)
    print(f"  medians (GB/s): torch read-and-sum {result['nvfp4_torch_read_gbps']}; {line}",
          flush=True)
    if args.core_json:
        core = json.loads(pathlib.Path(args.core_json).read_text())
        for name in CONVENTIONS:
            if f"nvfp4_{name}_gbps" in core:
                ratio = core[f"nvfp4_{name}_gbps"] / result[f"nvfp4_torch_{name}_gbps"]
                result[f"nvfp4_{name}_core_over_torch"] = round(ratio, 2)
                print(f"  {name}: core {core[f'nvfp4_{name}_gbps']} GB/s (core_bench) vs "
                      f"torch {result[f'nvfp4_torch_{name}_gbps']} GB/s: {ratio:.2f}x",
                      flush=True)
    text = json.dumps(result)
    if args.json:
        pathlib.Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
