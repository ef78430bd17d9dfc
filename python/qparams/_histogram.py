"""Histograms of |x| as the histogram calculators keep them (percentile, entropy, mse;
histogram.md in the project's shared docs), built where a tensor lives.

A histogram here is exactly the server's: bins of width 2^exponent with the canonical
exponent of the values' largest magnitude, integer counts, exact extrema. Binning a
tensor locally and sending its histogram therefore leaves the session in the state the
tensor itself would, bit for bit (histogram.md 2.5, 5.5), and histograms of any parts
of the data merge into the histogram of the whole, whatever the order or the split.
The server validates every histogram it receives; this module only builds and merges
them (the client-side algorithm of histogram.md 5.5).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from qparams._tensors import TensorLike, is_torch_tensor, tensor_request
from qparams.v1 import qparams_pb2 as pb

__all__ = ["Histogram", "Calibration", "canonical_exponent", "local_histogram",
           "histogram_params", "histogram_request", "HistogramParamsLike",
           "NONFINITE_POLICIES"]

#: The nonfinite policies by name, as create_session's histogram= takes them.
NONFINITE_POLICIES = {"reject": pb.NONFINITE_REJECT, "ignore": pb.NONFINITE_IGNORE}

_MIN_EXPONENT = -126

#: The range of each wire integer type of the histogram messages' fields.
_WIRE_RANGES = {"int32": (-2**31, 2**31 - 1), "uint64": (0, 2**64 - 1)}


def _wire_int(field: str, value: int, wire: str) -> int:
    """value, when it fits the wire type of histogram.<field>. Beyond it, protobuf would
    raise a ValueError naming no field: this one names it. Within it, the server judges
    the value by its own rule (histogram.md 3.2, 4)."""
    lo, hi = _WIRE_RANGES[wire]
    if not lo <= value <= hi:
        raise ValueError(f"histogram.{field} is {value}, outside the {wire} range "
                         f"[{lo}, {hi}] of its wire field")
    return value


def canonical_exponent(amax: float, num_bins: int) -> int:
    """The bin exponent of a histogram whose largest magnitude is amax: the smallest
    e >= -126 with amax < num_bins * 2^e (histogram.md 2.2). frexp is exact."""
    if amax == 0:
        return _MIN_EXPONENT
    _, k = math.frexp(amax)
    return max(_MIN_EXPONENT, k - (num_bins.bit_length() - 1))


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What a histogram session's search chose (histogram.md 6).

    Attributes:
        amax: the clipping magnitude; the qparams cover [-amax, amax] ([0, amax] for an
            asymmetric scheme that has seen no negative value).
        bin_index: percentile: the bin whose left edge is amax; entropy: the number of
            bins kept; mse: the bin whose center is amax.
        exponent: the session's bin exponent (bins of width 2^exponent).
        total_count: the finite values observed.
        kl_margin: entropy only: how far the chosen candidate's KL divergence was from
            the tie band (informative); None for the other calculators.
    """

    amax: float
    bin_index: int
    exponent: int
    total_count: int
    kl_margin: float | None = None

    @classmethod
    def from_proto(cls, c: pb.CalibrationResult) -> "Calibration":
        """The Calibration of a qparams.v1.CalibrationResult."""
        return cls(c.amax, c.bin_index, c.exponent, c.total_count,
                   c.kl_margin if c.HasField("kl_margin") else None)


