"""Exported documents into Python values: the tensors of an ExportSessions document.

The server renders every export format (see docs/exports.md);
this module only decodes what it wrote. A tensor is written as a JSON object
{"dtype": "float32" | "int8" | ..., "shape": [...], "data": [flat row-major list]}.

torch is imported only when tensors are decoded, so numpy users need no torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["require_torch", "decode_tensor", "decode_compressed_tensors"]

# The dtypes a tensor entry may name, as numpy dtypes (the values are parsed through
# numpy, then handed to torch without a copy).
_NUMPY_DTYPES = {
    "float32": np.float32, "float64": np.float64, "float16": np.float16,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "bool": np.bool_,
}


def require_torch() -> Any:
    """The torch module; ImportError saying what needs it if torch is not installed."""
    try:
        import torch
    except ImportError as e:
        raise ImportError("qparams: decoding exported tensors needs PyTorch (torch), which "
                          "is not installed; install Debian's python3-torch, or use "
                          "Client.export() for the JSON document itself") from e
    return torch


def decode_tensor(entry: Mapping[str, Any], name: str = "tensor") -> Any:
    """The torch tensor of one exported tensor entry ({"dtype", "shape", "data"}).

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
    return torch.from_numpy(np.ascontiguousarray(array.reshape(shape)))


def decode_compressed_tensors(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state_dict, quantization_config) of a "compressed-tensors" export document.

    Raises:
        ImportError: torch is not installed.
        ValueError: the text is not such a document (malformed JSON, a missing key, a
            malformed tensor).
    """
    require_torch()
    try:
        document = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the compressed-tensors export is not JSON: {e}") from None
    if (not isinstance(document, dict) or not isinstance(document.get("tensors"), dict)
            or not isinstance(document.get("quantization_config"), dict)):
        raise ValueError("the compressed-tensors export has no tensors and "
                         "quantization_config objects")
    state_dict = {key: decode_tensor(entry, key) for key, entry in document["tensors"].items()}
    return state_dict, document["quantization_config"]
