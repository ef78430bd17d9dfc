"""Exported documents into Python values: the tensors of an ExportSessions document.

The server renders every export format (see docs/exports.md);
this module only decodes what it wrote. A tensor is written as a JSON object
{"dtype": "float32" | "int8" | ..., "shape": [...], "data": [flat row-major list]}.
A "float8_e4m3fn" tensor's data are its bytes (0..255); it decodes to a torch.uint8
tensor of those bytes tagged as e4m3 (is_e4m3), since not every torch has float8
dtypes (on one that does, `t.view(torch.float8_e4m3fn)` reads the values).

torch is imported only when tensors are decoded, so numpy users need no torch.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from qparams._errors import (FailedPrecondition, FusedGlobalScalesDiffer, QParamsError,
                             UncalibratedGroup)

__all__ = ["require_torch", "decode_tensor", "decode_compressed_tensors", "decode_modelopt",
           "is_e4m3", "mark_e4m3", "E4M3_DTYPE", "refine_export_error"]

# The exported dtype of NVFP4 block scales, and the attribute that tags their tensors.
E4M3_DTYPE = "float8_e4m3fn"
_DTYPE_TAG = "qparams_dtype"

# The dtypes a tensor entry may name, as numpy dtypes (the values are parsed through
# numpy, then handed to torch without a copy).
_NUMPY_DTYPES = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "bool": np.bool_, E4M3_DTYPE: np.uint8,
}


# The server's refusals of NVFP4 exports that name sessions (export/exporter.cc); the
# message stays the server's, the names become attributes.
_FUSED = re.compile(r"no GLOBAL_AMAX scale group covers them: (?P<listed>.*?); declare a "
                    r"scale group of them \(CreateScaleGroup with share GLOBAL_AMAX and "
                    r"members (?P<members>[^)]*)\)")
_LISTED = re.compile(r"(\S+) \(([^)]*)\)")
_UNCALIBRATED = re.compile(r"scale group (?P<group>\S+) \(members (?P<members>[^)]*)\) has "
                           r"uncalibrated members (?P<uncalibrated>.*?), so it has no shared")
_FILLED_WEIGHT = re.compile(r"scale group (?P<group>\S+) fills session (?P<session>\S+), "
                            r"which never saw data")


def refine_export_error(error: QParamsError) -> QParamsError:
    """`error`, or for an export refused over fused siblings or a scale group's
    uncalibrated members the FailedPrecondition subclass that names them
    (FusedGlobalScalesDiffer, UncalibratedGroup), with the same message."""
    if type(error) is not FailedPrecondition:
        return error
    message = error.message
    kwargs = {"session": error.session, "owner": error.owner}
    if m := _FUSED.search(message):
        scales = []
        for _, text in _LISTED.findall(m["listed"]):
            try:
                scales.append(float(text))
            except ValueError:
                scales = []
                break
        return FusedGlobalScalesDiffer(message, tuple(m["members"].split(", ")),
                                       tuple(scales), **kwargs)
    if m := _UNCALIBRATED.search(message):
        return UncalibratedGroup(message, m["group"], tuple(m["members"].split(", ")),
                                 tuple(m["uncalibrated"].split(", ")), **kwargs)
    if m := _FILLED_WEIGHT.search(message):
        return UncalibratedGroup(message, m["group"], (), (m["session"],), **kwargs)
    return error


def require_torch() -> Any:
    """The torch module; ImportError saying what needs it if torch is not installed."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("qparams: decoding exported tensors needs PyTorch (torch), which "
                          "is not installed; install Debian's python3-torch, or use "
                          "Client.export() for the JSON document itself") from e
    return torch


def is_e4m3(tensor: Any) -> bool:
    """Whether `tensor` was decoded from a "float8_e4m3fn" entry: a torch.uint8 tensor
    whose bytes are float8_e4m3fn codes (NVFP4 block scales). The tag is an attribute
    of that tensor object; a tensor computed from it does not carry it."""
    return getattr(tensor, _DTYPE_TAG, None) == E4M3_DTYPE