@dataclasses.dataclass(frozen=True)
class Histogram:
    """A histogram of |x| (histogram.md 2.1), as GetHistogram returns it or
    local_histogram builds it.

    Attributes:
        num_bins: N, a power of two in [256, 65536].
        exponent: e: bin k counts the finite x with k*2^e <= |x| < (k+1)*2^e.
        counts: int64 numpy array of the occupied bins 0..M-1 (empty before any finite
            value); later bins are zero.
        zero_count, negative_count: finite values equal to zero, and below zero.
        nan_count, posinf_count, neginf_count: non-finite values (counted under the
            "ignore" policy only).
        min, max: the exact finite extrema, None before any finite value.
    """

    num_bins: int
    exponent: int
    counts: np.ndarray
    zero_count: int = 0
    negative_count: int = 0
    nan_count: int = 0
    posinf_count: int = 0
    neginf_count: int = 0
    min: float | None = None
    max: float | None = None

    @property
    def amax(self) -> float:
        """max(|min|, |max|), 0.0 before any finite value."""
        if self.min is None or self.max is None:
            return 0.0
        return max(abs(self.min), abs(self.max))

    @property
    def total(self) -> int:
        """The finite values counted."""
        return int(self.counts.sum(dtype=np.uint64))

    def bin_edges(self) -> np.ndarray:
        """The M + 1 edges of the occupied bins, k * 2^exponent, as float64."""
        return np.ldexp(np.arange(len(self.counts) + 1, dtype=np.float64), self.exponent)

    def coarsened(self, exponent: int) -> "Histogram":
        """This histogram with bins of width 2^exponent (exponent >= self.exponent):
        bin k moves to k >> (exponent - self.exponent), exactly (histogram.md 2.4)."""
        shift = exponent - self.exponent
        if shift < 0:
            raise ValueError(f"exponent {exponent} is below the histogram's {self.exponent}; "
                             "a histogram only coarsens")
        counts = self.counts
        if shift and len(counts):
            counts = _sum_by(np.arange(len(counts), dtype=np.int64) >> min(shift, 63), counts)
        return dataclasses.replace(self, exponent=exponent, counts=counts)

    def merged(self, other: "Histogram") -> "Histogram":
        """The histogram of both histograms' values (histogram.md 2.4): exact, and the
        same whatever the order or grouping of merges."""
        if other.num_bins != self.num_bins:
            raise ValueError(f"num_bins differ ({self.num_bins} and {other.num_bins}); "
                             "only histograms of one session's num_bins merge")
        mins = [v for v in (self.min, other.min) if v is not None]
        maxs = [v for v in (self.max, other.max) if v is not None]
        lo = min(mins) if mins else None
        hi = max(maxs) if maxs else None
        amax = 0.0 if lo is None else max(abs(lo), abs(hi))
        e = canonical_exponent(amax, self.num_bins)
        a, b = self.coarsened(e).counts, other.coarsened(e).counts
        length = max(len(a), len(b))
        counts = np.zeros(length, dtype=np.int64)
        counts[:len(a)] += a
        counts[:len(b)] += b
        return Histogram(self.num_bins, e, counts,
                         self.zero_count + other.zero_count,
                         self.negative_count + other.negative_count,
                         self.nan_count + other.nan_count,
                         self.posinf_count + other.posinf_count,
                         self.neginf_count + other.neginf_count,
                         _positive_zero(lo), _positive_zero(hi))

    def to_proto(self) -> pb.HistogramObservation:
        """The HistogramObservation an observation of this histogram sends.

        Raises ValueError naming the field for a value its wire type cannot hold (a
        num_bins or exponent beyond int32, a negative count or one of 2^64 or more); the
        server judges the others."""
        h = pb.HistogramObservation(
            num_bins=_wire_int("num_bins", self.num_bins, "int32"),
            exponent=_wire_int("exponent", self.exponent, "int32"),
            **{field: _wire_int(field, getattr(self, field), "uint64")
               for field in ("zero_count", "negative_count", "nan_count", "posinf_count",
                             "neginf_count")})
        counts = np.asarray(self.counts)
        # local_histogram's int64 counts are never negative: only others are checked
        # one by one.
        if counts.dtype.kind != "u" and not (counts.dtype.kind == "i"
                                            and (counts.size == 0 or counts.min() >= 0)):
            for k, count in enumerate(counts.tolist()):
                _wire_int(f"counts[{k}]", count, "uint64")
        h.counts[:] = counts.tolist()
        if self.min is not None:
            h.min = self.min
        if self.max is not None:
            h.max = self.max
        return h

    @classmethod
    def from_proto(cls, h: pb.HistogramObservation) -> "Histogram":
        """The Histogram of a HistogramObservation (GetHistogram's reply). Counts above
        2^63 - 1, which no session holds (it holds fewer than 2^62 values), raise
        OverflowError."""
        return cls(h.num_bins, h.exponent, np.array(h.counts, dtype=np.int64), h.zero_count,
                   h.negative_count, h.nan_count, h.posinf_count, h.neginf_count,
                   h.min if h.HasField("min") else None, h.max if h.HasField("max") else None)


