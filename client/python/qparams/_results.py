"""Result types: quantization parameters as numpy arrays (or torch tensors)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from qparams._errors import QParamsError, error_from_status
from qparams.v1 import qparams_pb2 as pb

__all__ = ["QParams", "ObserveResult", "stream_outcome"]

_PRECISIONS = {pb.DTYPE_UNSPECIFIED: None, pb.FLOAT32: "float32", pb.FLOAT16: "float16",
               pb.BFLOAT16: "bfloat16", pb.FLOAT64: "float64"}


class QParams:
    """Quantization parameters, as get_qparams returns them.

    The arrays are made from the wire message on first access, so that a calibration
    loop that ignores each observation's result does not pay for them.

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
    The arrays are numpy arrays, or torch tensors after to_torch().
    """

    __slots__ = ("_q", "initialized", "_torch", "_arrays")

    def __init__(self, q: pb.QParams, initialized: bool = True, *, torch: bool = False) -> None:
        self._q = q
        self.initialized = initialized
        self._torch = torch
        self._arrays: dict[str, Any] = {}

    @classmethod
    def from_proto(cls, q: pb.QParams, initialized: bool = True) -> "QParams":
        """The QParams of a qparams.v1.QParams message (e.g. a Session's qparams)."""
        return cls(q, initialized)

    def to_proto(self) -> pb.QParams:
        """The wire message these parameters came from."""
        return self._q

    def to_torch(self) -> "QParams":
        """The same parameters with torch tensors in place of the numpy arrays: scale
        and minval float32, zero_point int32."""
        return QParams(self._q, self.initialized, torch=True)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._q.shape)

    @property
    def precision(self) -> str | None:
        return _PRECISIONS.get(self._q.precision)

    @property
    def scale(self) -> Any:
        return self._array("scale", np.float32)

    @property
    def zero_point(self) -> Any:
        return self._array("zero_point", np.int32) if self._q.has_zero_point else None

    @property
    def minval(self) -> Any:
        return self._array("minval", np.float32) if self._q.has_minval else None

    def _array(self, field: str, dtype: Any) -> Any:
        array = self._arrays.get(field)
        if array is None:
            array = np.array(getattr(self._q, field), dtype=dtype).reshape(self.shape)
            if self._torch:
                import torch
                array = torch.from_numpy(array)
            self._arrays[field] = array
        return array

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QParams):
            return NotImplemented
        return (self._q == other._q and self.initialized == other.initialized
                and self._torch == other._torch)

    __hash__ = None  # mutable arrays inside

    def __repr__(self) -> str:
        return (f"QParams(shape={self.shape}, scale={self.scale!r}, "
                f"zero_point={self.zero_point!r}, minval={self.minval!r}, "
                f"precision={self.precision!r}, initialized={self.initialized})")

    def __getstate__(self) -> tuple:
        return (self._q.SerializeToString(), self.initialized, self._torch)

    def __setstate__(self, state: tuple) -> None:
        self._q = pb.QParams.FromString(state[0])
        self.initialized, self._torch = state[1], state[2]
        self._arrays = {}


@dataclasses.dataclass(frozen=True)
class ObserveResult:
    """The outcome of one observation.

    Attributes:
        qparams: the qparams the forward returned, or None for an observation sent
            with omit_qparams.
        observation_count: the session's computing forwards after this one.
    """

    qparams: QParams | None
    observation_count: int

    @classmethod
    def from_response(cls, response: pb.ObserveResponse) -> "ObserveResult":
        """The result an (accepted) ObserveResponse carries."""
        qparams = QParams.from_proto(response.qparams) if response.HasField("qparams") else None
        return cls(qparams, response.observation_count)


def stream_outcome(response: pb.ObserveResponse, session: str) -> ObserveResult | QParamsError:
    """The outcome of one ObserveStream or ObserveBatch response: its result, or the
    error its status carries, naming `session`, the session of the request it answers."""
    if response.status.code != 0:
        error = error_from_status(response.status.code, response.status.message)
        error.session = session
        return error
    return ObserveResult.from_response(response)