def mark_e4m3(tensor: Any) -> Any:
    """Tags the torch.uint8 tensor `tensor` as float8_e4m3fn codes (is_e4m3) and
    returns it."""
    setattr(tensor, _DTYPE_TAG, E4M3_DTYPE)
    return tensor


def decode_tensor(entry: Mapping[str, Any], name: str = "tensor") -> Any:
    """The torch tensor of one exported tensor entry ({"dtype", "shape", "data"}).
    A "float8_e4m3fn" entry gives a torch.uint8 tensor of its bytes, tagged (is_e4m3).

    Args:
        entry: the JSON object of the tensor.
        name: the tensor's name, for error messages.

    Returns:
        A torch.Tensor of the entry's dtype and shape.

    Raises:
        ImportError: torch is not installed.
        ValueError: a malformed entry (unknown dtype, data not of the shape's size,
            values out of the dtype's range).
    """
    torch = require_torch()
    if not isinstance(entry, Mapping) or not {"dtype", "shape", "data"} <= set(entry):
        raise ValueError(f"exported tensor {name!r} is not an object with dtype, shape "
                         "and data")
    dtype = _NUMPY_DTYPES.get(entry["dtype"])
    if dtype is None:
        raise ValueError(f"exported tensor {name!r} has dtype {entry['dtype']!r}, not one of "
                         f"{', '.join(_NUMPY_DTYPES)}")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"exported tensor {name!r} has shape {shape!r}, not a list of "
                         "sizes")
    data = entry["data"]
    if not isinstance(data, list) or len(data) != math.prod(shape):
        raise ValueError(f"exported tensor {name!r} of shape {shape} holds "
                         f"{len(data) if isinstance(data, list) else 'no list of'} values, "
                         f"not {math.prod(shape)}")
    if np.issubdtype(dtype, np.integer):
        wide = np.array(data, dtype=np.int64) if data else np.zeros(0, np.int64)
        info = np.iinfo(dtype)
        if wide.size and (wide.min() < info.min or wide.max() > info.max):
            raise ValueError(f"exported tensor {name!r} holds values outside {entry['dtype']}")
        array = wide.astype(dtype)
    else:
        # JSON numbers are parsed as doubles; a float32 written with enough digits
        # rounds back to itself exactly.
        array = np.array(data, dtype=np.float64).astype(dtype)
    # np.array, not np.ascontiguousarray, which makes a scalar (shape []) 1-D.
    tensor = torch.from_numpy(np.array(array.reshape(tuple(shape)), order="C"))
    return mark_e4m3(tensor) if entry["dtype"] == E4M3_DTYPE else tensor


def _decode_document(text: str, format: str, config_key: str
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors, document[config_key]) of an export document with "tensors"."""
    require_torch()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the {format} export is not JSON: {e}") from None
    if (not isinstance(document, dict) or not isinstance(document.get("tensors"), dict)
            or not isinstance(document.get(config_key), dict)):
        raise ValueError(f"the {format} export has no tensors and {config_key} objects")
    state_dict = {key: decode_tensor(entry, key) for key, entry in document["tensors"].items()}
    return state_dict, document[config_key]


def decode_compressed_tensors(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state_dict, quantization_config) of a "compressed-tensors" export document.

    Raises:
        ImportError: torch is not installed.
        ValueError: the text is not such a document (malformed JSON, a missing key, a
            malformed tensor).
    """
    return _decode_document(text, "compressed-tensors", "quantization_config")


def decode_modelopt(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state_dict, hf_quant_config) of a "modelopt" export document: the NVFP4 scale
    tensors and the content of ModelOpt's hf_quant_config.json.

    Raises:
        ImportError: torch is not installed.
        ValueError: the text is not such a document (malformed JSON, a missing key, a
            malformed tensor).
    """
    return _decode_document(text, "modelopt", "hf_quant_config")