def _sum_by(target: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Σ counts[k] over each target bin, in int64 (np.bincount's weights are float64,
    which would round counts above 2^53)."""
    out = np.zeros(int(target[-1]) + 1, dtype=np.int64)
    np.add.at(out, target, counts.astype(np.int64, copy=False))
    return out


def _positive_zero(v: float | None) -> float | None:
    """v with a zero stored as +0.0 (extrema compare by value; histogram.md 2.1)."""
    return None if v is None else v + 0.0


def local_histogram(x: TensorLike, num_bins: int, *, nonfinite: str = "reject") -> Histogram:
    """The histogram of |x| with num_bins bins, binned where x lives (histogram.md 5.5):
    a torch tensor on its own device with torch.bincount, a numpy array with numpy.

    Values are widened exactly before they are scaled: float16, bfloat16 and float32 to
    float32, float64 stays float64; counts are int64. The result equals the server's
    histogram of the same tensor bit for bit.

    nonfinite: "reject" (a NaN or infinity raises ValueError, as the server would
    refuse the tensor) or "ignore" (they are counted in the side counts only).

    Raises:
        TypeError: x is not a float numpy array or torch tensor.
        ValueError: x has no elements; num_bins is not a power of two in [256, 65536];
            a non-finite value under "reject"; a float64 magnitude of 2^128 or more.
    """
    if num_bins < 256 or num_bins > 65536 or num_bins & (num_bins - 1):
        raise ValueError(f"num_bins {num_bins} is not a power of two in [256, 65536]")
    if nonfinite not in NONFINITE_POLICIES:
        raise ValueError(f"nonfinite {nonfinite!r} is not one of "
                         f"{', '.join(NONFINITE_POLICIES)}")
    if is_torch_tensor(x):
        return _torch_histogram(x, num_bins, nonfinite)
    if isinstance(x, np.ndarray) and x.dtype.kind == "f":
        return _numpy_histogram(x, num_bins, nonfinite)
    raise TypeError(f"expected a float numpy array or torch tensor, not {type(x).__name__}"
                    + (f" of {x.dtype}" if hasattr(x, "dtype") else ""))


def _torch_histogram(x: Any, num_bins: int, nonfinite: str) -> Histogram:
    import torch
    if not x.is_floating_point():
        raise TypeError(f"tensor dtype {x.dtype} is not a floating-point dtype")
    if x.numel() == 0:
        raise ValueError("x has no elements")
    v = x.detach().reshape(-1)
    v = v.double() if v.dtype == torch.float64 else v.float()  # exact widening
    side = (0, 0, 0)
    lo, hi = (float(t) for t in torch.aminmax(v))  # NaN if any value is NaN
    if not (math.isfinite(lo) and math.isfinite(hi)):
        finite_mask = torch.isfinite(v)
        nan = int(torch.count_nonzero(torch.isnan(v)))
        posinf = int(torch.count_nonzero(v == math.inf))
        _check_nonfinite(nonfinite, nan)
        side = (nan, posinf, v.numel() - nan - posinf - int(torch.count_nonzero(finite_mask)))
        v = v[finite_mask]
        if v.numel() == 0:
            return Histogram(num_bins, _MIN_EXPONENT, np.zeros(0, np.int64), 0, 0, *side)
        lo, hi = (float(t) for t in torch.aminmax(v))
    amax = max(abs(lo), abs(hi))
    _check_magnitude(amax)
    e = canonical_exponent(amax, num_bins)
    # -0.0 >= 0: not negative. (count_nonzero: a bool tensor's sum() is several
    # times slower on CPU.)
    negative_count = 0 if lo >= 0 else int(torch.count_nonzero(v < 0))
    # The product is exact when it is at least 1 and floors to 0 below; 2^-e is a
    # float32 (and float64) value for every canonical e. It is below num_bins <= 2^16,
    # so truncating to int32 is the floor (histogram.md 5.5's .long(), narrower).
    bins = v.abs().mul_(math.ldexp(1.0, -e)).to(torch.int32)
    counts = torch.bincount(bins, minlength=math.floor(math.ldexp(amax, -e)) + 1)
    zero_count = int(torch.count_nonzero(v == 0)) if int(counts[0]) else 0
    return Histogram(num_bins, e, counts.cpu().numpy().astype(np.int64, copy=False),
                     zero_count, negative_count, *side,
                     _positive_zero(lo), _positive_zero(hi))


def _numpy_histogram(x: np.ndarray, num_bins: int, nonfinite: str) -> Histogram:
    if x.size == 0:
        raise ValueError("x has no elements")
    v = x.reshape(-1)
    # Widen exactly; numpy would otherwise scale a float16 array in float16.
    v = v.astype(np.float64 if v.dtype.itemsize == 8 else np.float32)
    side = (0, 0, 0)
    lo, hi = float(v.min()), float(v.max())  # NaN if any value is NaN
    if not (math.isfinite(lo) and math.isfinite(hi)):
        finite_mask = np.isfinite(v)
        nan = int(np.count_nonzero(np.isnan(v)))
        posinf = int(np.count_nonzero(v == np.inf))
        _check_nonfinite(nonfinite, nan)
        side = (nan, posinf, v.size - nan - posinf - int(np.count_nonzero(finite_mask)))
        v = v[finite_mask]
        if v.size == 0:
            return Histogram(num_bins, _MIN_EXPONENT, np.zeros(0, np.int64), 0, 0, *side)
        lo, hi = float(v.min()), float(v.max())
    amax = max(abs(lo), abs(hi))
    _check_magnitude(amax)
    e = canonical_exponent(amax, num_bins)
    scaled = np.abs(v) * v.dtype.type(math.ldexp(1.0, -e))
    counts = np.bincount(scaled.astype(np.int32), minlength=math.floor(math.ldexp(amax, -e)) + 1)
    zero_count = int(np.count_nonzero(v == 0)) if counts[0] else 0
    negative_count = 0 if lo >= 0 else int(np.count_nonzero(v < 0))
    return Histogram(num_bins, e, counts.astype(np.int64, copy=False),
                     zero_count, negative_count, *side,
                     _positive_zero(lo), _positive_zero(hi))


def _check_nonfinite(nonfinite: str, nan: int) -> None:
    if nonfinite == "reject":
        raise ValueError(
            f"x holds {'NaN' if nan else 'an infinity'}; the session's nonfinite policy is "
            "reject (create it with histogram={'nonfinite': 'ignore'} to count them aside)")


def _check_magnitude(amax: float) -> None:
    if amax >= 2.0 ** 128:
        raise ValueError(f"x holds a magnitude of {amax!r}, at least 2^128, beyond float32's "
                         "range of the histogram calculators")


#: create_session's histogram=: a dict of HistogramParams' fields (nonfinite by name,
#: "reject" or "ignore") or the message itself.
HistogramParamsLike = Mapping[str, Any] | pb.HistogramParams | None

_PARAM_KEYS = ("num_bins", "percentile", "start_bin", "stride", "skip_zeros", "nonfinite")


def histogram_params(value: Mapping[str, Any] | pb.HistogramParams) -> pb.HistogramParams:
    """The HistogramParams message of a dict (or the message itself). A key left out
    takes the server's default; the server validates the values.

    Raises ValueError for an unknown key or nonfinite name or an integer beyond its wire
    field's int32 (naming the field), TypeError for a value of the wrong type."""
    if isinstance(value, pb.HistogramParams):
        return value
    unknown = sorted(set(value) - set(_PARAM_KEYS))
    if unknown:
        raise ValueError(f"histogram: unknown key {unknown[0]!r}; the keys are "
                         f"{', '.join(_PARAM_KEYS)}")
    params = pb.HistogramParams()
    for key, v in value.items():
        if key == "nonfinite":
            if v not in NONFINITE_POLICIES:
                raise ValueError(f"histogram: nonfinite {v!r} is not one of "
                                 f"{', '.join(NONFINITE_POLICIES)}")
            v = NONFINITE_POLICIES[v]
        elif key == "skip_zeros":
            if not isinstance(v, bool):
                raise TypeError(f"histogram: skip_zeros must be a bool, not {type(v).__name__}")
        elif key == "percentile":
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise TypeError(f"histogram: percentile must be a number, not {type(v).__name__}")
        elif isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"histogram: {key} must be an int, not {type(v).__name__}")
        else:
            v = _wire_int(key, v, "int32")
        setattr(params, key, v)
    return params


