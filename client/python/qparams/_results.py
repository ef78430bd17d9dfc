"""Result types: quantization parameters as numpy arrays."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from qparams.v1 import qparams_pb2 as pb

__all__ = ["QParams", "ObserveResult"]

_PRECISIONS = {pb.DTYPE_UNSPECIFIED: None, pb.FLOAT32: "float32", pb.FLOAT16: "float16",
               pb.BFLOAT16: "bfloat16", pb.FLOAT64: "float64"}


@dataclasses.dataclass(frozen=True)
class QParams:
    """Quantization parameters, as get_qparams returns them.

    Attributes:
        shape: N, the number of blocks per input dim ((0,) before the first forward).
        scale: float32 array of shape `shape`.
        zero_point: int32 array of shape `shape`, or None for floating-point dtypes
            and e8m0 scales.
        minval: float32 array of shape `shape`, or None where there is none.
        precision: the dtype the values were computed in ("float32", "float16",
            "bfloat16", "float64"), or None while empty.
        initialized: whether a computing forward has filled the buffers (always True
            for results of compute and observe).
    """

    shape: tuple[int, ...]
    scale: np.ndarray
    zero_point: np.ndarray | None
    minval: np.ndarray | None
    precision: str | None
    initialized: bool = True

    @classmethod
    def from_proto(cls, q: pb.QParams, initialized: bool = True) -> "QParams":
        """The QParams of a qparams.v1.QParams message (e.g. a Session's qparams)."""
        shape = tuple(q.shape)
        # Empty buffers have shape (0,) but no values to reshape.
        def arr(values: Any, dtype: Any) -> np.ndarray:
            return np.asarray(values, dtype=dtype).reshape(shape)
        return cls(
            shape=shape,
            scale=arr(q.scale, np.float32),
            zero_point=arr(q.zero_point, np.int32) if q.has_zero_point else None,
            minval=arr(q.minval, np.float32) if q.has_minval else None,
            precision=_PRECISIONS.get(q.precision),
            initialized=initialized,
        )

    def to_torch(self) -> "QParams":
        """The same parameters with torch tensors (sharing memory) in place of the numpy
        arrays: scale and minval float32, zero_point int32."""
        import torch
        return dataclasses.replace(
            self, scale=torch.from_numpy(self.scale),
            zero_point=None if self.zero_point is None else torch.from_numpy(self.zero_point),
            minval=None if self.minval is None else torch.from_numpy(self.minval))


@dataclasses.dataclass(frozen=True)
class ObserveResult:
    """The outcome of one observation.

    Attributes:
        qparams: the qparams the forward returned.
        observation_count: the session's computing forwards after this one.
    """

    qparams: QParams
    observation_count: int
