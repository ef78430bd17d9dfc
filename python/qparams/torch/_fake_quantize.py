"""RemoteFakeQuantize: a torch.ao fake-quantize module whose running state is a
step-merged qparams session (docs/qat.md), shared by every data-parallel rank."""

from __future__ import annotations

import struct

import warnings
from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch.ao.quantization.fake_quantize import FakeQuantizeBase
from torch.ao.quantization.observer import (MinMaxObserver, MovingAverageMinMaxObserver,
                                            MovingAveragePerChannelMinMaxObserver,
                                            PerChannelMinMaxObserver)
from torch.ao.quantization.utils import calculate_qmin_qmax

from qparams._spec import quant_spec
from qparams._tensors import block_ranges, fill_range
from qparams.v1 import qparams_pb2 as pb

__all__ = ["RemoteFakeQuantize"]

_CALCULATORS = ("moving_average", "global_minmax", "static")
# torch.ao observers a QConfig may name, and the session calculator that stands for each.
_OBSERVERS = {MovingAverageMinMaxObserver: "moving_average",
              MovingAveragePerChannelMinMaxObserver: "moving_average",
              MinMaxObserver: "global_minmax", PerChannelMinMaxObserver: "global_minmax"}
_QSCHEMES = {torch.per_tensor_affine: ("asymmetric", False),
             torch.per_tensor_symmetric: ("symmetric", False),
             torch.per_channel_affine: ("asymmetric", True),
             torch.per_channel_symmetric: ("symmetric", True)}
_DEFAULT_EPS = torch.finfo(torch.float32).eps


class _StepRun(Protocol):
    """What a RemoteFakeQuantize uses of the run that drives it (a QATRun): typed so,
    since qparams/torch/_qat_run.py imports this module and not the reverse."""

    lag: int
    current_step: int | None

    def _forward_at_lag_0(self, module: RemoteFakeQuantize, reduced: Any) -> None:
        """Contributes `module`'s range `reduced` to the current step and reads as of it."""


class _ObserverView:
    """What torch.ao reads of a FakeQuantize's `activation_post_process` (prepare_fx's
    backend constraint checks read quant_min, quant_max and eps there): a view of the
    module's own attributes. Not a module, so that convert leaves it alone."""

    def __init__(self, fake_quantize: "RemoteFakeQuantize") -> None:
        self._fake_quantize = fake_quantize

    def __getattr__(self, name: str) -> Any:
        if name in ("quant_min", "quant_max", "eps", "dtype", "qscheme", "ch_axis",
                    "reduce_range", "calculate_qparams"):
            return getattr(self._fake_quantize, name)
        raise AttributeError(name)


def _union(a: torch.Tensor, b: torch.Tensor, minimum: bool) -> torch.Tensor:
    """The elementwise minimum (or maximum) of two block ranges, with the server's rule
    for an equal -0 and +0 (the minimum takes -0, the maximum +0), so that the union
    of a step's forwards does not depend on their order. NaN propagates (the server
    then refuses the contribution, naming it)."""
    if minimum:
        pick, signed = torch.minimum(a, b), torch.where(torch.signbit(a), a, b)
    else:
        pick, signed = torch.maximum(a, b), torch.where(torch.signbit(a), b, a)
    return torch.where(a == b, signed, pick)


