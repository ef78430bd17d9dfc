"""Tensors onto the wire: numpy arrays and torch tensors as qparams.v1.Tensor raw
bytes, and their block minima and maxima as a RangeObservation.

torch is imported only when a torch tensor is passed, so numpy users need no torch.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from qparams._spec import block_shape
from qparams.v1 import qparams_pb2 as pb

__all__ = ["TensorLike", "is_torch_tensor", "fill_tensor", "block_ranges", "fill_range",
           "range_request", "tensor_request", "check_reduce"]

#: A numpy array (float32, float16, float64) or a torch tensor (float32, float16,
#: bfloat16, float64; any device, any strides).
TensorLike = Any

_NUMPY_DTYPES = {np.dtype(np.float32): pb.FLOAT32, np.dtype(np.float16): pb.FLOAT16,
                 np.dtype(np.float64): pb.FLOAT64}
_LITTLE_ENDIAN = sys.byteorder == "little"
_WIRE_NUMPY = {pb.FLOAT32: "<f4", pb.FLOAT16: "<f2", pb.FLOAT64: "<f8"}
_NUMPY_NAMES = "float32, float16 or float64"
_TORCH_NAMES = "float32, float16, bfloat16 or float64"
_REDUCE = ("auto", "always", "never")


def is_torch_tensor(x: Any) -> bool:
    """Whether x is a torch.Tensor (without importing torch when nobody has)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


@functools.lru_cache(maxsize=None)
def _torch_dtypes() -> dict:
    import torch
    return {torch.float32: pb.FLOAT32, torch.float16: pb.FLOAT16,
            torch.bfloat16: pb.BFLOAT16, torch.float64: pb.FLOAT64}


def _wire_dtype(x: Any) -> int:
    """The wire DType of x. TypeError for anything that is not a supported tensor."""
    if is_torch_tensor(x):
        dtype = _torch_dtypes().get(x.dtype)
        if dtype is None:
            raise TypeError(f"tensor dtype {x.dtype} is not supported; qparams observes "
                            f"{_TORCH_NAMES} tensors")
        return dtype
    if isinstance(x, np.ndarray):
        dtype = _NUMPY_DTYPES.get(x.dtype)
        if dtype is None and x.dtype.kind == "f":  # another byte order
            dtype = _NUMPY_DTYPES.get(x.dtype.newbyteorder("="))
        if dtype is None:
            raise TypeError(f"array dtype {x.dtype} is not supported; qparams observes "
                            f"{_NUMPY_NAMES} arrays")
        return dtype
    raise TypeError(f"expected a numpy array or a torch tensor, not {type(x).__name__}")


def _raw_bytes(x: Any) -> bytes:
    """x's values as little-endian, row-major bytes (the wire's layout)."""
    if isinstance(x, np.ndarray):
        little = x.dtype.byteorder == "<" or (x.dtype.byteorder == "=" and _LITTLE_ENDIAN)
        if little and x.flags.c_contiguous:  # the common case: the bytes as they are
            return x.tobytes()
        return np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<")).tobytes()
    if is_torch_tensor(x):
        import torch
        if x.requires_grad:
            x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        x = x.contiguous()
        if x.dtype == torch.bfloat16:  # numpy has no bfloat16: send its 16 bits as they are
            x = x.view(torch.int16)
        return x.numpy().tobytes()
    raise TypeError(f"expected a numpy array or a torch tensor, not {type(x).__name__}")


def fill_tensor(tensor: pb.Tensor, x: TensorLike, dtype: int | None = None) -> None:
    """Sets the empty message `tensor` (a field of the request) to x; dtype: x's wire
    dtype, if known. In place: a Tensor passed to a message's constructor is copied,
    data and all (twice the time of the whole request for a small tensor).

    Raises TypeError for an unsupported type or dtype."""
    tensor.dtype = _wire_dtype(x) if dtype is None else dtype
    tensor.shape.extend(x.shape)
    tensor.data = _raw_bytes(x)


def _block_ranges(x: TensorLike, block: Sequence[int]) -> tuple[Any, Any, list[int]]:
    """The min and max of every block of x, where x's dims are whole multiples of block,
    computed on x's own device, and N, the block counts per dim.

    x is viewed as (N0, B0, N1, B1, ...) without its dims of size 1 (a free reshape of
    the same row-major order) and reduced over the B axes; the minima and maxima come
    back in that compact shape, whose row-major order is N's. (amin and amax: torch's
    one-pass aminmax is slower over a leading axis and has no half precision on CPU.)
    """
    counts, view, inner = [], [], []
    for s, b in zip(x.shape, block):
        n = s // b
        counts.append(n)
        if n > 1:
            view.append(n)
        if b > 1:
            inner.append(len(view))
            view.append(b)
    blocks = x.reshape(view)
    if not inner:
        return blocks, blocks, counts
    if is_torch_tensor(x):
        return blocks.amin(dim=inner), blocks.amax(dim=inner), counts
    # A whole reduction gives numpy scalars: asarray makes them arrays again.
    return (np.asarray(blocks.min(axis=tuple(inner))), np.asarray(blocks.max(axis=tuple(inner))),
            counts)


