"""Result types: quantization parameters as numpy arrays (or torch tensors)."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, Optional

import numpy as np

from qparams._errors import QParamsError, error_from_status
from qparams._histogram import Calibration
from qparams.v1 import qparams_pb2 as pb

__all__ = ["QParams", "ObserveResult", "ScaleGroup", "GroupMember", "GroupQParams",
           "stream_outcome", "SHARES"]

_PRECISIONS = {pb.DTYPE_UNSPECIFIED: None, pb.FLOAT32: "float32", pb.FLOAT16: "float16",
               pb.BFLOAT16: "bfloat16", pb.FLOAT64: "float64"}


#: ScaleGroup.share's values, by their wire enum (docs/scale_groups.md).
SHARES = {"global_amax": pb.ScaleGroup.GLOBAL_AMAX, "union_range": pb.ScaleGroup.UNION_RANGE}
_SHARE_NAMES = {value: key for key, value in SHARES.items()}


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
        scale_e4m3: NVFP4 (scale_dtype "float8_e4m3fn") only: uint8 array of shape
            `shape`, each block scale's float8_e4m3fn code (scale holds their values);
            None where there are none (other scale dtypes, and before the first
            computing forward).
        global_scale: NVFP4 only: the float32 global scale (compressed_tensors: gs,
            modelopt: scale_2), or None.
        amax: NVFP4 only: the tensor amax, widened to float32, or None.
        precision: the dtype the values were computed in ("float32", "float16",
            "bfloat16", "float64"), or None while empty.
        initialized: whether a computing forward has filled the buffers (always True
            for results of compute and observe, but for a histogram session's that has
            seen no finite value).
        calibration: a histogram session's Calibration (the amax its search chose,
            ...), None for the other calculators and before the first value.
    The arrays are numpy arrays, or torch tensors after to_torch().
    """

    __slots__ = ("_q", "initialized", "_torch", "_arrays", "calibration")

    def __init__(self, q: pb.QParams, initialized: bool = True, *, torch: bool = False,
                 calibration: Calibration | None = None) -> None:
        self._q = q
        self.initialized = initialized
        self._torch = torch
        self._arrays: dict[str, Any] = {}
        self.calibration = calibration

    @classmethod
    def from_proto(cls, q: pb.QParams, initialized: bool = True,
                   calibration: pb.CalibrationResult | None = None) -> "QParams":
        """The QParams of a qparams.v1.QParams message (e.g. a Session's qparams), with
        a histogram session's CalibrationResult if given."""
        return cls(q, initialized,
                   calibration=None if calibration is None else Calibration.from_proto(calibration))

    def to_proto(self) -> pb.QParams:
        """The wire message these parameters came from."""
        return self._q

    def to_torch(self) -> "QParams":
        """The same parameters with torch tensors in place of the numpy arrays: scale
        and minval float32, zero_point int32."""
        return QParams(self._q, self.initialized, torch=True, calibration=self.calibration)

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

    @property
    def scale_e4m3(self) -> Any:
        return self._array("scale_e4m3", np.uint8) if self._q.scale_e4m3 else None

    @property
    def global_scale(self) -> float | None:
        return self._q.global_scale if self._q.HasField("global_scale") else None

    @property
    def amax(self) -> float | None:
        return self._q.amax if self._q.HasField("amax") else None

    def _array(self, field: str, dtype: Any) -> Any:
        array = self._arrays.get(field)
        if array is None:
            value = getattr(self._q, field)
            if isinstance(value, bytes):  # the e4m3 codes
                array = np.frombuffer(value, dtype=dtype).copy().reshape(self.shape)
            else:
                array = np.array(value, dtype=dtype).reshape(self.shape)
            if self._torch:
                import torch
                array = torch.from_numpy(array)
            self._arrays[field] = array
        return array

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QParams):
            return NotImplemented
        return (self._q == other._q and self.initialized == other.initialized
                and self._torch == other._torch and self.calibration == other.calibration)

    __hash__ = None  # mutable arrays inside

    def __repr__(self) -> str:
        return (f"QParams(shape={self.shape}, scale={self.scale!r}, "
                f"zero_point={self.zero_point!r}, minval={self.minval!r}, "
                f"precision={self.precision!r}, initialized={self.initialized}"
                + (f", scale_e4m3={self.scale_e4m3!r}, global_scale={self.global_scale!r}, "
                   f"amax={self.amax!r}" if self._q.HasField("global_scale") else "")
                + (f", calibration={self.calibration!r})" if self.calibration else ")"))

    def __getstate__(self) -> tuple:
        return (self._q.SerializeToString(), self.initialized, self._torch, self.calibration)

    def __setstate__(self, state: tuple) -> None:
        self._q = pb.QParams.FromString(state[0])
        self.initialized, self._torch = state[1], state[2]
        self.calibration = state[3] if len(state) > 3 else None
        self._arrays = {}