def nonfinite_name(params: pb.HistogramParams) -> str:
    """The nonfinite policy of resolved params, by name ("reject" when unspecified)."""
    return "ignore" if params.nonfinite == pb.NONFINITE_IGNORE else "reject"


def histogram_request(name: str, x: TensorLike, params: pb.HistogramParams,
                      reduce: str) -> pb.ObserveRequest:
    """The ObserveRequest for x on a histogram session with resolved params `params`.

    reduce: "always" sends x's histogram, binned where x lives; "auto" sends it when x
    has more bytes than twice num_bins (about what a histogram of small counts takes on
    the wire), else x; "never" sends x. x goes whole whenever the server would refuse it
    (no elements, a non-finite value under "reject", a magnitude of 2^128 or more), so
    that the error is the one the tensor itself gets; otherwise the session ends in the
    same state either way, bit for bit.
    """
    if reduce == "never" or (reduce == "auto" and _nbytes(x) <= 2 * params.num_bins):
        return tensor_request(name, x)
    try:
        histogram = local_histogram(x, params.num_bins, nonfinite=nonfinite_name(params))
    except ValueError:
        return tensor_request(name, x)
    request = pb.ObserveRequest(name=name)
    request.histogram.CopyFrom(histogram.to_proto())
    return request


def _nbytes(x: TensorLike) -> int:
    """x's bytes on the wire if sent whole (0 for what is not a tensor: the tensor
    path then reports it)."""
    if is_torch_tensor(x):
        return x.numel() * x.element_size()
    return int(getattr(x, "nbytes", 0))
