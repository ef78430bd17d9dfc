"""NVFP4 calibration of a model's linears through the service, and the checkpoint
written from the server's export.

The scales are the server's (nvfp4.md sections 3-4, shared by GLOBAL_AMAX groups of
the fused members that find_fused_groups names); the packed weights are qparams.nvfp4's
(section 5), quantized here with the exported block codes; the files are section 6's.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import torch

from qparams import nvfp4, safetensors
from qparams._errors import FusedGlobalScalesDiffer, NotFound
from qparams.client import Client
from qparams.torch._fused import (EXPERT_INPUTS, FUSED_SIBLINGS, FusedGroup, FusedGroups,
                                  find_fused_groups)
from qparams.torch._registry import shared_client

__all__ = ["NVFP4Calibration", "NVFP4Checkpoint", "read_checkpoint"]

_CONVENTIONS = ("compressed_tensors", "modelopt")
#: The spec of every session (nvfp4.md section 2): weights in blocks of 16 along the
#: last axis; inputs in the tuple form [-1, 16], one block per 16 channels over all
#: tokens, as llm-compressor keeps them.
_SPEC = dict(calculator="global_minmax", dtype="float4_e2m1fn_x2",
             scale_dtype="float8_e4m3fn")
_GRANULARITY = {"weight": "per_block:-1:16", "input": "per_block:-1,16"}
#: The exported global scale of a weight, by convention (nvfp4.md section 6).
_WEIGHT_GLOBAL = {"compressed_tensors": "weight_global_scale", "modelopt": "weight_scale_2"}
_CONFIG_FILE = {"compressed_tensors": "config.json", "modelopt": "hf_quant_config.json"}


class NVFP4Checkpoint(NamedTuple):
    """What write_checkpoint wrote.

    Attributes:
        directory: the checkpoint's directory.
        weights: its model.safetensors.
        config: config.json (compressed_tensors, with quantization_config) or
            hf_quant_config.json (modelopt).
        modules: the quantized modules, in model order.
        global_scales: each quantized module's weight global scale (gs, or scale_2).
    """

    directory: pathlib.Path
    weights: pathlib.Path
    config: pathlib.Path
    modules: tuple[str, ...]
    global_scales: dict[str, float]


def _matches_any(name: str, patterns: Sequence[str]) -> bool:
    return any(re.fullmatch(p[3:], name) if p.startswith("re:") else p == name
               for p in patterns)


class NVFP4Calibration:
    """NVFP4 calibration of a model's linears: one session per weight (and, with
    observe_inputs, per input), GLOBAL_AMAX scale groups of the fused members, and
    the checkpoint of the server's export.

        calibration = NVFP4Calibration(model, "llama-nvfp4")
        calibration.calibrate_weights()        # block ranges of each weight, then groups
        with calibration.observe_inputs():     # optional: inputs, through forward hooks
            for batch in data:
                model(batch)
        calibration.write_checkpoint("out/")   # model.safetensors and its config

    Sessions are "RUN/{TAG}.REST.weight" and ".input", hash-tagged so that a group and
    its members share a slot (FusedGroups.session_name); the checkpoint names drop
    the braces. Each session is global_minmax, float4_e2m1fn_x2 with float8_e4m3fn
    block scales of 16: "per_block:-1:16" for weights, "per_block:-1,16" for inputs.

    Args:
        model: the model; its modules are read when calibrating and writing.
        run: the sessions' and groups' prefix ("RUN/..."); no braces.
        client: the qparams.Client; default the shared client of `server`
            (qparams.torch.shared_client).
        server: the server's address when no client is given (default
            $QPARAMS_TARGET, else 127.0.0.1:50051).
        convention: "compressed_tensors" (the default; a compressed-tensors
            checkpoint) or "modelopt" (a ModelOpt one).
        modules: the names of the nn.Linear modules to quantize; default every
            nn.Linear of the model.
        ignore: module names, or "re:" regular expressions matched against the whole
            name, left unquantized (default "lm_head", as llm-compressor's NVFP4
            recipes leave it).
        siblings, experts, expert_inputs: the fused groups, as for find_fused_groups.

    Raises:
        TypeError: model is not an nn.Module; a named module is not an nn.Linear.
        ValueError: a bad run, convention, module name or pattern; a linear whose
            in_features is not a multiple of 16; no module left to quantize; as
            find_fused_groups for the sets.
    """

    def __init__(self, model: torch.nn.Module, run: str, *, client: Client | None = None,
                 server: str | None = None, convention: str = "compressed_tensors",
                 modules: Iterable[str] | None = None, ignore: Sequence[str] = ("lm_head",),
                 siblings: Mapping[str, Sequence[str]] = FUSED_SIBLINGS,
                 experts: str = "experts",
                 expert_inputs: Mapping[str, Sequence[str]] = EXPERT_INPUTS) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        if not isinstance(run, str) or not run or "{" in run or "}" in run:
            raise ValueError(f"run must be a non-empty session-name prefix without braces "
                             f"(the braces are the modules' hash tags), not {run!r}")
        if convention not in _CONVENTIONS:
            raise ValueError(f"convention must be one of {', '.join(_CONVENTIONS)}, not "
                             f"{convention!r}")
        if isinstance(ignore, str) or not all(isinstance(p, str) for p in ignore):
            raise TypeError(f"ignore must be a sequence of module names or \"re:\" patterns, "
                            f"not {ignore!r}")
        for p in ignore:
            if p.startswith("re:"):
                try:
                    re.compile(p[3:])
                except re.error as e:
                    raise ValueError(f"ignore: {p!r} is not a regular expression: {e}") from None
        named = dict(model.named_modules())
        if modules is None:
            chosen = [n for n, m in named.items() if isinstance(m, torch.nn.Linear)]
        else:
            if isinstance(modules, str):
                raise TypeError("modules must be an iterable of module names, not a str")
            chosen = list(dict.fromkeys(modules))
            for n in chosen:
                if n not in named:
                    raise ValueError(f"modules names {n!r}, which is not a module of the model")
                if not isinstance(named[n], torch.nn.Linear):
                    raise TypeError(f"modules names {n!r}, a {type(named[n]).__name__}; NVFP4 "
                                    "calibration quantizes nn.Linear weights")
        chosen = [n for n in chosen if not _matches_any(n, ignore)]
        for n in chosen:
            if named[n].in_features % nvfp4.BLOCK:
                raise ValueError(f"module {n}: NVFP4 quantizes blocks of {nvfp4.BLOCK} along the "
                                 f"weight's last axis, so in_features must be a multiple of "
                                 f"{nvfp4.BLOCK}, not {named[n].in_features}; leave it out "
                                 "with ignore=")
        if not chosen:
            raise ValueError("no nn.Linear module is left to quantize (modules and ignore)")
        self.model = model
        self.run = run
        self.convention = convention
        self.client = client if client is not None else shared_client(server)
        self.groups: FusedGroups = find_fused_groups(
            model, siblings, experts=experts, expert_inputs=expert_inputs, modules=chosen)
        self.modules: tuple[str, ...] = self.groups.modules
        self._created: set[str] = set()

    def session(self, module: str, role: str = "weight") -> str:
        """The session of `module`'s weight or input (role "weight" / "input")."""
        return self.groups.session_name(self.run, module, role)

    def group_sessions(self, group: FusedGroup) -> tuple[str, ...]:
        """The member sessions of one of self.groups."""
        return self.groups.sessions(self.run, group)

    def _create(self, role: str) -> None:
        """The sessions of `role` and their groups, once per calibration."""
        if role in self._created:
            return
        spec = dict(_SPEC, convention=self.convention, granularity=_GRANULARITY[role],
                    target="weight" if role == "weight" else "activation")
        for m in self.modules:
            self.client.create_session(self.session(m, role), **spec)
        for group in self.groups:
            if group.role == role:
                # Experts that see no calibration token take the group's input scale.
                self.client.create_scale_group(self.groups.group_name(self.run, group),
                                               self.group_sessions(group), "global_amax",
                                               fill_uncalibrated=role == "input")
        self._created.add(role)

    def calibrate_weights(self) -> None:
        """Creates the weight sessions, observes each weight once as its blocks'
        ranges (computed on the weight's device; only they are sent), and creates the
        weight groups.

        Raises:
            AlreadyExists: a session or group of the run exists (delete() it, or use
                another run).
            QParamsError: as the server answers an observation (the first failure).
        """
        self._create("weight")
        named = dict(self.model.named_modules())
        items = [(self.session(m), named[m].weight.detach()) for m in self.modules]
        for outcome in self.client.observe_many(items, reduce="always", omit_qparams=True):
            if isinstance(outcome, Exception):
                raise outcome

    @contextlib.contextmanager
    def observe_inputs(self) -> Iterator["NVFP4Calibration"]:
        """Observes the inputs of the quantized linears while the block runs: forward
        pre-hooks queue each input, flattened to [tokens, channels] and reduced to its
        blocks' ranges, for the client's background thread. On entering the first
        time, creates the input sessions and the experts' input groups (with
        fill_uncalibrated, for experts that see no token); on leaving, removes the
        hooks and waits for the observations.

        Raises:
            AlreadyExists: a session or group of the run exists.
            QParamsError: a failed observation, on leaving.
        """
        self._create("input")
        named = dict(self.model.named_modules())
        handles = []

        def hook(name: str):
            def observe(module: torch.nn.Module, args: tuple) -> None:
                x = args[0].detach()
                if x.numel():
                    self.client.observe_async(name, x.reshape(-1, x.shape[-1]),
                                              reduce="always", omit_qparams=True)
            return observe

        try:
            for m in self.modules:
                handles.append(named[m].register_forward_pre_hook(hook(self.session(m, "input"))))
            yield self
        finally:
            for h in handles:
                h.remove()
        self.client.flush()

    def export(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The server's export of the run in this calibration's checkpoint format, its
        tensors named after the modules (no hash tags): (state_dict, quantization_config)
        for compressed_tensors, (state_dict, hf_quant_config) for modelopt.

        Raises:
            FusedGlobalScalesDiffer: fused siblings with different global scales, no
                group covering them (the server's refusal, naming the sessions).
            UncalibratedGroup: a weight group with a member that never saw data.
            FailedPrecondition: uncalibrated sessions (named).
        """
        # The server drops the hash tags' braces from the tensor names it exports.
        export = (self.client.export_compressed_tensors if self.convention == "compressed_tensors"
                  else self.client.export_modelopt)
        return export(self.run + "/")

    def _check_fused(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Each module's weight global scale; FusedGlobalScalesDiffer when the members of
        one of self's weight groups differ (which the server's table does not cover
        when the sets are custom)."""
        key = _WEIGHT_GLOBAL[self.convention]
        scales = {}
        for m in self.modules:
            tensor = state_dict.get(f"{m}.{key}")
            if tensor is None:
                raise ValueError(f"the export holds no {m}.{key}; were the weights calibrated "
                                 "(calibrate_weights)?")
            scales[m] = float(tensor.reshape(-1)[0])
        for group in self.groups:
            if group.role != "weight":
                continue
            values = tuple(scales[m] for m in group.modules)
            if len(set(values)) > 1:
                sessions = self.group_sessions(group)
                listed = ", ".join(f"{s} ({v})" for s, v in zip(sessions, values))
                raise FusedGlobalScalesDiffer(
                    f"the NVFP4 weights of the fused {group.kind} group {group.name} have "
                    f"different global scales: {listed}; create its GLOBAL_AMAX scale group "
                    "(calibrate_weights does) and export again", sessions, values)
        return scales

    def write_checkpoint(self, directory: str | os.PathLike[str], *,
                         config: Mapping[str, Any] | None = None) -> NVFP4Checkpoint:
        """Writes the checkpoint of nvfp4.md section 6 into `directory` (created if
        needed): model.safetensors with every tensor of the model's state_dict, the
        quantized linears' weights replaced by the packed NVFP4 weight (quantized here
        with qparams.nvfp4 and the exported block codes and global scale) and the
        exported scales; and config.json with `config` and its quantization_config
        (compressed_tensors), or hf_quant_config.json (modelopt; config.json too when
        `config` is given). The unquantized nn.Linear modules are listed in the
        config's ignore / exclude_modules.

        Raises:
            FusedGlobalScalesDiffer: fused members' global scales differ (named).
            UncalibratedGroup, FailedPrecondition: as for export.
            OSError: the files cannot be written.
        """
        state_dict, quant_config = self.export()
        scales = self._check_fused(state_dict)
        named = dict(self.model.named_modules())
        quantized = set(self.modules)
        tensors: dict[str, torch.Tensor] = {}
        for key, value in self.model.state_dict().items():
            module, _, leaf = key.rpartition(".")
            if not (module in quantized and leaf == "weight"):
                tensors[key] = value.detach().cpu().contiguous()
        packed_name = "weight_packed" if self.convention == "compressed_tensors" else "weight"
        for m in self.modules:
            codes = state_dict[f"{m}.weight_scale"]
            packed, _ = nvfp4.quantize(named[m].weight.detach(),
                                       state_dict[f"{m}.{_WEIGHT_GLOBAL[self.convention]}"],
                                       self.convention, codes)
            tensors[f"{m}.{packed_name}"] = packed.cpu()
        tensors.update(state_dict)
        unquantized = sorted(n for n, mod in named.items()
                             if isinstance(mod, torch.nn.Linear) and n not in quantized)
        directory = pathlib.Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        weights = directory / "model.safetensors"
        safetensors.save(tensors, weights, metadata={"format": "pt"})
        config_path = directory / _CONFIG_FILE[self.convention]
        if self.convention == "compressed_tensors":
            quant_config = dict(quant_config, ignore=sorted({*quant_config.get("ignore", ()),
                                                             *unquantized}))
            document = dict(config or {}, quantization_config=quant_config)
        else:
            quantization = dict(quant_config.get("quantization", {}))
            quantization["exclude_modules"] = sorted(
                {*quantization.get("exclude_modules", ()), *unquantized})
            document = dict(quant_config, quantization=quantization)
            if config is not None:
                (directory / "config.json").write_text(json.dumps(dict(config), indent=2) + "\n")
        config_path.write_text(json.dumps(document, indent=2) + "\n")
        return NVFP4Checkpoint(directory, weights, config_path, self.modules, scales)

    def delete(self) -> None:
        """Deletes the run's groups and sessions that this calibration creates
        (whichever exist)."""
        for group in self.groups:
            with contextlib.suppress(NotFound):
                self.client.delete_scale_group(self.groups.group_name(self.run, group))
        for m in self.modules:
            for role in ("weight", "input"):
                with contextlib.suppress(NotFound):
                    self.client.delete_session(self.session(m, role))
        self._created.clear()


def read_checkpoint(directory: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The NVFP4 weights of a checkpoint write_checkpoint wrote (compressed-tensors
    or ModelOpt, told by its config file), dequantized with qparams.nvfp4: float32
    tensors by module name.

    Raises:
        FileNotFoundError: the directory has neither config.json with a
            compressed-tensors quantization_config nor hf_quant_config.json.
        SafetensorsError: a malformed model.safetensors.
    """
    directory = pathlib.Path(directory)
    if (directory / "hf_quant_config.json").exists():
        convention = "modelopt"
    else:
        config = directory / "config.json"
        if not config.exists() or "quantization_config" not in json.loads(config.read_text()):
            raise FileNotFoundError(f"{directory} holds neither hf_quant_config.json nor a "
                                    "config.json with a quantization_config")
        convention = "compressed_tensors"
    tensors, _ = safetensors.load(directory / "model.safetensors")
    packed_leaf = "weight_packed" if convention == "compressed_tensors" else "weight"
    out = {}
    for key, scale in tensors.items():
        module, _, leaf = key.rpartition(".")
        if leaf != "weight_scale" or f"{module}.{packed_leaf}" not in tensors:
            continue
        out[module] = nvfp4.dequantize(tensors[f"{module}.{packed_leaf}"], scale,
                                       tensors[f"{module}.{_WEIGHT_GLOBAL[convention]}"],
                                       convention)
    return out