class RemoteFakeQuantize(FakeQuantizeBase):
    """A torch.ao fake-quantize module (torch.ao.quantization.FakeQuantize's contract)
    whose running range lives in a step-merged qparams session: every data-parallel
    rank contributes its range of each training step, the server applies the
    calculator once per step on the merged range, and every rank fake-quantizes with
    the same qparams, bit for bit what one process computes on the global batch
    (docs/qat.md, "Training with RemoteFakeQuantize").

    Use it where a QConfig names FakeQuantize, with torch.ao's prepare_qat or
    prepare_qat_fx, then drive the training loop with qparams.torch.QATRun:

        qconfig = QConfig(
            activation=RemoteFakeQuantize.with_args(dtype=torch.quint8),
            weight=RemoteFakeQuantize.with_args(dtype=torch.qint8,
                                                qscheme=torch.per_channel_symmetric))
        model.qconfig = qconfig
        prepared = prepare_qat(model.train())
        run = QATRun(client, prepared, prefix="job42/")  # names and creates the sessions
        for s, (x, y) in enumerate(batches):
            run.step(s)                      # one Step call: contributions and reads
            loss_fn(prepared(x), y).backward(); optimizer.step(); optimizer.zero_grad()
        run.finish()
        quantized = convert(prepared.eval())

    forward(x): while the observer is enabled, x's range (its minimum and maximum, per
    channel for a per-channel qscheme; amin/amax where x lives) is united with the
    module's range for the current step (several forwards in one step: their union;
    the step, not the forward, is the unit of update); QATRun sends it with its next
    step call. Then, while fake quantization is enabled, x is fake-quantized with the
    `scale` and `zero_point` buffers (torch.fake_quantize_per_tensor_affine or
    _per_channel_affine), which QATRun sets from the session as of step s - lag. Before
    the session is initialized (no applied step carried a range and nothing was
    calibrated before the run) x passes through unchanged, with one warning. A
    module QATRun treats as a weight's (the weight fake-quant of nn.qat Linear and
    Conv, nn.intrinsic.qat LinearReLU and ConvReLU) does not observe in forward: the
    run reduces the parent's `weight` itself at each step.

    Without a run the module only fake-quantizes with its buffers (set by a run, or
    loaded with load_state_dict).

    Args (torch.ao's FakeQuantize and observer arguments, with their meaning):
        observer: optional, for QConfigs written for FakeQuantize: a torch.ao observer
            class choosing the calculator (MovingAverage[PerChannel]MinMaxObserver:
            "moving_average"; [PerChannel]MinMaxObserver: "global_minmax"). Its
            statistics are the session's, never an in-process observer's.
        quant_min, quant_max: a custom integer range, both or neither (torch.ao's
            checks: within the dtype, including 0).
        dtype: torch.quint8 (default) or torch.qint8.
        qscheme: torch.per_tensor_affine (default), per_tensor_symmetric,
            per_channel_affine or per_channel_symmetric.
        reduce_range: halve the quantized range, as torch.ao does.
        ch_axis: the channel axis of the per-channel qschemes (default 0).
        eps: accepted for torch.ao's constraint checks; must be the default (the
            session computes the scale by coreai_opt's rule).
        averaging_constant: moving_average's constant c (default 0.01), the session's.
        factory_kwargs: the device of the scale and zero_point buffers (nn.qat modules
            pass theirs).
    qparams' arguments:
        calculator: "moving_average" (default), "global_minmax" or "static" (the
            step's range alone). moving_average is coreai_opt's, which averages the
            zero-clamped range; torch.ao's MovingAverageMinMaxObserver averages the
            raw one.
        name: the session's full name; default: QATRun names it after the layer
            (prefix + "fc1.output", "fc1.weight", ...), as name_observers does.

    Attributes and buffers as FakeQuantize's: dtype, qscheme, ch_axis, quant_min,
    quant_max, is_per_channel, fake_quant_enabled, observer_enabled, scale (float32,
    [1] per-tensor, [C] per-channel; empty before the session is initialized) and
    zero_point (int32, same shape). state_dict() holds the four buffers;
    load_state_dict() takes their shapes.

    Raises:
        ValueError, TypeError, AssertionError: an argument torch.ao or qparams refuses.
    """

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(self, observer: type | None = None, quant_min: int | None = None,
                 quant_max: int | None = None, *, dtype: torch.dtype = torch.quint8,
                 qscheme: torch.qscheme = torch.per_tensor_affine, reduce_range: bool = False,
                 ch_axis: int = 0, eps: float = _DEFAULT_EPS,
                 averaging_constant: float = 0.01, calculator: str | None = None,
                 name: str | None = None,
                 factory_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        from_observer = None
        if observer is not None:
            from_observer = _OBSERVERS.get(observer)  # type: ignore[call-overload]
            if from_observer is None:
                raise ValueError(
                    f"observer {observer!r} has no session counterpart; use "
                    "MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver, "
                    "MinMaxObserver or PerChannelMinMaxObserver (or calculator=...)")
        if calculator is None:
            calculator = from_observer or "moving_average"
        elif from_observer is not None and from_observer != calculator:
            raise ValueError(f"observer {observer.__name__} means calculator "
                             f"{from_observer!r}, not {calculator!r}")
        if calculator not in _CALCULATORS:
            raise ValueError(f"calculator {calculator!r} is not one of {', '.join(_CALCULATORS)} "
                             "(the range calculators step-merged sessions apply)")
        if dtype not in (torch.quint8, torch.qint8):
            raise ValueError(f"dtype {dtype} is not torch.quint8 or torch.qint8")
        if qscheme not in _QSCHEMES:
            raise ValueError(f"qscheme {qscheme} is not per_tensor_affine, per_tensor_symmetric, "
                             "per_channel_affine or per_channel_symmetric")
        if not isinstance(ch_axis, int) or isinstance(ch_axis, bool):
            raise TypeError(f"ch_axis must be an int, not {ch_axis!r}")
        if eps != _DEFAULT_EPS:
            raise ValueError("eps is torch.ao's smallest scale; the session computes the scale "
                             "by coreai_opt's rule, so only the default is accepted")
        if not 0.0 < float(averaging_constant) <= 1.0:
            raise ValueError(f"averaging_constant must be in (0, 1], not {averaging_constant!r}")
        if (quant_min is None) != (quant_max is None):
            raise ValueError("quant_min and quant_max go together (both or neither)")
        custom = quant_min is not None
        if custom:
            # torch.ao's FakeQuantize and observer checks, with their messages.
            assert quant_min <= quant_max, "quant_min must be less than or equal to quant_max"
            assert torch.iinfo(dtype).min <= quant_min, "quant_min out of bound"
            assert quant_max <= torch.iinfo(dtype).max, "quant_max out of bound"
            assert quant_min <= 0 <= quant_max, "Used-specified quantization range must include 0."
            assert quant_min < quant_max, \
                "qmin must be strictly less than qmax for user-specified quantization range."
        if qscheme in (torch.per_tensor_symmetric, torch.per_channel_symmetric) and \
                reduce_range and dtype == torch.quint8:
            raise NotImplementedError("Cannot reduce range for symmetric quantization for quint8")
        self.quant_min, self.quant_max = calculate_qmin_qmax(
            quant_min, quant_max, custom, dtype, reduce_range)  # type: ignore[arg-type]
        self.dtype = dtype
        self.qscheme = qscheme
        self.reduce_range = reduce_range
        self.is_per_channel = _QSCHEMES[qscheme][1]
        self.ch_axis = ch_axis if self.is_per_channel else -1
        self.eps = eps
        self.calculator = calculator
        self.averaging_constant = float(averaging_constant)
        device = torch.nn.factory_kwargs(factory_kwargs).get("device")
        self.register_buffer("scale", torch.tensor([], dtype=torch.float, device=device))
        self.register_buffer("zero_point", torch.tensor([], dtype=torch.int, device=device))
        self.activation_post_process = _ObserverView(self)
        self._name = name
        self._auto_name = name is None
        # Set by a QATRun: its role for this module ("activation": observed in forward,
        # lag L; "weight": the parent's weight, reduced by the run at lag 0).
        self._run: _StepRun | None = None
        self._role = "activation"
        # This module's range of the current step: (input_shape, lo, hi, counts).
        self._pending: tuple[tuple[int, ...], torch.Tensor, torch.Tensor, list[int]] | None = None
        self._warned = False

    # ------------------------------------------------------------------ properties

    @property
    def session_name(self) -> str | None:
        """The session's name: given, or set by QATRun after the layer; None before."""
        return self._name

    @property
    def initialized(self) -> bool:
        """Whether the buffers hold qparams (a step or a calibration gave a range)."""
        return self.scale.numel() > 0

    def quant_spec(self, target: str) -> pb.QuantSpec:
        """The session's spec for this module: its dtype, qscheme, channel axis and
        integer range, for `target` "weight" or "activation"."""
        # Asked for on every forward: built once per set of the attributes it reads.
        key = (target, self.dtype, self.qscheme, self.quant_min, self.quant_max, self.ch_axis)
        cached = self.__dict__.get("_quant_spec")
        if cached is None or cached[0] != key:
            qscheme, per_channel = _QSCHEMES[self.qscheme]
            spec = quant_spec(dtype="uint8" if self.dtype == torch.quint8 else "int8",
                              qscheme=qscheme, target=target, quant_min=self.quant_min,
                              quant_max=self.quant_max,
                              granularity=f"per_channel:{self.ch_axis}" if per_channel
                              else "per_tensor")
            cached = self.__dict__["_quant_spec"] = (key, spec)
        return cached[1]

    # ------------------------------------------------------------------ fake-quantize API

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Observes X's range into the current step (see the class), then fake-quantizes
        X with the scale and zero_point buffers; passes X through before the session is
        initialized (one warning)."""
        if self.observer_enabled[0] == 1 and self._role == "activation":
            self._observe(X)
        if self.fake_quant_enabled[0] != 1:
            return X
        if not self.initialized:
            if not self._warned:
                self._warned = True
                warnings.warn(f"RemoteFakeQuantize {self._name or '(unnamed)'}: the session "
                              "holds no range yet (no step applied one and nothing was "
                              "calibrated before the run): passing inputs through unchanged "
                              "until it does")
            return X
        if self.is_per_channel:
            return torch.fake_quantize_per_channel_affine(
                X, self.scale, self.zero_point, self.ch_axis % X.dim(), self.quant_min,
                self.quant_max)
        return torch.fake_quantize_per_tensor_affine(X, self.scale, self.zero_point,
                                                     self.quant_min, self.quant_max)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (scale, zero_point) convert takes: the buffers' values (float32 scales;
        zero points int32 for the affine qschemes, int64 for the symmetric ones, as
        torch.ao's observers give them). Before the session is initialized: a warning
        and ([1.0], [0]), as torch.ao's observers without data."""
        if not self.initialized:
            warnings.warn(f"RemoteFakeQuantize {self._name or '(unnamed)'} has no qparams "
                          "(its session saw no range); returning the default scale 1.0 and "
                          "zero point 0, as torch.ao's observers do")
            return torch.tensor([1.0]), torch.tensor([0])
        affine = self.qscheme in (torch.per_tensor_affine, torch.per_channel_affine)
        return (self.scale.detach().clone(),
                self.zero_point.detach().to(torch.int32 if affine else torch.int64))

    def extra_repr(self) -> str:
        """FakeQuantize's repr, then the session, calculator and constant."""
        return (f"fake_quant_enabled={self.fake_quant_enabled}, "
                f"observer_enabled={self.observer_enabled}, quant_min={self.quant_min}, "
                f"quant_max={self.quant_max}, dtype={self.dtype}, qscheme={self.qscheme}, "
                f"ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}, "
                f"session={self._name!r}, calculator={self.calculator!r}, "
                f"averaging_constant={self.averaging_constant}")

    # ------------------------------------------------------------------ state

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict,
                              strict: bool, missing_keys: list, unexpected_keys: list,
                              error_msgs: list) -> None:
        # As FakeQuantize: the buffers take the saved shapes (empty before the session
        # was initialized, [1] or [C] after).
        for key, buffer in ((prefix + "scale", self.scale),
                            (prefix + "zero_point", self.zero_point)):
            if key in state_dict:
                buffer.resize_(state_dict[key].shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def __getstate__(self) -> dict[str, Any]:
        """The state copy.deepcopy and pickle take: all but the run (its client is
        this process's; torch.ao's convert deep-copies the model)."""
        state = self.__dict__.copy()
        state["_run"] = None
        return state

    # ------------------------------------------------------------------ the run's side

    def set_qparams(self, scale: torch.Tensor, zero_point: torch.Tensor) -> None:
        """Sets the buffers in place (their tensors stay the same objects, which DDP's
        buffer broadcast holds on to), on their device."""
        scale = scale.reshape(-1).to(self.scale.device, torch.float)
        zero_point = zero_point.reshape(-1).to(self.zero_point.device, torch.int)
        if self.scale.shape != scale.shape:
            self.scale.resize_(scale.shape)
            self.zero_point.resize_(zero_point.shape)
        self.scale.copy_(scale)
        self.zero_point.copy_(zero_point)

    def _reduce(self, x: torch.Tensor) -> tuple[tuple[int, ...], torch.Tensor, torch.Tensor,
                                                 list[int]] | None:
        """x's block range under this module's granularity: (input_shape, lo, hi, N);
        None for an empty x. Per-tensor inputs are flattened (as RemoteObserver sends
        them), so any rank fits one session."""
        x = x.detach()
        if x.numel() == 0:
            return None
        if not self.is_per_channel:
            x = x.reshape(-1)
        reduced = block_ranges(x, self.quant_spec("activation"))
        if reduced is None:
            raise ValueError(f"RemoteFakeQuantize {self._name or '(unnamed)'}: channel axis "
                             f"{self.ch_axis} does not fit an input of shape {tuple(x.shape)}")
        lo, hi, counts = reduced
        return tuple(int(s) for s in x.shape), lo, hi, counts

    def _observe(self, X: torch.Tensor) -> None:
        reduced = self._reduce(X)
        if reduced is None:
            return
        run = self._run
        if run is not None and run.lag == 0 and run.current_step is not None:
            run._forward_at_lag_0(self, reduced)  # contributes and reads now
            return
        self._pending = self._united(self._pending, reduced)

    def _united(self, have: Any, new: Any) -> Any:
        """The union of two reduced ranges of this module (None: none yet)."""
        if have is None:
            return new
        shape, lo, hi, counts = have
        if list(new[3]) != list(counts) or new[1].dtype != lo.dtype:
            raise ValueError(
                f"RemoteFakeQuantize {self._name or '(unnamed)'}: an input of block counts "
                f"{new[3]} in {new[1].dtype} after one of {counts} in {lo.dtype} in the same "
                "step; a session takes one shape and dtype")
        return (shape, _union(lo, new[1], True), _union(hi, new[2], False), counts)

    def _take_range(self) -> pb.RangeObservation | None:
        """This step's range as a RangeObservation (None: the module did not run), and
        a fresh range for the next step."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        return range_observation(pending)


def range_observation(reduced: tuple[tuple[int, ...], torch.Tensor, torch.Tensor, list[int]]
                      ) -> pb.RangeObservation:
    """The RangeObservation of a reduced range (input_shape, lo, hi, N). Non-finite
    values go as they are: the server refuses them, naming the value."""
    shape, lo, hi, counts = reduced
    message = pb.RangeObservation()
    if lo.dtype == torch.float32 and lo.numel() == 1 and list(counts) == [1]:
        # Per tensor, the common case, without fill_range's general tensor encoding
        # (the same bytes: one little-endian float32 each).
        message.input_shape[:] = [int(s) for s in shape]
        for field, value in ((message.min, lo), (message.max, hi)):
            field.dtype = pb.FLOAT32
            field.shape[:] = [1]
            field.data = struct.pack("<f", float(value))
        return message
    fill_range(message, shape, lo, hi, counts)
    return message
