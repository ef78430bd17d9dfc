"""An NVFP4 checkpoint of a small Llama-style model, calibrated through the qparams service.

The model is one decoder layer with Llama's and Mixtral's module names: attention
(q_proj, k_proj, v_proj, o_proj), an MLP (gate_proj, up_proj, down_proj) and a MoE block
(block_sparse_moe: a router `gate` and two experts of w1, w2, w3), with deterministic
weights (torch.manual_seed). qparams.torch.NVFP4Calibration creates an NVFP4 session
per linear weight and input, sends each weight as its blocks' ranges, observes the
inputs on a few random batches, and declares the GLOBAL_AMAX scale groups of the fused
members (q/k/v, gate/up, each expert's w1/w3, the experts' inputs). The server's export
is written as a checkpoint in both conventions (compressed-tensors' config.json,
ModelOpt's hf_quant_config.json), loaded back with qparams.safetensors and dequantized
with qparams.nvfp4: the table is each weight's relative round-trip error
||W - dequantize(quantize(W))|| / ||W||, and the fused members' global scales are equal.

    python3 examples/nvfp4_checkpoint.py [--server HOST:PORT] [--out DIR]

(default $QPARAMS_TARGET, else 127.0.0.1:50051, e.g. `make run`; with PYTHONPATH=
build/python, or the qparams package installed). The checkpoints go to DIR/
compressed_tensors and DIR/modelopt (default: a temporary directory, removed). Each run
calibrates under its own run name and deletes its sessions and groups at the end.
tests/python/test_nvfp4_checkpoint.py runs the same functions.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import time

import torch
from torch import nn

import qparams
from qparams import safetensors
from qparams.torch import NVFP4Calibration, read_checkpoint

HIDDEN, HEADS, INTERMEDIATE, EXPERTS, VOCAB = 64, 4, 128, 2, 256
CONVENTIONS = ("compressed_tensors", "modelopt")
#: The router stays unquantized, as llm-compressor's Mixtral NVFP4 recipe leaves it.
IGNORE = ("lm_head", r"re:.*block_sparse_moe\.gate")
GLOBAL_SCALE = {"compressed_tensors": "weight_global_scale", "modelopt": "weight_scale_2"}


class RMSNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, HEADS, -1).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        scores = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        attended = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return self.o_proj(attended.transpose(1, 2).reshape(b, t, HIDDEN))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.up_proj = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.down_proj = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.w3 = nn.Linear(HIDDEN, INTERMEDIATE, bias=False)
        self.w2 = nn.Linear(INTERMEDIATE, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """Mixtral's block: a router (`gate`) and experts, each token to its top expert."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, HIDDEN)
        weight, choice = self.gate(flat).softmax(-1).max(-1)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            routed = choice == e
            if routed.any():
                out[routed] = expert(flat[routed]) * weight[routed, None]
        return out.reshape(x.shape)


class DecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm, self.pre_moe_layernorm = (
            RMSNorm(HIDDEN) for _ in range(3))
        self.self_attn, self.mlp, self.block_sparse_moe = Attention(), MLP(), MoE()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x + self.block_sparse_moe(self.pre_moe_layernorm(x))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([DecoderLayer()])
        self.norm = RMSNorm(HIDDEN)


class TinyLlama(nn.Module):
    """model.layers.0.self_attn.q_proj ... lm_head, as a Hugging Face Llama names them."""

    def __init__(self) -> None:
        super().__init__()
        self.model = Decoder()
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            x = layer(x)
        return self.lm_head(self.model.norm(x))


def build_model(seed: int = 0) -> TinyLlama:
    """The model, its weights from torch.manual_seed(seed): normal with standard
    deviation 0.02, as Llama initializes them (so that each tensor's amax differs)."""
    torch.manual_seed(seed)
    model = TinyLlama().eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, 0.02)
    return model


