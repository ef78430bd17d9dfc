"""RemoteObserver's arguments as a qparams spec: torch.ao's dtypes and qschemes in
qparams' terms, a spec's description in messages, and how an existing session differs
from the one an observer (or QATRun) asks for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from qparams._errors import AlreadyExists
from qparams._histogram import histogram_params
from qparams._spec import granularity_text
from qparams.v1 import qparams_pb2 as pb

_TORCH_QSCHEMES = (
    # (torch qscheme, qparams qscheme, per channel)
    (torch.per_tensor_affine, "asymmetric", False),
    (torch.per_tensor_symmetric, "symmetric", False),
    (torch.per_channel_affine, "asymmetric", True),
    (torch.per_channel_symmetric, "symmetric", True),
)
_QSCHEME_NAMES = ("symmetric", "asymmetric", "symmetric_with_clipping")
OWN_KEYS = ("dtype", "qscheme", "granularity", "target", "quant_min", "quant_max")
_DTYPE_ALIASES = {"float8_e4m3": "float8_e4m3fn", "float4_e2m1fn": "float4_e2m1fn_x2"}
_SCALE_ALIASES = {"float8_e8m0": "float8_e8m0fnu"}


def canonical_dtype(name: str) -> str:
    name = name or "int8"
    return _DTYPE_ALIASES.get(name, name)


def _same_axis(a: int, b: int, rank: int | None) -> bool:
    if a == b:
        return True
    return rank is not None and -rank <= a < rank and -rank <= b < rank and a % rank == b % rank


def _same_granularity(want: pb.Granularity, have: pb.Granularity, rank: int | None) -> bool:
    kind = want.WhichOneof("kind") or "per_tensor"
    if kind != (have.WhichOneof("kind") or "per_tensor"):
        return False
    if kind == "per_channel":
        return _same_axis(want.per_channel.axis, have.per_channel.axis, rank)
    if kind == "per_block":
        w, h = want.per_block, have.per_block
        if w.HasField("axis") != h.HasField("axis") or list(w.block_size) != list(h.block_size):
            return False
        return not w.HasField("axis") or _same_axis(w.axis, h.axis, rank)
    return True


def describe_spec(spec: pb.QuantSpec) -> str:
    parts = [f"dtype={canonical_dtype(spec.dtype)}",
             f"qscheme={pb.QScheme.Name(spec.qscheme or pb.SYMMETRIC).lower()}",
             f"granularity={granularity_text(spec.granularity)}",
             f"target={pb.Target.Name(spec.target or pb.WEIGHT).lower()}"]
    if spec.HasField("quant_min"):
        parts.append(f"quant_range=({spec.quant_min:g}, {spec.quant_max:g})")
    if spec.HasField("float_range"):
        lo = spec.float_range.min if spec.float_range.HasField("min") else None
        hi = spec.float_range.max if spec.float_range.HasField("max") else None
        if lo is not None or hi is not None:
            parts.append(f"float_range=({lo}, {hi})")
    if spec.scale_dtype:
        parts.append(f"scale_dtype={spec.scale_dtype}")
    if spec.range_calculator:
        parts.append(f"range_calculator={spec.range_calculator}")
    return "{" + ", ".join(parts) + "}"


RULES = ("torch", "coreai_opt")
#: The calculators that keep a histogram of |x| and choose a clipping range from it
#: (per-tensor only).
HISTOGRAM_CALCULATORS = ("percentile", "entropy", "mse")
IF_EXISTS = ("error", "resume", "replace")
TARGETS = ("weight", "activation")
DEFAULT_EPS = torch.finfo(torch.float32).eps


def torch_dtype_name(dtype: torch.dtype | str) -> str:
    """The qparams dtype name of a RemoteObserver dtype argument."""
    if isinstance(dtype, torch.dtype):
        if dtype == torch.qint8:
            return "int8"
        if dtype == torch.quint8:
            return "uint8"
        raise ValueError(f"dtype {dtype} has no qparams counterpart; use torch.qint8, "
                         "torch.quint8 or a qparams dtype name such as \"int4\"")
    if isinstance(dtype, str) and dtype:
        return dtype
    raise TypeError(f"dtype must be torch.qint8, torch.quint8 or a qparams dtype name, "
                    f"not {dtype!r}")


def qscheme_names(qscheme: torch.qscheme | str) -> tuple[str, bool]:
    """(qparams qscheme, per channel) of a RemoteObserver qscheme argument."""
    if isinstance(qscheme, str):
        if qscheme not in _QSCHEME_NAMES:
            raise ValueError(f"qscheme {qscheme!r} is not one of {', '.join(_QSCHEME_NAMES)} "
                             "or a torch qscheme")
        return qscheme, False
    for torch_qscheme, name, per_channel in _TORCH_QSCHEMES:
        if qscheme == torch_qscheme:
            return name, per_channel
    raise ValueError(f"qscheme {qscheme} is not supported; use per_tensor_affine, "
                     "per_tensor_symmetric, per_channel_affine, per_channel_symmetric or a "
                     "qparams qscheme name (per_channel_affine_float_qparams, float zero "
                     "points for embeddings, has no qparams counterpart)")


def spec_differences(session: pb.Session, want: pb.QuantSpec, calculator: str,
                     averaging_constant: float | None, histogram: Mapping[str, Any] | None,
                     rank: int | None) -> list[tuple[str, Any, Any]]:
    """(field, the session's, the requested) for every way the existing `session`
    differs from the one asked for: the spec `want` (its unset fields are the
    server's to default), the resolved `calculator`, moving_average's constant and a
    histogram calculator's parameters; `rank`, the input's rank if known, relates
    negative axes to positive ones."""
    have = session.spec
    diffs: list[tuple[str, Any, Any]] = []
    if session.calculator != calculator:
        diffs.append(("calculator", session.calculator, calculator))
    if have.dtype != canonical_dtype(want.dtype):
        diffs.append(("dtype", have.dtype, canonical_dtype(want.dtype)))
    if have.qscheme != (want.qscheme or pb.SYMMETRIC):
        diffs.append(("qscheme", pb.QScheme.Name(have.qscheme).lower(),
                      pb.QScheme.Name(want.qscheme or pb.SYMMETRIC).lower()))
    if not _same_granularity(want.granularity, have.granularity, rank):
        diffs.append(("granularity", granularity_text(have.granularity),
                      granularity_text(want.granularity)))
    if have.target != (want.target or pb.WEIGHT):
        diffs.append(("target", pb.Target.Name(have.target).lower(),
                      pb.Target.Name(want.target or pb.WEIGHT).lower()))
    if want.HasField("quant_min") and \
            (have.quant_min, have.quant_max) != (want.quant_min, want.quant_max):
        diffs.append(("quant_min/quant_max", (have.quant_min, have.quant_max),
                      (want.quant_min, want.quant_max)))
    if want.float_range != have.float_range:
        diffs.append(("float_range", str(have.float_range).strip() or "unset",
                      str(want.float_range).strip() or "unset"))
    if want.scale_dtype and _SCALE_ALIASES.get(want.scale_dtype, want.scale_dtype) \
            != have.scale_dtype:
        diffs.append(("scale_dtype", have.scale_dtype or "unset", want.scale_dtype))
    if want.range_calculator and want.range_calculator != have.range_calculator:
        diffs.append(("range_calculator", have.range_calculator, want.range_calculator))
    if calculator == "moving_average" and averaging_constant is not None \
            and session.averaging_constant != float(averaging_constant):
        diffs.append(("averaging_constant", session.averaging_constant, averaging_constant))
    if histogram is not None:
        for key, value in histogram_params(histogram).ListFields():
            if getattr(session.histogram, key.name) != value:
                diffs.append((f"histogram {key.name}", getattr(session.histogram, key.name),
                              value))
    return diffs


def already_exists_with_another_spec(name: str, diffs: list[tuple[str, Any, Any]]
                                     ) -> AlreadyExists:
    """The AlreadyExists of a session `name` that exists with another spec (`diffs`,
    as spec_differences gives them)."""
    text = "; ".join(f"{field} is {h!r}, not the requested {w!r}" for field, h, w in diffs)
    return AlreadyExists(
        f"session {name!r} already exists with another spec: {text}. Delete it "
        "(Client.delete_session), or give this observer another name or run", session=name)
