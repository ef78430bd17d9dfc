"""Specs and granularities from plain Python values, and the block shape a
granularity gives a tensor.

The server owns every rule of a spec: this module only turns Python values into the
wire messages (refusing, with ValueError, what has no wire form, such as an unknown
qscheme name or a malformed granularity string) and passes dtype names and numbers
through for the server to judge. The one rule applied here is the block shape
(semantics.md §3), because reducing a tensor to its block ranges must happen where the
tensor lives, on the caller's device; the conformance vectors check it against the
server's, case by case (tests/python/test_conformance.py, reduce="always").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

from qparams.v1 import qparams_pb2 as pb

__all__ = ["GranularityLike", "SpecLike", "granularity", "granularity_text", "quant_spec",
           "block_shape"]

#: A granularity: a CLI string ("per_tensor", "per_channel:0", "per_block:1:32",
#: "per_block:4,-1"), a mapping like {"kind": "per_channel", "axis": 0} (the form of
#: the conformance vectors), or a qparams.v1.Granularity message.
GranularityLike = Union[str, Mapping[str, Any], pb.Granularity]

#: A spec: a mapping of QuantSpec field names to plain values (see quant_spec), or a
#: qparams.v1.QuantSpec message.
SpecLike = Union[Mapping[str, Any], pb.QuantSpec]

_QSCHEMES = {"symmetric": pb.SYMMETRIC, "asymmetric": pb.ASYMMETRIC,
             "symmetric_with_clipping": pb.SYMMETRIC_WITH_CLIPPING}
_TARGETS = {"weight": pb.WEIGHT, "activation": pb.ACTIVATION}
_SPEC_KEYS = ("dtype", "qscheme", "granularity", "target", "quant_min", "quant_max",
              "float_range", "scale_dtype", "range_calculator", "convention")
_GRANULARITY_SYNTAX = ("per_tensor, per_channel:AXIS, per_block:AXIS:SIZE or "
                       "per_block:B0,B1,... (-1 = the whole dim)")


def _int(text: str) -> int:
    # The CLI's integers (absl::SimpleAtoi): surrounding white space and a sign allowed,
    # then decimal digits only (int() would also take "1_0" and non-ASCII digits).
    body = text.strip(" \t\n\v\f\r")
    digits = body[1:] if body[:1] in ("+", "-") else body
    if not digits.isascii() or not digits.isdigit():
        raise ValueError(text)
    return int(body)


def _parse_granularity(text: str) -> pb.Granularity:
    parts = text.split(":")
    try:
        if parts == ["per_tensor"]:
            return pb.Granularity(per_tensor=pb.PerTensor())
        if len(parts) == 2 and parts[0] == "per_channel":
            return pb.Granularity(per_channel=pb.PerChannel(axis=_int(parts[1])))
        if len(parts) == 3 and parts[0] == "per_block":
            return pb.Granularity(
                per_block=pb.PerBlock(axis=_int(parts[1]), block_size=[_int(parts[2])]))
        if len(parts) == 2 and parts[0] == "per_block":
            return pb.Granularity(
                per_block=pb.PerBlock(block_size=[_int(p) for p in parts[1].split(",")]))
    except ValueError:
        pass
    raise ValueError(f'granularity "{text}" is not {_GRANULARITY_SYNTAX}')


def _granularity_from_mapping(m: Mapping[str, Any]) -> pb.Granularity:
    kind = m.get("kind")
    extra = set(m) - {"kind", "axis", "block_size"}
    if extra:
        raise ValueError(f"granularity has unknown keys {sorted(extra)}; "
                         "it takes kind, axis and block_size")
    if kind == "per_tensor" and set(m) == {"kind"}:
        return pb.Granularity(per_tensor=pb.PerTensor())
    if kind == "per_channel" and set(m) == {"kind", "axis"}:
        return pb.Granularity(per_channel=pb.PerChannel(axis=int(m["axis"])))
    if kind == "per_block" and "block_size" in m:
        sizes = m["block_size"]
        sizes = [int(sizes)] if isinstance(sizes, int) else [int(b) for b in sizes]
        block = pb.PerBlock(block_size=sizes)
        if m.get("axis") is not None:
            block.axis = int(m["axis"])
        return pb.Granularity(per_block=block)
    raise ValueError(f"granularity {dict(m)} is not per_tensor, per_channel with an axis, "
                     "or per_block with a block_size (and an axis for the single-axis form)")


def granularity(value: GranularityLike) -> pb.Granularity:
    """The qparams.v1.Granularity of `value` (see GranularityLike).

    Only the form is checked here; the server applies the rules (axis range, block
    sizes), and a granularity it refuses raises InvalidArgument at the call.

    Raises:
        ValueError: a malformed string or mapping.
        TypeError: any other type.
    """
    if isinstance(value, pb.Granularity):
        return value
    if isinstance(value, str):
        return _parse_granularity(value)
    if isinstance(value, Mapping):
        return _granularity_from_mapping(value)
    raise TypeError(f"granularity must be a string, a mapping or a qparams.v1.Granularity, "
                    f"not {type(value).__name__}")


def granularity_text(g: pb.Granularity) -> str:
    """The CLI string of `g`, which granularity() parses back to `g` ("per_tensor"
    for a message without a kind, the server's default)."""
    kind = g.WhichOneof("kind")
    if kind == "per_channel":
        return f"per_channel:{g.per_channel.axis}"
    if kind == "per_block":
        sizes = ",".join(str(b) for b in g.per_block.block_size)
        if g.per_block.HasField("axis"):
            return f"per_block:{g.per_block.axis}:{sizes}"
        return f"per_block:{sizes}"
    return "per_tensor"


def _enum(field: str, value: Any, names: Mapping[str, int]) -> int:
    if isinstance(value, str) and value.lower() in names:
        return names[value.lower()]
    if isinstance(value, int) and not isinstance(value, bool) and value in names.values():
        return value
    raise ValueError(f"{field} {value!r} is not one of {', '.join(names)}")


def quant_spec(spec: SpecLike | None = None, **overrides: Any) -> pb.QuantSpec:
    """The qparams.v1.QuantSpec of `spec` with `overrides` applied.

    Keys (all optional; unset ones take the server's defaults):
      dtype: "int8" (default), "uint8", "int4", "float8_e4m3fn", ... (judged by the server)
      qscheme: "symmetric" (default), "asymmetric", "symmetric_with_clipping"
      granularity: see GranularityLike (default per_tensor)
      target: "weight" (default) or "activation"
      quant_min, quant_max: numbers, both or neither
      float_range: (min or None, max or None)
      scale_dtype: "", "float8_e8m0fnu" or "float8_e4m3fn" (NVFP4: float4_e2m1fn_x2,
          per_block)
      range_calculator: "" or "minmax"
      convention: NVFP4 only: "" or "compressed_tensors" (the default), or "modelopt"
    A key whose value is None is not given: it neither sets nor overrides a field.

    Raises:
        ValueError: an unknown key, qscheme or target, or a malformed granularity or
            float_range.
        TypeError: a spec of another type.
    """
    if spec is None:
        out = pb.QuantSpec()
        given: dict[str, Any] = {}
    elif isinstance(spec, pb.QuantSpec):
        out = pb.QuantSpec()
        out.CopyFrom(spec)
        given = {}
    elif isinstance(spec, Mapping):
        out = pb.QuantSpec()
        given = dict(spec)
    else:
        raise TypeError(f"spec must be a mapping or a qparams.v1.QuantSpec, "
                        f"not {type(spec).__name__}")
    given.update((k, v) for k, v in overrides.items() if v is not None)
    unknown = set(given) - set(_SPEC_KEYS)
    if unknown:
        raise ValueError(f"unknown spec keys {sorted(unknown)}; a spec takes "
                         f"{', '.join(_SPEC_KEYS)}")
    for key, value in given.items():
        if value is None:
            continue
        if key in ("dtype", "scale_dtype", "range_calculator", "convention"):
            setattr(out, key, str(value))
        elif key == "qscheme":
            out.qscheme = _enum("qscheme", value, _QSCHEMES)
        elif key == "target":
            out.target = _enum("target", value, _TARGETS)
        elif key == "granularity":
            out.granularity.CopyFrom(granularity(value))
        elif key in ("quant_min", "quant_max"):
            setattr(out, key, float(value))
        elif key == "float_range":
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
                raise ValueError(f"float_range {value!r} is not a pair (min or None, max or None)")
            out.ClearField("float_range")
            if value[0] is not None:
                out.float_range.min = float(value[0])
            if value[1] is not None:
                out.float_range.max = float(value[1])
    return out


def block_shape(g: pb.Granularity, target: int, shape: Sequence[int]) -> tuple[int, ...] | None:
    """The block-size vector B that `g` gives a tensor of `shape` (semantics.md §3), or
    None where it does not fit (an axis out of range, a block size that does not divide
    its dim, a rank mismatch): the caller then sends the tensor itself and the server
    reports why.

    `target` is the spec's qparams.v1.Target: only the single-axis per_block shape
    depends on it (weights block the two leading axes, activations every axis).
    """
    shape = tuple(int(s) for s in shape)
    r = len(shape)
    kind = g.WhichOneof("kind")
    if kind is None or kind == "per_tensor":
        return shape
    if kind == "per_channel":
        a = g.per_channel.axis
        if not -r <= a < r:
            return None
        a %= r
        return tuple(1 if d == a else s for d, s in enumerate(shape))
    block = g.per_block
    if block.HasField("axis"):
        if len(block.block_size) != 1 or block.block_size[0] < 1:
            return None
        a, b = block.axis, block.block_size[0]
        if not -r <= a < r or shape[a] % b:
            return None
        a %= r
        leading = r if target == pb.ACTIVATION else min(2, r)
        return tuple(b if d == a else (1 if d < leading else s) for d, s in enumerate(shape))
    if len(block.block_size) != r:
        return None
    out = []
    for s, b in zip(shape, block.block_size):
        if b == -1:
            out.append(s)
        elif b >= 1 and s % b == 0:
            out.append(b)
        else:
            return None
    return tuple(out)