def calibration_batches(seed: int = 1, count: int = 4) -> list[torch.Tensor]:
    """`count` batches of 2 x 32 random tokens."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (2, 32), generator=g) for _ in range(count)]


def calibrate_and_write(model: nn.Module, client: qparams.Client, run: str, convention: str,
                        directory: str | os.PathLike[str]) -> NVFP4Calibration:
    """Calibrates `model` under `run` (weights, then inputs on calibration_batches) with
    the fused groups, and writes the checkpoint of `convention` into `directory`."""
    calibration = NVFP4Calibration(model, run, client=client, convention=convention,
                                   ignore=IGNORE)
    calibration.calibrate_weights()
    with torch.no_grad(), calibration.observe_inputs():
        for batch in calibration_batches():
            model(batch)
    calibration.write_checkpoint(directory, config={"architectures": ["TinyLlama"]})
    return calibration


def round_trip(model: nn.Module, directory: str | os.PathLike[str],
               convention: str) -> tuple[dict[str, float], dict[str, float]]:
    """(relative round-trip error, weight global scale) by module, of the checkpoint in
    `directory` loaded back with qparams.safetensors and dequantized with qparams.nvfp4."""
    tensors, _ = safetensors.load(pathlib.Path(directory) / "model.safetensors")
    named = dict(model.named_modules())
    errors, scales = {}, {}
    for module, dequantized in read_checkpoint(directory).items():
        weight = named[module].weight.detach()
        errors[module] = float((dequantized - weight).norm() / weight.norm())
        scales[module] = float(tensors[f"{module}.{GLOBAL_SCALE[convention]}"].reshape(-1)[0])
    return errors, scales


def run_table(server: str | None = None, out: str | None = None,
              run: str | None = None) -> dict[str, dict]:
    """Both conventions' checkpoints of the model: {"groups": {module: its fused weight
    group or ""}, convention: {"errors", "scales", "own"} (each by module; "own" the
    weight session's global scale without its group), "fused": {group: member modules}}."""
    model = build_model()
    run = run or f"nvfp4-example-{os.getpid()}-{time.monotonic_ns()}"
    table: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch, qparams.Client(server) as client:
        for convention in CONVENTIONS:
            directory = pathlib.Path(out or scratch) / convention
            calibration = calibrate_and_write(model, client, f"{run}-{convention}", convention,
                                              directory)
            try:
                errors, scales = round_trip(model, directory, convention)
                # Each weight session's own global scale, before its group shared one.
                own = {m: client.get_qparams(calibration.session(m)).global_scale
                       for m in calibration.modules}
            finally:
                calibration.delete()
            table[convention] = {"errors": errors, "scales": scales, "own": own}
        table["fused"] = {g.name: g.modules for g in calibration.groups if g.role == "weight"}
        table["groups"] = {m: next((g.kind for g in calibration.groups
                                    if g.role == "weight" and m in g.modules), "")
                           for m in calibration.modules}
    return table


def format_table(table: dict[str, dict]) -> str:
    """The per-layer table: module, fused group, and per convention the relative
    round-trip error and the checkpoint's weight global scale (compressed-tensors':
    also the session's own, without its group)."""
    rows = [("module", "fused", "CT error", "CT own gs", "CT weight_global_scale",
             "MO error", "MO weight_scale_2")]
    ct, mo = table["compressed_tensors"], table["modelopt"]
    for module, group in table["groups"].items():
        rows.append((module.removeprefix("model.layers."), group or "-",
                     f"{ct['errors'][module]:.4f}", f"{ct['own'][module]:.6g}",
                     f"{ct['scales'][module]:.6g}", f"{mo['errors'][module]:.4f}",
                     f"{mo['scales'][module]:.6g}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", help="the qparams server (default $QPARAMS_TARGET, "
                        "else 127.0.0.1:50051)")
    parser.add_argument("--out", help="write the checkpoints under this directory")
    args = parser.parse_args()
    table = run_table(args.server, args.out)
    print(format_table(table))
    for convention in CONVENTIONS:
        scales = table[convention]["scales"]
        for group, modules in table["fused"].items():
            assert len({scales[m] for m in modules}) == 1, (convention, group)
    print(f"fused members' global scales equal in both checkpoints: {len(table['fused'])} "
          "groups")


if __name__ == "__main__":
    main()
