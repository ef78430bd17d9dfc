"""The session calls of qparams.Client: stateless compute, and creating, reading,
listing, changing and deleting sessions (qparams/_client_core.py routes them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc

from qparams._client_core import ClientCore, Metadata
from qparams._errors import error_from_rpc
from qparams._histogram import Histogram, HistogramParamsLike, histogram_params
from qparams._results import QParams
from qparams._spec import GranularityLike, SpecLike, granularity, quant_spec
from qparams._tensors import TensorLike, check_reduce, range_request, tensor_request
from qparams.v1 import qparams_pb2 as pb

__all__ = ["SessionCalls"]


class SessionCalls(ClientCore):
    """qparams.Client's calls on sessions, observations aside."""

    def compute(self, x: TensorLike, spec: SpecLike | None = None, *, calculator: str = "",
                reduce: str = "auto", timeout: float | None = None, metadata: Metadata = None,
                **spec_fields: Any) -> QParams:
        """The qparams of one tensor, stateless: calculator "" (= dynamic), "dynamic"
        or "static". The spec is a mapping or QuantSpec and/or keywords (see
        qparams.quant_spec), e.g. compute(x, dtype="int8", granularity="per_channel:0").

        reduce: as for observe: "auto" (default) sends the block minima and maxima
        when they are smaller than x, so a tensor of any size can be computed (the
        qparams are bit for bit those of x); "never" sends x, which must then fit in
        max_message_bytes. Compute's calculators take no symmetric_with_clipping
        qscheme and no float_range unless calculator="static" (the server refuses
        them with InvalidArgument).

        Raises:
            TypeError: x is not a float32/float16/float64 array or supported tensor.
            ValueError: a malformed spec value (see quant_spec) or reduce, or x sent
                whole over max_message_bytes (before any call).
            InvalidArgument: a spec or tensor the server refuses (non-finite values...).
        """
        check_reduce(reduce)
        request = pb.ComputeRequest(calculator=calculator, spec=quant_spec(spec, **spec_fields))
        observation = (tensor_request("", x) if reduce == "never" else
                       range_request("", x, request.spec, reduce))
        if observation.HasField("range"):
            request.range.CopyFrom(observation.range)
        else:
            self._check_size(observation.tensor.data, reduce)
            request.tensor.CopyFrom(observation.tensor)
        return QParams.from_proto(self._call("Compute", request, timeout, metadata).qparams)

    def create_session(self, name: str, spec: SpecLike | None = None, *, calculator: str = "",
                       averaging_constant: float | None = None,
                       histogram: HistogramParamsLike = None,
                       timeout: float | None = None, metadata: Metadata = None,
                       **spec_fields: Any) -> pb.Session:
        """Creates the session `name` and returns it (its spec resolved).

        calculator: "static", "moving_average", "global_minmax", the histogram
        calculators "percentile", "entropy", "mse", or "" for the default (static for
        weights, moving_average for activations). Choosing an observer as a torch.ao
        user: global_minmax matches MinMaxObserver/PerChannelMinMaxObserver bit for bit;
        moving_average averages the zero-clamped range (coreai_opt), not torch.ao's raw
        one, and can differ from MovingAverage*MinMaxObserver by up to 0.5% per channel;
        percentile, entropy and mse choose a clipping range (per-tensor only) from a
        histogram of |x| that gives the same result whatever the batch order or the split
        of the data across ranks (torch.ao's HistogramObserver depends on both); each
        clips some kinds of outliers and keeps others (entropy's defaults keep the full
        range when the outliers lie more than about 32x beyond the bulk): see
        docs/histograms.md, "Choosing a calibrator".
        histogram: the histogram calculators' parameters, a dict (or a
            qparams.pb.HistogramParams) with any of num_bins (a power of two in
            [256, 65536], default 4096), percentile ((0, 100], default 99.99; percentile
            only), start_bin and stride (entropy and mse only; defaults 128 and 1),
            skip_zeros (False) and nonfinite ("reject", the default, or "ignore").

        Raises:
            ValueError: no target, or a malformed spec value or histogram key, before any
                call.
            AlreadyExists: the name is taken. InvalidArgument: a bad name, spec or
                histogram parameter.
            ResourceExhausted: the server's session limit.
        """
        request = pb.CreateSessionRequest(name=name, calculator=calculator,
                                          spec=quant_spec(spec, **spec_fields))
        if histogram is not None:  # present even when empty: every default
            request.histogram.SetInParent()
            request.histogram.MergeFrom(histogram_params(histogram))
        if request.spec.target == pb.TARGET_UNSPECIFIED:
            raise ValueError(
                "create_session needs target=\"weight\" or target=\"activation\" (in the spec "
                "or as a keyword): the two resolve to different defaults (weight: "
                "symmetric, calculator static; activation: calculator moving_average), so "
                "the client does not guess")
        if averaging_constant is not None:
            request.averaging_constant = averaging_constant
        session = self._call("CreateSession", request, timeout, metadata)
        self._remember(session)
        return session

    def get_session(self, name: str, *,
                    timeout: float | None = None, metadata: Metadata = None) -> pb.Session:
        """The session `name` (NotFound if there is none)."""
        return self._fetch_session(name, timeout, metadata)

    def list_sessions(self, prefix: str = "", *, page_size: int = 0,

                      timeout: float | None = None, metadata: Metadata = None
                     ) -> Iterator[pb.Session]:
        """Every session whose name starts with `prefix`, in name order, fetching page
        after page (page_size 0: the server's default of 50; at most 1000). Sharded:
        every replica's, merged in name order by the deployment.

        Raises:
            IncompleteListing: sharded, some replicas could not be read (Unavailable,
                DeadlineExceeded, Unknown): raised after the sessions of the others.
        """
        return self._pages("ListSessions", lambda token: pb.ListSessionsRequest(
            page_size=page_size, page_token=token, filter=prefix),
            lambda page: page.sessions, timeout, metadata)

    def read_sessions(self, prefix: str = "", *,

                      timeout: float | None = None, metadata: Metadata = None
                     ) -> Iterator[pb.Session]:
        """Every session whose name starts with `prefix`, in name order, streamed by the
        server in one call (ReadSessions), each read whole under its own lock: for
        exports and reports of many sessions. A session created or deleted meanwhile
        may or may not appear. The call's deadline is `timeout` (default: the
        client's); closing the iterator early cancels the call.

        Sharded: every replica's, merged in name order by the deployment.

        Raises:
            InvalidArgument: a prefix with characters no session name holds.
            IncompleteListing: sharded, some replicas could not be read (Unavailable,
                DeadlineExceeded, Unknown): raised after the sessions of the others.
        """
        call = self._stub.ReadSessions(pb.ReadSessionsRequest(prefix=prefix),
                                       timeout=timeout or self.timeout,
                                       metadata=self._addressed(None, metadata))
        try:
            yield from call
        except grpc.RpcError as e:
            raise error_from_rpc(e) from None
        finally:
            call.cancel()

    def delete_session(self, name: str, *,
                       timeout: float | None = None, metadata: Metadata = None) -> None:
        """Deletes the session `name` (NotFound if there is none)."""
        with self._specs_lock:
            self._specs.pop(name, None)
        self._call("DeleteSession", pb.DeleteSessionRequest(name=name), timeout, metadata)

    def get_qparams(self, name: str, *,
                    timeout: float | None = None, metadata: Metadata = None) -> QParams:
        """The cached qparams of the session `name`, as get_qparams: before the first
        forward, empty with `initialized` False. A histogram session's carry its
        calibration (qparams.calibration: amax, bin_index, ...), computed now if its
        histogram changed since the last search."""
        response = self._call("GetQParams", pb.GetQParamsRequest(name=name), timeout, metadata)
        return QParams.from_proto(
            response.qparams, response.initialized,
            response.calibration if response.HasField("calibration") else None)

    def get_histogram(self, name: str, *,
                      timeout: float | None = None, metadata: Metadata = None) -> Histogram:
        """The histogram of |x| the histogram session `name` holds (percentile, entropy
        or mse): its occupied bins, exponent, side counts and exact extrema.

        Raises:
            NotFound: no such session. InvalidArgument: not a histogram session.
        """
        return Histogram.from_proto(
            self._call("GetHistogram", pb.GetHistogramRequest(name=name), timeout, metadata))

    def set_export_mode(self, name: str, enabled: bool = True, *,
                        timeout: float | None = None, metadata: Metadata = None) -> pb.Session:
        """Freezes (enabled) or unfreezes the qparams of the session `name`."""
        return self._call("SetExportMode", pb.SetExportModeRequest(name=name, enabled=enabled),
                          timeout, metadata)

    def set_granularity(self, name: str, value: GranularityLike, *,
                        timeout: float | None = None, metadata: Metadata = None) -> pb.Session:
        """Changes the session's granularity (FailedPrecondition once it computed a
        forward). ValueError for a malformed granularity, before any call."""
        session = self._call("SetGranularity", pb.SetGranularityRequest(
            name=name, granularity=granularity(value)), timeout, metadata)
        self._remember(session)
        return session
