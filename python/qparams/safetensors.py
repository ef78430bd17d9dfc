"""A small reader and writer of safetensors files, for the checkpoints of NVFP4
exports (nvfp4.md §6), since Debian has no safetensors package.

The layout (huggingface/safetensors): an 8-byte little-endian unsigned header length
N, then N bytes of a UTF-8 JSON object {name: {"dtype", "shape", "data_offsets":
[begin, end]}} with an optional "__metadata__" object of strings, padded with spaces;
then the tensors' data, row-major and little-endian, offsets relative to the end of
the header, contiguous with no holes. The writer pads the header so that the data
start 8-byte aligned and orders the tensors by element size, largest first, then by
name (as the reference writer does), so that every tensor is aligned to its element.

torch 1.13 has no float8 dtype: an F8_E4M3 tensor loads as a torch.uint8 tensor of
its codes, tagged (qparams.is_e4m3), and save writes such tagged tensors, or the
uint8 tensors named in `e4m3`, as F8_E4M3.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from qparams._export import is_e4m3, mark_e4m3

__all__ = ["SafetensorsError", "SafetensorsFile", "save", "load", "DTYPES"]

# safetensors dtype -> (torch dtype of the loaded tensor, little-endian numpy dtype
# of its bytes). bfloat16 travels as int16, F8_E4M3 as its uint8 codes.
DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "F64": (torch.float64, "<f8"), "F32": (torch.float32, "<f4"),
    "F16": (torch.float16, "<f2"), "BF16": (torch.bfloat16, "<i2"),
    "I64": (torch.int64, "<i8"), "I32": (torch.int32, "<i4"),
    "I16": (torch.int16, "<i2"), "I8": (torch.int8, "i1"), "U8": (torch.uint8, "u1"),
    "BOOL": (torch.bool, "?"), "F8_E4M3": (torch.uint8, "u1"),
}
_BY_TORCH = {torch_dtype: name for name, (torch_dtype, _) in DTYPES.items()
             if name != "F8_E4M3"}
_METADATA = "__metadata__"
_ALIGN = 8
# The reference implementation's limit, which also bounds what a bad length can make
# the reader allocate.
_MAX_HEADER = 100 << 20


class SafetensorsError(ValueError):
    """A malformed safetensors file, or tensors or metadata save cannot write."""


class SafetensorsFile(NamedTuple):
    """What load returns: the tensors by name, in file order, and the __metadata__
    strings ({} if none)."""

    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str]


def _raw(tensor: torch.Tensor) -> tuple[str, bytes]:
    """A tensor's safetensors dtype and little-endian bytes."""
    t = tensor.detach().cpu().contiguous()
    float8 = getattr(torch, "float8_e4m3fn", None)
    if float8 is not None and t.dtype == float8:  # torch >= 2.1
        t = t.view(torch.uint8)
        name = "F8_E4M3"
    elif is_e4m3(tensor):
        name = "F8_E4M3"
    elif t.dtype in _BY_TORCH:
        name = _BY_TORCH[t.dtype]
    else:
        raise SafetensorsError(f"cannot write dtype {t.dtype} to safetensors")
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    array = t.numpy()
    return name, array.astype(np.dtype(DTYPES[name][1]), copy=False).tobytes()