@dataclasses.dataclass(frozen=True)
class ObserveResult:
    """The outcome of one observation.

    Attributes:
        qparams: the qparams the forward returned, or None for an observation sent
            with omit_qparams.
        observation_count: the session's computing forwards after this one.
        calibration: a histogram session's Calibration beside the qparams (None with
            omit_qparams, for other calculators, and before the first finite value).
        duplicate: the observation had been applied before (a retry after a lost
            answer, docs/retries.md): nothing was applied now, observation_count is
            the count after the original, qparams the session's current ones.
    """

    qparams: QParams | None
    observation_count: int
    calibration: Calibration | None = None
    duplicate: bool = False

    def __repr__(self) -> str:
        text = f"ObserveResult(qparams={self.qparams!r}, observation_count={self.observation_count}"
        text += f", calibration={self.calibration!r}" if self.calibration else ""
        return text + (", duplicate=True)" if self.duplicate else ")")

    @classmethod
    def from_response(cls, response: pb.ObserveResponse) -> "ObserveResult":
        """The result an (accepted) ObserveResponse carries."""
        calibration = (response.calibration if response.HasField("calibration") else None)
        # Empty qparams: a histogram session that has seen no finite value yet (only
        # non-finite ones, under its "ignore" policy).
        qparams = (QParams.from_proto(response.qparams, list(response.qparams.shape) != [0],
                                      calibration)
                   if response.HasField("qparams") else None)
        return cls(qparams, response.observation_count,
                   None if calibration is None else Calibration.from_proto(calibration),
                   response.duplicate)


def stream_outcome(response: pb.ObserveResponse, session: str) -> ObserveResult | QParamsError:
    """The outcome of one ObserveStream or ObserveBatch response: its result, or the
    error its status carries, naming `session`, the session of the request it answers."""
    if response.status.code != 0:
        error = error_from_status(response.status.code, response.status.message)
        error.session = session
        if response.status.owner:
            error.owner = response.status.owner
        return error
    return ObserveResult.from_response(response)


@dataclasses.dataclass(frozen=True)
class ScaleGroup:
    """A scale group (docs/scale_groups.md): sessions of one resolved spec that share
    their scales.

    Attributes:
        name: the group's name.
        members: the member sessions' names, in the group's order.
        share: "global_amax" (NVFP4: one global scale) or "union_range" (per_tensor:
            one qparams from the union of the members' ranges).
        fill_uncalibrated: global_amax only: uncalibrated members take the group's
            global scale once one member is calibrated.
        create_time: when the server created it (UTC), or None if it did not say.
    """

    name: str
    members: tuple[str, ...]
    share: str
    fill_uncalibrated: bool
    create_time: Optional[datetime.datetime]

    @classmethod
    def from_proto(cls, group: pb.ScaleGroup) -> "ScaleGroup":
        """The ScaleGroup of a qparams.v1.ScaleGroup message."""
        # A share this client does not know keeps its wire name, lowercased.
        share = _SHARE_NAMES.get(group.share) or pb.ScaleGroup.Share.Name(group.share).lower()
        create_time = (group.create_time.ToDatetime(tzinfo=datetime.timezone.utc)
                       if group.HasField("create_time") else None)
        return cls(group.name, tuple(group.members), share, group.fill_uncalibrated,
                   create_time)


@dataclasses.dataclass(frozen=True)
class GroupMember:
    """One member's part of a global_amax group's result.

    Attributes:
        name: the member session.
        qparams: its qparams, with the group's global scale (shape (0,) and
            `initialized` False for a member filled under fill_uncalibrated).
        amax: the member's own amax, or None for a filled member.
    """

    name: str
    qparams: QParams
    amax: Optional[float]

    @classmethod
    def from_proto(cls, member: pb.GroupMember) -> "GroupMember":
        """The GroupMember of a qparams.v1.GroupMember message."""
        return cls(member.name,
                   QParams.from_proto(member.qparams, list(member.qparams.shape) != [0]),
                   member.amax if member.HasField("amax") else None)


@dataclasses.dataclass(frozen=True)
class GroupQParams:
    """A scale group's shared result, as get_group_qparams returns it.

    Attributes:
        group: the group's name.
        initialized: False while a member is uncalibrated (unless fill_uncalibrated
            and one is calibrated); the other fields are then empty.
        uncalibrated: the members without a computing forward, in member order.
        amax: global_amax: the largest of the calibrated members' amax (else 0.0).
        global_scale: global_amax: the shared global scale, compressed_tensors' gs or
            modelopt's scale_2 (else 0.0).
        members: global_amax: every member's qparams, in member order (else empty).
        min, max: union_range: the union of the members' ranges (else 0.0).
        qparams: union_range: the one qparams (shape (1,)) every member uses; None
            for global_amax and while not initialized.
    """

    group: str
    initialized: bool
    uncalibrated: tuple[str, ...]
    amax: float
    global_scale: float
    members: tuple[GroupMember, ...]
    min: float
    max: float
    qparams: Optional[QParams]

    @classmethod
    def from_proto(cls, result: pb.GroupQParams) -> "GroupQParams":
        """The GroupQParams of a qparams.v1.GroupQParams message."""
        return cls(result.group, result.initialized, tuple(result.uncalibrated),
                   result.amax, result.global_scale,
                   tuple(GroupMember.from_proto(m) for m in result.members),
                   result.min, result.max,
                   QParams.from_proto(result.qparams) if result.HasField("qparams") else None)