def _finite(data: bytes, dtype: int) -> bool:
    """Whether the raw little-endian values `data` of wire dtype `dtype` are all finite."""
    if dtype == pb.BFLOAT16:  # not finite: all 8 exponent bits set
        return bool(((np.frombuffer(data, "<u2") & 0x7F80) != 0x7F80).all())
    return bool(np.isfinite(np.frombuffer(data, _WIRE_NUMPY[dtype])).all())


def tensor_request(name: str, x: TensorLike, dtype: int | None = None) -> pb.ObserveRequest:
    """An ObserveRequest carrying x whole (dtype: x's wire dtype, if known)."""
    request = pb.ObserveRequest(name=name)
    fill_tensor(request.tensor, x, dtype)
    return request


def _block_of(x: TensorLike, spec: pb.QuantSpec) -> tuple[int, ...] | None:
    """The block shape `spec` gives x, None where it does not fit (or x is empty)."""
    shape = tuple(int(s) for s in x.shape)
    return block_shape(spec.granularity, spec.target, shape) if shape and math.prod(shape) \
        else None


def block_ranges(x: TensorLike, spec: pb.QuantSpec) -> tuple[Any, Any, list[int]] | None:
    """The minima and maxima of x's blocks under the resolved `spec`, computed where x
    lives (torch: amin/amax on its device), and N, the block counts per dim; None
    where the granularity does not fit x (no elements, a rank or block size it does
    not divide): the caller then sends x whole and the server reports why. The one
    reduction of a tensor to its range (observe, compute, step contributions)."""
    block = _block_of(x, spec)
    return None if block is None else _block_ranges(x, block)


def fill_range(r: pb.RangeObservation, input_shape: Sequence[int], lo: Any, hi: Any,
               counts: Sequence[int], dtype: int | None = None) -> bool:
    """Sets the empty message `r` (a field of the request: filled in place) to the block
    minima `lo` and maxima `hi` (of N = `counts`) of an input of `input_shape`, in the
    wire dtype `dtype` (default: lo's). Returns whether every value is finite (a
    caller that wants the tensor's own error sends the tensor instead)."""
    dtype = _wire_dtype(lo) if dtype is None else dtype
    lo_bytes, hi_bytes = _raw_bytes(lo), _raw_bytes(hi)
    r.input_shape[:] = [int(s) for s in input_shape]
    for tensor, data in ((r.min, lo_bytes), (r.max, hi_bytes)):
        tensor.dtype, tensor.data = dtype, data
        tensor.shape[:] = counts
    return _finite(lo_bytes, dtype) and _finite(hi_bytes, dtype)


def check_reduce(reduce: str) -> None:
    """ValueError unless `reduce` is one of auto, always, never."""
    if reduce not in _REDUCE:
        raise ValueError(f"reduce {reduce!r} is not one of {', '.join(_REDUCE)}")


def range_request(name: str, x: TensorLike, spec: pb.QuantSpec, reduce: str) -> pb.ObserveRequest:
    """The ObserveRequest for x on a session whose resolved spec is `spec`.

    reduce: "always" sends each block's min and max, "never" the tensor, "auto" the
    smaller of the two. The tensor goes whole whenever the server's answer would be an
    error (no elements, a granularity that does not fit the shape, a NaN or Inf), so that
    the error is exactly the one the tensor itself gets; otherwise the results are
    bit-identical, the min and max of a block being exact in any precision.
    """
    dtype = _wire_dtype(x)
    if reduce == "never":
        return tensor_request(name, x, dtype)
    block = _block_of(x, spec)
    if block is None:
        return tensor_request(name, x, dtype)
    numel = math.prod(int(s) for s in x.shape)
    if reduce == "auto" and 2 * (numel // math.prod(block)) >= numel:
        return tensor_request(name, x, dtype)
    lo, hi, counts = _block_ranges(x, block)
    request = pb.ObserveRequest(name=name)
    if not fill_range(request.range, x.shape, lo, hi, counts, dtype):
        return tensor_request(name, x, dtype)
    return request
