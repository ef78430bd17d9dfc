"""RemoteObserver: a torch.ao observer whose statistics live in a qparams session."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.ao.quantization.observer import UniformQuantizationObserverBase

from qparams._errors import AlreadyExists, NotFound
from qparams._histogram import histogram_params
from qparams._results import QParams
from qparams._spec import GranularityLike
from qparams._spec import granularity as _granularity
from qparams._spec import granularity_text, quant_spec
from qparams._tensors import check_reduce
from qparams.client import Client
from qparams.torch import _naming, _registry
from qparams.torch._observer_spec import (DEFAULT_EPS, HISTOGRAM_CALCULATORS, IF_EXISTS, OWN_KEYS,
                                          RULES, TARGETS, already_exists_with_another_spec,
                                          canonical_dtype, describe_spec, qscheme_names,
                                          spec_differences, torch_dtype_name)
from qparams.v1 import qparams_pb2 as pb

__all__ = ["RemoteObserver"]


class RemoteObserver(UniformQuantizationObserverBase):
    """A torch.ao.quantization observer whose statistics live in a qparams session.

    It takes torch.ao's MinMaxObserver and PerChannelMinMaxObserver arguments with
    their meaning (positional ones in MinMaxObserver's order), so that it replaces
    them in a QConfig through `with_args`; the qparams arguments are keyword-only.
    `forward` reduces each tensor where it lives (its min and max per block) and
    queues it for the client's background thread, so the training step does not
    wait on the network; `calculate_qparams` flushes and reads the session.

    torch.ao's arguments:
        dtype: torch.quint8 (default) or torch.qint8; or a qparams dtype name
            ("int8", "uint8", "int4", "float8_e4m3fn", ...).
        qscheme: torch.per_tensor_affine (default), per_tensor_symmetric,
            per_channel_affine or per_channel_symmetric; or a qparams qscheme name
            ("symmetric", "asymmetric", "symmetric_with_clipping", per-tensor unless
            `granularity` says otherwise).
        reduce_range: halve the quantized range, as torch.ao does ((0, 127) for
            quint8, (-64, 63) for qint8; quant_min and quant_max halved when given).
        quant_min, quant_max: a custom integer range, both or neither, which must
            include 0 (torch.ao's checks and messages).
        factory_kwargs: device and dtype of the min_val/max_val/eps buffers.
        eps: the smallest scale (torch.ao's rule only, see `rule`).
        is_dynamic: must be False (dynamic quantization: use qparams.Client.compute).
        ch_axis: the channel axis of the per_channel qschemes (default 0).
        averaging_constant: moving_average's constant (default 0.01).

    qparams' arguments (keyword-only):
        calculator: "global_minmax" (default) keeps the running min and max, and gives
            MinMaxObserver's and PerChannelMinMaxObserver's qparams bit for bit.
            "moving_average" differs from torch.ao's moving-average observers by
            design: coreai_opt averages the zero-clamped range, torch.ao the raw one
            (up to 0.5% per channel). "static" keeps the latest observation's qparams
            (rule "coreai_opt" only). "percentile", "entropy" and "mse" (per-tensor
            only) keep a histogram of |x| and choose a clipping range from it: [-amax,
            amax] ([0, amax] for an affine qscheme while no negative value was seen) with
            amax chosen by the method. Each clips some kinds of outliers and keeps others
            (entropy's defaults keep the full range when the outliers lie more than about
            32x beyond the bulk): docs/histograms.md, "Choosing a calibrator", measures
            when each helps. The histogram merges exactly, so the result does not
            depend on batch order or on how data-parallel ranks split the data (torch.ao's
            HistogramObserver, a different method, depends on both). forward bins each
            tensor where it lives (torch.bincount) and sends the counts.
        histogram: the histogram calculators' parameters (see Client.create_session):
            num_bins, percentile, start_bin, stride, skip_zeros, nonfinite.
        rule: how calculate_qparams turns the session's statistics into qparams.
            "torch" (default): torch.ao's own _calculate_qparams on the session's
            running min and max (a histogram session's clipping range), in float32, so that a model converted with this
            observer equals one converted with MinMaxObserver, custom ranges
            (torch.ao's zero point (quant_min + quant_max) // 2 for a symmetric
            quint8 range) and float16/bfloat16 inputs included. "coreai_opt": the
            session's own qparams, computed as coreai_opt computes them (in the
            input's dtype, coreai_opt's zero point), which are what the exports
            carry. For float32 inputs and torch.ao's default ranges the two agree bit
            for bit.
        granularity: a qparams granularity ("per_channel:1", "per_block:1:32", ...)
            replacing the one the qscheme gives.
        target: "weight" or "activation"; default: "weight" when the first tensor
            observed is an nn.Parameter, else "activation".
        spec: further qparams spec fields (see qparams.quant_spec), not the above.
        run: the session-name prefix (default: qparams.torch.default_run()).
        name: the full session name; default: after the layer once name_observers
            has run (or, for a weight observer torch.ao creates in convert, after the
            parameter it observes), else f"{run}/observer.{k}".
        if_exists: what to do when the session exists from before this process
            started (an earlier run under the same name): "error" (default) raises
            AlreadyExists, "resume" adds to its statistics, "replace" deletes it and
            starts afresh. Sessions created since (by data-parallel ranks of this
            run) are always shared.
        reduce: how forward sends a tensor (Client.observe): "auto" (default),
            "always" (block minima and maxima), "never" (the tensor itself).
        server: the server's address; default $QPARAMS_TARGET, else 127.0.0.1:50051.
        client_options: keyword arguments of qparams.Client (token, tls_ca, ...).

    A per-tensor observer accepts tensors of any rank, one after another (FX shares
    one observer between an op and a flatten or reshape after it). Its session sees
    each tensor flattened, which leaves a per-tensor min and max unchanged.

    State: the min_val and max_val buffers (float32; [] per-tensor, [C] per-channel)
    hold the session's running range as of the last calculate_qparams or
    state_dict(); a model loaded with load_state_dict converts from them with no
    server (rule "torch"), until it observes again.

    Raises:
        ValueError, TypeError, AssertionError, NotImplementedError: an argument torch.ao
            or qparams refuses (torch.ao's own checks raise AssertionError and
            NotImplementedError, as for MinMaxObserver).
    """

    min_val: torch.Tensor
    max_val: torch.Tensor

    def __init__(self, dtype: torch.dtype | str = torch.quint8,
                 qscheme: torch.qscheme | str = torch.per_tensor_affine,
                 reduce_range: bool = False, quant_min: int | None = None,
                 quant_max: int | None = None, factory_kwargs: Mapping[str, Any] | None = None,
                 eps: float = DEFAULT_EPS, is_dynamic: bool = False, *, ch_axis: int = 0,
                 averaging_constant: float | None = None, calculator: str = "global_minmax",
                 rule: str = "torch", granularity: GranularityLike | None = None,
                 target: str | None = None, spec: Mapping[str, Any] | None = None,
                 histogram: Mapping[str, Any] | None = None,
                 run: str | None = None, name: str | None = None, if_exists: str = "error",
                 reduce: str = "auto", server: str | None = None,
                 client_options: Mapping[str, Any] | None = None) -> None:
        if is_dynamic:
            raise ValueError("is_dynamic=True (dynamic quantization) is not supported by "
                             "RemoteObserver; compute a tensor's qparams with "
                             "qparams.Client.compute")
        if rule not in RULES:
            raise ValueError(f"rule {rule!r} is not one of {', '.join(RULES)}")
        if if_exists not in IF_EXISTS:
            raise ValueError(f"if_exists {if_exists!r} is not one of {', '.join(IF_EXISTS)}")
        if target is not None and target not in TARGETS:
            raise ValueError(f"target {target!r} is not \"weight\" or \"activation\"")
        if not isinstance(calculator, str):
            raise TypeError(f"calculator must be a string, not {calculator!r}")
        if rule == "torch" and calculator in ("static", "default", ""):
            raise ValueError(f"calculator {calculator!r} keeps no running min and max, which "
                             "rule='torch' computes from; use rule='coreai_opt' with it")
        if rule == "coreai_opt" and eps != DEFAULT_EPS:
            raise ValueError("eps is torch.ao's smallest scale, used by rule='torch'; "
                             "rule='coreai_opt' uses coreai_opt's own")
        qdtype = torch_dtype_name(dtype)
        qqscheme, per_channel = qscheme_names(qscheme)
        if not isinstance(ch_axis, int) or isinstance(ch_axis, bool):
            raise TypeError(f"ch_axis must be an int, not {ch_axis!r}")
        if (quant_min is None) != (quant_max is None):
            raise ValueError("quant_min and quant_max go together (both or neither)")
        check_reduce(reduce)
        if histogram is not None and calculator not in HISTOGRAM_CALCULATORS:
            raise ValueError(f"histogram= belongs to the calculators "
                             f"{', '.join(HISTOGRAM_CALCULATORS)}, not {calculator!r}")
        histogram_message = histogram_params(histogram or {})  # checks the keys now
        if spec is not None and not isinstance(spec, Mapping):
            raise TypeError(f"spec must be a mapping of qparams spec fields, "
                            f"not {type(spec).__name__}")
        own = sorted(set(spec or {}) & set(OWN_KEYS))
        if own:
            raise ValueError(f"spec must not hold {own}: pass them as RemoteObserver's own "
                             "arguments")
        if granularity is not None:
            g = _granularity(granularity)
        elif per_channel:
            g = pb.Granularity(per_channel=pb.PerChannel(axis=ch_axis))
        else:
            g = pb.Granularity(per_tensor=pb.PerTensor())
        if calculator in HISTOGRAM_CALCULATORS and g.WhichOneof("kind") != "per_tensor":
            raise ValueError(f"calculator {calculator!r} is per-tensor only, not "
                             f"{granularity_text(g)}; use a per_tensor qscheme")
        canonical = canonical_dtype(quant_spec(dtype=qdtype).dtype)
        torch_range = canonical in ("int8", "uint8")
        symmetric = qqscheme != "asymmetric"
        if g.WhichOneof("kind") == "per_channel":
            torch_qscheme = torch.per_channel_symmetric if symmetric else torch.per_channel_affine
        else:
            torch_qscheme = torch.per_tensor_symmetric if symmetric else torch.per_tensor_affine
        torch_dtype = torch.quint8 if canonical.startswith("u") else torch.qint8
        # torch.ao's base: its checks, quant_min/quant_max (reduce_range and custom
        # ranges) and the eps buffer, exactly as MinMaxObserver gets them.
        super().__init__(dtype=torch_dtype, qscheme=torch_qscheme, reduce_range=reduce_range,
                         quant_min=quant_min if torch_range else None,
                         quant_max=quant_max if torch_range else None,
                         factory_kwargs=factory_kwargs, eps=eps)
        if (torch_qscheme in (torch.per_tensor_symmetric, torch.per_channel_symmetric)
                and reduce_range and torch_dtype == torch.quint8):
            raise NotImplementedError("Cannot reduce range for symmetric quantization for quint8")
        if torch_range:
            spec_range = ((self.quant_min, self.quant_max)
                          if self.has_customized_qrange or reduce_range else (None, None))
        else:
            # Another dtype's range is the server's to resolve (_open fills it in).
            self.has_customized_qrange = quant_min is not None
            self.quant_min, self.quant_max = quant_min, quant_max
            spec_range = (quant_min, quant_max)
        self.ch_axis = g.per_channel.axis if g.WhichOneof("kind") == "per_channel" else ch_axis
        factory = torch.nn.factory_kwargs(factory_kwargs)
        if g.WhichOneof("kind") == "per_tensor":
            self.register_buffer("min_val", torch.tensor(float("inf"), **factory))
            self.register_buffer("max_val", torch.tensor(float("-inf"), **factory))
        else:
            self.register_buffer("min_val", torch.tensor([], **factory))
            self.register_buffer("max_val", torch.tensor([], **factory))

        self.calculator = calculator
        self.averaging_constant = averaging_constant
        self.histogram = (dict(histogram or {}) if calculator in HISTOGRAM_CALCULATORS
                          else None)
        self._histogram_bytes = histogram_message.SerializeToString(deterministic=True)
        self.rule = rule
        self.reduce = reduce
        self.if_exists = if_exists
        self.server = _registry.resolve_server(server)
        self.client_options = dict(client_options or {})
        if "target" in self.client_options:
            raise ValueError("client_options must not hold target; pass server= instead")
        self._client_key = _registry.client_key(self.server, self.client_options)
        self.run = run if run is not None else _registry.default_run()
        self._auto_name = name is None
        if name is None:
            with _registry.lock:
                k = next(_registry.counter)
            name = f"{self.run}/observer.{k}"
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty string, not {name!r}")
        self._spec_args = (dict(spec or {}), qdtype, qqscheme, g, spec_range)
        self.target = target
        # (target, spec, its bytes) as last built: forward reads it on every call.
        self._built: tuple[str, pb.QuantSpec, bytes] | None = None
        self._build_spec()  # now, to check the fields; the target is settled at the first use
        self._name = name
        self._used_name: str | None = None   # the name this observer opened its session as
        self._client: Client | None = None
        self._client_generation = -1
        # The process (or parent) start the if_exists rule compares with; a copy sent
        # to another process keeps its creator's.
        self._started = _registry.STARTED
        # True while min_val/max_val came from load_state_dict and nothing was observed.
        self._loaded = False
        # False once something was observed since the buffers were last read.
        self._synced = True
        #: The Future of the latest observation forward sent (its ObserveResult, or the
        #: error the server answered); None before the first one.
        self.last_observation: Any = None

    # ------------------------------------------------------------------ properties

    @property
    def session_name(self) -> str:
        """The name of this observer's session."""
        return self._name

    @property
    def quant_spec(self) -> pb.QuantSpec:
        """The qparams.v1.QuantSpec this observer asks for (its target "activation"
        until settled; the server fills in the defaults of what is unset)."""
        spec = pb.QuantSpec()
        spec.CopyFrom(self._spec)
        return spec

    @property
    def _spec(self) -> pb.QuantSpec:
        """The spec asked for (not to be modified), rebuilt only when the target
        changes."""
        return self._build_spec()

    def _build_spec(self) -> pb.QuantSpec:
        target = self.target or "activation"
        if self._built is None or self._built[0] != target:
            extra, qdtype, qqscheme, g, (qmin, qmax) = self._spec_args
            spec = quant_spec(dict(extra), dtype=qdtype, qscheme=qqscheme, granularity=g,
                              target=target, quant_min=qmin, quant_max=qmax)
            self._built = (target, spec, spec.SerializeToString(deterministic=True))
        return self._built[1]

    @property
    def client(self) -> Client:
        """The qparams.Client this observer uses, shared by the observers of this
        process with the same server and client options (see shared_client)."""
        if self._client is None or self._client_generation != _registry.generation:
            generation = _registry.generation
            self._client = _registry.shared_client(self.server, self.client_options)
            self._client_generation = generation
        return self._client

    # ------------------------------------------------------------------ observer API

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Observes x and returns it unchanged (the same object).

        x (float32, float16, bfloat16 or float64, any device and strides) is detached,
        reduced where it lives (see `reduce`) to its block minima and maxima, or for a
        histogram calculator binned into a histogram of |x| (torch.bincount), and queued
        for the client's background sender; this returns without waiting for the
        server. An empty x is skipped, as torch.ao's observers skip it. The session is
        created (or checked) on the first call; an unnamed weight observer first takes
        the name of the parameter x is (see name_observers).

        Raises:
            QParamsError: the first failure of an earlier observation of the shared
                client, not raised yet (x is then not observed), or a failure to create
                or check the session (AlreadyExists: see if_exists).
            TypeError: x is not a tensor of a supported dtype.
        """
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"RemoteObserver observes torch tensors, not {type(x).__name__}")
        if x.numel() == 0:
            return x
        if self._used_name is None:
            self._settle(x)
        per_tensor = self._spec_args[3].WhichOneof("kind") == "per_tensor"
        self._open(1 if per_tensor else x.dim())
        sent = x.detach().reshape(-1) if per_tensor else x.detach()
        # Each observation's qparams would only be discarded: calculate_qparams reads
        # the session's.
        self.last_observation = self.client.observe_async(self._name, sent, reduce=self.reduce,
                                                          omit_qparams=True)
        self._loaded = False
        self._synced = False
        return x

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every queued observation of the shared client (this observer's
        and the others') is answered; raises the first failure among them not raised
        yet (a qparams.QParamsError naming its session), once.

        Raises:
            TimeoutError: observations still unanswered after `timeout` seconds.
        """
        self.client.flush(timeout)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (scale, zero_point) torch.ao's convert takes: float32 scales and zero
        points of shape [1] (per-tensor) or [C] (per-channel; ch_axis normalised to a
        non-negative axis), int32 for the affine qschemes and int64 for the symmetric
        ones, as MinMaxObserver and PerChannelMinMaxObserver return them. A session
        that saw no data warns and gives ([1.0], [0]), as torch.ao's observers do.

        rule "torch": flushes, reads the session's running range into min_val and
        max_val and applies torch.ao's _calculate_qparams; after load_state_dict (and
        no forward since), uses the loaded buffers and needs no server. rule
        "coreai_opt": flushes and returns the session's qparams.

        Only int8/uint8 specs with a per-tensor or per-channel granularity and float32
        scales have this form; for the others (per_block, int4, fp8, fp4, e8m0 scales...)
        this flushes too, then raises ValueError, and get_qparams() reads their qparams.

        Raises:
            ValueError: a spec torch.ao cannot convert (after the flush).
            QParamsError: a failure of an earlier observation (before the ValueError), or
                of the read.
        """
        refusal = self._torch_refusal()
        if refusal:
            # As for the specs torch.ao converts: the queued observations are applied,
            # and a failure among them is raised, before the refusal.
            self.flush()
            raise ValueError(
                f"RemoteObserver {self._name!r}: torch.ao.quantization cannot convert the "
                f"spec {describe_spec(self._spec)}: {refusal}. The session calibrates all "
                "the same; read its qparams with get_qparams() and apply them yourself.")
        if self.rule == "torch":
            if not self._loaded:
                self._sync()
            if self.min_val.numel() == 0 or bool((self.min_val == float("inf")).any()):
                return self._no_data()
            return self._calculate_qparams(self.min_val, self.max_val)
        self.flush()
        q = self._read()
        if not q.initialized:
            return self._no_data()
        if q.zero_point is None:  # the checks above exclude it; the server decides
            raise ValueError(f"RemoteObserver {self._name!r}: session has no zero point, "
                             "which torch.ao.quantization needs; use get_qparams()")
        count = self._channels(q.shape)
        scale = torch.from_numpy(np.ascontiguousarray(q.scale, np.float32).reshape(count))
        # torch.ao's own dtypes: int32 for the affine schemes, int64 for the symmetric.
        affine = self.qscheme in (torch.per_tensor_affine, torch.per_channel_affine)
        zero_point = torch.from_numpy(
            q.zero_point.astype(np.int32 if affine else np.int64).reshape(count))
        return scale, zero_point

    def _no_data(self) -> tuple[torch.Tensor, torch.Tensor]:
        warnings.warn(f"session {self._name!r} has observed no data: run the observer "
                      "before calculate_qparams; returning the default scale 1.0 and "
                      "zero point 0, as torch.ao's observers do")
        return torch.tensor([1.0]), torch.tensor([0])

    def get_qparams(self) -> QParams:
        """Flushes, then returns the session's qparams (scale, zero_point, minval as
        torch tensors of shape `shape`, the blocks per input dim), for every spec,
        computed by coreai_opt's rule. Before any data, they are empty with
        `initialized` False."""
        self.flush()
        return self._read().to_torch()

    def reset_min_max_vals(self) -> None:
        """Not supported: the statistics are the session's (delete it, or use
        if_exists="replace", to start afresh)."""
        raise NotImplementedError("RemoteObserver keeps its statistics in the session "
                                  f"{self._name!r}; delete it to start afresh")

    def extra_repr(self) -> str:
        """The module's repr: session name, calculator, rule and requested spec."""
        text = f"session={self._name!r}, calculator={self.calculator or 'default'!r}"
        if self.averaging_constant is not None:
            text += f", averaging_constant={self.averaging_constant}"
        if self.histogram:
            text += f", histogram={self.histogram}"
        return f"{text}, rule={self.rule!r}, spec={describe_spec(self._spec)}"

    # ------------------------------------------------------------------ state

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        # The buffers are read from the session when observations came since.
        if not self._synced and not self._loaded:
            self._sync()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, local_metadata: dict,
                              strict: bool, missing_keys: list, unexpected_keys: list,
                              error_msgs: list) -> None:
        # As PerChannelMinMaxObserver: per-channel buffers take the saved shape.
        for key, buffer in ((prefix + "min_val", self.min_val), (prefix + "max_val", self.max_val)):
            if key in state_dict:
                buffer.resize_(state_dict[key].shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        self._loaded = True
        self._synced = True

    def __getstate__(self) -> dict[str, Any]:
        """The state copy.deepcopy and pickle take: all but the client and the Future."""
        state = self.__dict__.copy()
        # The client (a gRPC channel) and the Future are this process's; a copy finds
        # the shared client again on first use.
        state["_client"] = None
        state["_client_generation"] = -1
        state["last_observation"] = None
        return state

    # ------------------------------------------------------------------ helpers

    def _settle(self, x: torch.Tensor) -> None:
        """Before the first observation: the name of an unnamed weight observer and
        the target of one without, from the parameter x is (if it is one)."""
        known = _naming.parameter_name(x)
        if self._auto_name and known is not None:
            name, run = known
            self._name = f"{run if run is not None else self.run}/{name}"
        if self.target is None:
            self.target = "weight" if isinstance(x, torch.nn.Parameter) else "activation"

    def _channels(self, shape: tuple[int, ...]) -> int:
        """The element count of torch.ao's qparams for session qparams of `shape`
        (normalising ch_axis for per-channel)."""
        if self._spec_args[3].WhichOneof("kind") != "per_channel":
            return 1
        rank = len(shape)
        axis = self._spec_args[3].per_channel.axis
        if not -rank <= axis < rank:
            raise ValueError(f"RemoteObserver {self._name!r}: channel axis {axis} does not "
                             f"fit qparams of rank {rank}")
        self.ch_axis = axis % rank
        return shape[self.ch_axis]

    def _sync(self) -> None:
        """Flushes and reads the session's running range into min_val and max_val."""
        self.flush()
        self._open(None)
        session = self.client.get_session(self._name)
        if self.histogram is not None:
            self._sync_clipping_range(session)
        elif session.initialized and len(session.running_min):
            count = self._channels(tuple(session.qparams.shape))
            values = [torch.tensor(list(v), dtype=torch.float32)
                      for v in (session.running_min, session.running_max)]
            if self.min_val.dim() == 0:
                values = [v.reshape(()) for v in values]
            else:
                values = [v.reshape(count) for v in values]
            for buffer, value in ((self.min_val, values[0]), (self.max_val, values[1])):
                buffer.resize_(value.shape)
                buffer.copy_(value)
        self._synced = True

    def _sync_clipping_range(self, session: pb.Session) -> None:
        """min_val and max_val of a histogram session: its clipping range, [-amax,
        amax], or [0, amax] for an asymmetric spec while no negative value was seen
        (histogram.md 7), the range its own qparams cover."""
        if not session.HasField("calibration"):
            return  # no finite value yet: the buffers stay as they are
        amax = session.calibration.amax
        lo = -amax
        if session.spec.qscheme == pb.ASYMMETRIC:
            low = self.client.get_histogram(self._name).min
            if low is not None and low >= 0:
                lo = 0.0
        for buffer, value in ((self.min_val, lo), (self.max_val, amax)):
            buffer.fill_(value)

    def _torch_refusal(self) -> str:
        reasons = []
        dtype = canonical_dtype(self._spec.dtype)
        if dtype not in ("int8", "uint8"):
            reasons.append(f"dtype {dtype} is not int8 or uint8, the dtypes torch.ao converts")
        if self._spec.scale_dtype:
            reasons.append(f"scale_dtype {self._spec.scale_dtype} has no zero point, and "
                           "torch.ao takes float32 scales with integer zero points")
        if self._spec.granularity.WhichOneof("kind") == "per_block":
            reasons.append(f"granularity {granularity_text(self._spec.granularity)} is "
                           "per-block, and torch.ao takes per-tensor or per-channel qparams")
        return "; ".join(reasons)

    def _read(self) -> QParams:
        self._open(None)
        return self.client.get_qparams(self._name)

    def _resolved_calculator(self) -> str:
        if self.calculator in ("", "default"):
            return "static" if self._spec.target == pb.WEIGHT else "moving_average"
        return self.calculator

    def _open(self, rank: int | None) -> None:
        """Creates the session, or checks the one that exists, once per process."""
        spec = self._spec
        key = (self._client_key, self._name,
               (self._built[2], self.calculator, self.averaging_constant,
                self._histogram_bytes))
        if key in _registry.opened:
            self._used_name = self._name
            return
        client = self.client
        try:
            session = client.create_session(self._name, spec, calculator=self.calculator,
                                            averaging_constant=self.averaging_constant,
                                            histogram=self.histogram)
        except AlreadyExists:
            session = client.get_session(self._name)
            session = self._earlier_run(session)
            if rank is None and session.initialized:
                rank = len(session.qparams.shape)
            self._check(session, rank)
        if canonical_dtype(session.spec.dtype) in ("int8", "uint8") or self.quant_min is None:
            self.quant_min = int(session.spec.quant_min)
            self.quant_max = int(session.spec.quant_max)
        with _registry.lock:
            _registry.opened.add(key)
        self._used_name = self._name

    def _earlier_run(self, session: pb.Session) -> pb.Session:
        """The session to use when `session` exists: itself, unless an earlier run
        made it (before this process started), which if_exists decides."""
        created = session.create_time.seconds + session.create_time.nanos / 1e9
        if created >= self._started or self.if_exists == "resume":
            return session
        if self.if_exists == "error":
            raise AlreadyExists(
                f"session {self._name!r} exists from an earlier run (created "
                f"{session.create_time.ToJsonString()}, before this process started): "
                "observing would add to its statistics. Pass if_exists=\"resume\" to add "
                "to them, if_exists=\"replace\" to start afresh, or use another run name "
                "(qparams.torch.delete_run deletes a run)", session=self._name)
        client = self.client
        try:
            client.delete_session(self._name)
        except NotFound:
            pass
        try:
            return client.create_session(self._name, self._spec, calculator=self.calculator,
                                         averaging_constant=self.averaging_constant,
                                         histogram=self.histogram)
        except AlreadyExists:  # another process of this run replaced it first
            return client.get_session(self._name)

    def _check(self, session: pb.Session, rank: int | None) -> None:
        """Raises AlreadyExists if the existing `session` is not the one asked for."""
        diffs = spec_differences(session, self._spec, self._resolved_calculator(),
                                 self.averaging_constant, self.histogram, rank)
        if diffs:
            raise already_exists_with_another_spec(self._name, diffs)