def save(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike[str],
         metadata: Mapping[str, str] | None = None, e4m3: Iterable[str] = ()) -> None:
    """Writes `tensors` to the safetensors file `path`.

    Args:
        tensors: torch tensors by name, on any device: float64/32/16, bfloat16,
            int64/32/16/8, uint8 or bool (and float8_e4m3fn on a torch that has it).
        path: the file to write (replaced if it exists).
        metadata: the "__metadata__" strings, if any.
        e4m3: names of uint8 tensors holding float8_e4m3fn codes, written as F8_E4M3
            (tensors tagged by qparams.is_e4m3, as load and the exports return them,
            are written so without being named).

    Raises:
        SafetensorsError: a name that is not a string or is "__metadata__", a value
            that is not a tensor, a dtype safetensors cannot hold, metadata that is
            not strings, or an e4m3 name that is not a uint8 tensor.
    """
    e4m3 = set(e4m3)
    for name in e4m3:
        t = tensors.get(name)
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8:
            raise SafetensorsError(f"e4m3 names {name!r}, which is not a uint8 tensor in "
                                   "tensors")
    entries = []
    for name, tensor in tensors.items():
        if not isinstance(name, str) or name == _METADATA:
            raise SafetensorsError(f"a tensor cannot be named {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise SafetensorsError(f"{name!r} is a {type(tensor).__name__}, not a torch "
                                   "tensor")
        dtype, data = _raw(tensor)
        if name in e4m3:
            dtype = "F8_E4M3"
        itemsize = np.dtype(DTYPES[dtype][1]).itemsize
        entries.append((-itemsize, name, dtype, list(tensor.shape), data))
    entries.sort(key=lambda e: (e[0], e[1]))
    header: dict[str, Any] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("metadata must map strings to strings")
        header[_METADATA] = dict(metadata)
    offset = 0
    for _, name, dtype, shape, data in entries:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % _ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for *_, data in entries:
            f.write(data)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        twice = sorted({k for k, _ in pairs if [p[0] for p in pairs].count(k) > 1})
        raise SafetensorsError(f"the header names {twice} more than once")
    return result


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def load(path: str | os.PathLike[str]) -> SafetensorsFile:
    """The tensors and metadata of the safetensors file `path`, on the CPU.

    F8_E4M3 tensors load as torch.uint8 tensors of their codes, tagged
    (qparams.is_e4m3); every other dtype of DTYPES loads as its torch dtype.

    Raises:
        SafetensorsError: the file is malformed: shorter than its header length says,
            a header that is not a JSON object (or names a key twice), an entry without
            a known dtype, a shape or two data offsets, a byte range that does not
            match its shape, ranges that overlap or leave holes, or data left over.
        OSError: the file cannot be read.
    """
    with open(path, "rb") as f:
        buf = f.read()
    if len(buf) < 8:
        raise SafetensorsError(f"{path}: {len(buf)} bytes, too short for the 8-byte header "
                               "length")
    (n,) = struct.unpack_from("<Q", buf)
    if n > _MAX_HEADER:
        raise SafetensorsError(f"{path}: the header length {n} exceeds {_MAX_HEADER}")
    if 8 + n > len(buf):
        raise SafetensorsError(f"{path}: the header length {n} exceeds the "
                               f"{len(buf) - 8} bytes after it")
    raw = buf[8:8 + n]
    if not raw.startswith(b"{"):
        raise SafetensorsError(f"{path}: the header does not start with '{{'")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: the header is not UTF-8 JSON: {e}") from e
    metadata = header.pop(_METADATA, None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str)
                                                 for v in metadata.values()):
        raise SafetensorsError(f"{path}: __metadata__ is not an object of strings")
    data = memoryview(buf)[8 + n:]
    spans = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise SafetensorsError(f"{path}: {name!r} lacks dtype, shape or data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES:
            raise SafetensorsError(f"{path}: {name!r} has dtype {dtype!r}, which this reader "
                                   f"does not know (it knows {', '.join(DTYPES)})")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise SafetensorsError(f"{path}: {name!r} has shape {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_count(o) for o in offsets) or offsets[0] > offsets[1]):
            raise SafetensorsError(f"{path}: {name!r} has data_offsets {offsets!r}")
        itemsize = np.dtype(DTYPES[dtype][1]).itemsize
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if offsets[1] - offsets[0] != count * itemsize:
            raise SafetensorsError(f"{path}: {name!r} ({dtype} {shape}) needs "
                                   f"{count * itemsize} bytes, data_offsets {offsets} "
                                   f"hold {offsets[1] - offsets[0]}")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise SafetensorsError(f"{path}: {name!r} starts at {begin}, not at {end}: "
                                   + ("it overlaps the tensor before it" if begin < end
                                      else "a hole before it"))
        end = stop
    if end != len(data):
        raise SafetensorsError(f"{path}: the tensors hold {end} bytes, the file {len(data)} "
                               "after its header")
    tensors = {name: _tensor(data, entry) for name, entry in header.items()}
    return SafetensorsFile(tensors, dict(metadata))


def _tensor(data: memoryview, entry: dict[str, Any]) -> torch.Tensor:
    """The CPU tensor of one header entry, copied out of the file's bytes."""
    torch_dtype, layout = DTYPES[entry["dtype"]]
    begin, end = entry["data_offsets"]
    array = np.frombuffer(data[begin:end], np.dtype(layout))
    tensor = torch.from_numpy(array.astype(array.dtype.newbyteorder("="))
                              .reshape(entry["shape"]))
    if torch_dtype == torch.bfloat16:
        tensor = tensor.view(torch.bfloat16)
    return mark_e4m3(tensor) if entry["dtype"] == "F8_E4M3" else tensor
