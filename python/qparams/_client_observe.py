"""The observations of qparams.Client: observe and observe_histogram (unary),
observe_many (streams), observe_batch and observe_async (ObserveBatch calls), each
split by owning replica when sharded and following a refusal naming another owner.
"""

from __future__ import annotations

import collections
import concurrent.futures
import queue as queue_module
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import grpc

from qparams._background import ObserveQueue
from qparams._client_core import ClientCore, Layout, Metadata
from qparams._errors import FailedPrecondition, InvalidArgument, QParamsError, error_from_rpc
from qparams._histogram import Histogram, histogram_request
from qparams._results import ObserveResult, stream_outcome
from qparams._retry import retryable_error
from qparams._routing import SlotMap
from qparams._tensors import TensorLike, check_reduce, range_request, tensor_request
from qparams.v1 import qparams_pb2 as pb

__all__ = ["ObserveCalls"]


def _failed_item(error: QParamsError) -> pb.ObserveResponse:
    """The response of an observation whose call failed with `error`."""
    return pb.ObserveResponse(status=pb.RpcStatus(code=error.code.value[0], message=error.message))


class ObserveCalls(ClientCore):
    """qparams.Client's observations of tensors and histograms."""

    # ------------------------------------------------------------------ one observation

    def observe(self, name: str, x: TensorLike, *, reduce: str = "auto",
                omit_qparams: bool = False,
                timeout: float | None = None, metadata: Metadata = None) -> ObserveResult:
        """One forward of the session `name` on x.

        reduce: "always" sends each block's min and max, computed where x lives (its
        torch device), "never" sends x itself, "auto" whichever is smaller. The results
        are bit-identical either way, errors included (a tensor the server would refuse,
        e.g. one holding NaN, is sent whole so that the error is the tensor's own).
        Reducing needs the session's spec: the first observation of a name fetches it
        (retried as the observation is).
        omit_qparams: the result's qparams is None (the server does not send them),
        for a caller that reads them later with get_qparams.

        Raises:
            TypeError: x is not a supported array or tensor. ValueError: a bad reduce.
            NotFound, InvalidArgument, FailedPrecondition...: as the server answers.
        """
        check_reduce(reduce)
        cached = reduce != "never" and name in self._specs
        request = self._request(name, x, reduce, omit_qparams)
        try:
            response = self._observe_call(request, timeout, metadata)
        except (InvalidArgument, FailedPrecondition) as e:
            # A spec cached before another client replaced the session (or changed its
            # granularity) reduces to the wrong blocks (or bins): fetch it again once and
            # resend.
            if not (cached and request.WhichOneof("observation") in ("range", "histogram")):
                raise
            old = self._specs.get(name)
            try:
                changed = Layout.of(self._fetch_session(name)) != old
            except QParamsError:
                changed = False
            if not changed:
                raise e from None
            response = self._observe_call(self._request(name, x, reduce, omit_qparams),
                                          timeout, metadata)
        return ObserveResult.from_response(response)

    def _observe_call(self, request: pb.ObserveRequest, timeout: float | None,
                      metadata: Metadata) -> pb.ObserveResponse:
        """One Observe call, retried as the client's retry policy says if keyed."""
        return self._retry.call(bool(request.client_id),
                                lambda: self._call("Observe", request, timeout, metadata))

    def observe_histogram(self, name: str, histogram: Histogram | pb.HistogramObservation, *,
                          omit_qparams: bool = False, timeout: float | None = None,
                          metadata: Metadata = None) -> ObserveResult:
        """Merges `histogram` (local_histogram's, a merge of several, e.g. across
        data-parallel ranks, or a HistogramObservation message built elsewhere) into the
        histogram session `name`: the same state as observing the values it counts, bit
        for bit.

        Raises:
            InvalidArgument: a histogram breaking a rule of histogram.md 3.2 (num_bins not
                the session's, a wrong exponent, ...), or a session of another kind.
            ResourceExhausted: the session would hold 2^62 values or more.
        """
        request = pb.ObserveRequest(name=name, omit_qparams=omit_qparams)
        request.histogram.CopyFrom(histogram if isinstance(histogram, pb.HistogramObservation)
                                   else histogram.to_proto())
        self._keys.key(request)
        return ObserveResult.from_response(self._observe_call(request, timeout, metadata))

    def _request(self, name: str, x: TensorLike, reduce: str, omit_qparams: bool,
                 key: bool = True) -> pb.ObserveRequest:
        """The ObserveRequest of x (reduced as `reduce` says), with this client's next
        key of its session unless `key` is False (the caller keys it)."""
        layout = None if reduce == "never" else self._layout(name)
        if layout is None:
            request = tensor_request(name, x)
        elif layout.histogram is not None:
            request = histogram_request(name, x, layout.histogram, reduce)
        else:
            request = range_request(name, x, layout.spec, reduce)
        if request.HasField("tensor"):
            self._check_size(request.tensor.data, reduce)
        request.omit_qparams = omit_qparams
        return self._keys.key(request) if key else request

    # ------------------------------------------------------------------ streams

    def observe_many(self, items: Iterable[tuple[str, TensorLike]], *, reduce: str = "auto",
                     omit_qparams: bool = False,
                     timeout: float | None = None, metadata: Metadata = None
                     ) -> Iterator[ObserveResult | QParamsError]:
        """Observes every (name, tensor) of `items`, on one or many sessions, over one
        ObserveStream: requests are sent as fast as the stream takes them, not one round
        trip each. Yields, in order, one ObserveResult or one QParamsError (the item's
        refusal, with its `session`) per item; the stream goes on past a refused item.
        reduce and omit_qparams: as for observe.

        `items` is read lazily, so it may be a generator. `timeout` bounds the whole
        stream (default: none). A TypeError/ValueError of an item ends the stream after
        the items before it and is raised; so is the stream's own failure. On one
        server, a stream that fails with Unavailable or DeadlineExceeded is opened
        again (the retry policy of the class) with the keyed items it had not
        answered, then the rest.

        Sharded: one stream per owning replica, opened at its first item, the items
        read by a background thread at most 64 ahead of the answers yielded. When a
        replica's stream fails retryably (Unavailable, DeadlineExceeded, Unknown),
        its keyed items not answered yet, and every later item of that replica, are
        observed one at a time as observe does (retried), still in order; an unkeyed item it had
        taken gets the stream's error (its message naming the replica).
        """
        check_reduce(reduce)
        slot_map = self._router.slot_map()
        if slot_map is not None:
            yield from self._observe_streams(slot_map, items, reduce, omit_qparams, timeout,
                                             metadata)
            return
        yield from self._observe_stream(items, reduce, omit_qparams, timeout, metadata)

    def _observe_stream(self, items: Iterable[tuple[str, TensorLike]], reduce: str,
                        omit_qparams: bool, timeout: float | None,
                        metadata: Metadata) -> Iterator[ObserveResult | QParamsError]:
        """observe_many over one ObserveStream, opened again after a retryable failure
        (as the retry policy says) with the keyed requests sent but not answered,
        then the rest of `items`.

        gRPC's thread reads requests() while this generator reads the answers. `lock`
        guards `sent` (taken and unanswered, with their sessions' names), `carry`
        (taken by a stream replaced meanwhile, for the next one) and `generation`
        (the current stream's); `source_lock` makes one thread at a time read `items`
        (a stream being replaced may still be reading it). Lock order: `source_lock`,
        then `lock`; this generator takes only `lock`.
        """
        source = iter(items)
        sent: collections.deque[tuple[str, pb.ObserveRequest]] = collections.deque()
        carry: collections.deque[tuple[str, pb.ObserveRequest]] = collections.deque()
        failure: list[BaseException] = []
        lock, source_lock = threading.Lock(), threading.Lock()
        generation = [0]

        def take(mine: int) -> pb.ObserveRequest | None:
            """The stream `mine`'s next request, recorded in `sent`; None at the end."""
            with lock:
                if generation[0] != mine or failure:
                    return None
                if carry:
                    sent.append(carry.popleft())
                    return sent[-1][1]
            with source_lock:
                try:
                    name, x = next(source)
                    request = self._request(name, x, reduce, omit_qparams)
                except StopIteration:
                    return None
                except BaseException as e:  # raised below, after the answers before it
                    failure.append(e)
                    return None
                with lock:
                    if generation[0] != mine:
                        carry.append((name, request))
                        return None
                    sent.append((name, request))
            return request

        def requests(mine: int, resend: list[pb.ObserveRequest]) -> Iterator[pb.ObserveRequest]:
            yield from resend
            while (request := take(mine)) is not None:
                yield request

        wait = self._retry.waits()
        resend: list[pb.ObserveRequest] = []
        while True:
            call = self._stub.ObserveStream(requests(generation[0], resend), timeout=timeout,
                                            metadata=self._addressed(None, metadata))
            try:
                for response in call:
                    with lock:
                        name, request = sent.popleft()
                    yield self._rerouted(response, request, name, metadata)
                break
            except grpc.RpcError as e:
                if failure:
                    raise failure[0]
                with lock:
                    generation[0] += 1
                    resend = [request for _, request in sent]
                if not (resend and all(r.client_id for r in resend) and retryable_error(e)
                        and wait()):
                    raise error_from_rpc(e) from None
            finally:
                call.cancel()
        if failure:
            raise failure[0]

    def _observe_streams(self, slot_map: SlotMap, items: Iterable[tuple[str, TensorLike]],
                         reduce: str, omit_qparams: bool, timeout: float | None,
                         metadata: Metadata) -> Iterator[ObserveResult | QParamsError]:
        """observe_many over one ObserveStream per owning replica.

        A dispatcher thread reads `items`, reduces each and queues it on its owner's
        stream (opening it at the first), and records (replica, name) in `order`; this
        generator reads each stream's answers in item order. Once a replica's stream
        failed retryably (`broken`), the dispatcher queues its items for this
        generator alone (replica None in `order`), which observes them unary, so that
        every item of a session is still applied in order. `credit` bounds how far
        the dispatcher runs ahead. Lock order: only `lock` (guards `streams`,
        `broken`, `stopped`).
        """
        # (replica or None for a unary call, name, request); None at the end
        order: queue_module.Queue = queue_module.Queue()
        streams: dict[str, tuple[queue_module.Queue, Any]] = {}
        broken: set[str] = set()
        failure: list[BaseException] = []
        credit = threading.Semaphore(64)
        lock = threading.Lock()
        stopped = [False]

        def requests(pending: queue_module.Queue) -> Iterator[pb.ObserveRequest]:
            while (request := pending.get()) is not None:
                yield request

        def dispatch() -> None:
            try:
                for name, x in items:
                    credit.acquire()
                    request = self._request(name, x, reduce, omit_qparams)
                    replica = slot_map.owner(name)
                    with lock:
                        if stopped[0]:
                            return
                        if replica in broken:
                            order.put((None, name, request))
                            continue
                        if replica not in streams:
                            pending: queue_module.Queue = queue_module.Queue()
                            streams[replica] = (pending, self._stub.ObserveStream(
                                requests(pending), timeout=timeout,
                                metadata=self._addressed(replica, metadata)))
                        streams[replica][0].put(request)
                    order.put((replica, name, request))
            except BaseException as e:  # raised by the reader, after the answers before it
                failure.append(e)
            finally:
                with lock:
                    for pending, _ in streams.values():
                        pending.put(None)
                order.put(None)

        threading.Thread(target=dispatch, name="qparams-observe-many", daemon=True).start()
        try:
            while (entry := order.get()) is not None:
                replica, name, request = entry
                credit.release()
                if replica is None:
                    yield self._observe_outcome(request, name, metadata)
                    continue
                with lock:
                    call = streams[replica][1]
                try:
                    response = next(call)
                except StopIteration:
                    raise QParamsError(f"replica {replica} answered fewer observations "
                                       "than were sent") from None
                except grpc.RpcError as e:
                    # A failed stream raises its error again at each next(): every item
                    # it had taken comes here, in order.
                    error = error_from_rpc(e, replica)
                    if not retryable_error(error):
                        raise error from None
                    with lock:
                        broken.add(replica)
                    if request.client_id:
                        yield self._observe_outcome(request, name, metadata)
                    else:  # it may have been applied: only a key makes resending safe
                        error.session = name
                        yield error
                    continue
                yield self._rerouted(response, request, name, metadata)
        finally:
            with lock:
                stopped[0] = True
                for pending, call in streams.values():
                    pending.put(None)
                    call.cancel()
            credit.release()  # a dispatcher waiting for credit sees `stopped`
        if failure:
            raise failure[0]

    def _observe_outcome(self, request: pb.ObserveRequest, name: str,
                         metadata: Metadata) -> ObserveResult | QParamsError:
        """One stream item observed in a unary call, as observe makes it (routed,
        following a refusal's owner, retried if keyed): its result, or its error
        naming `name`."""
        try:
            response = self._observe_call(request, None, metadata)
        except QParamsError as e:
            e.session = name
            return e
        return ObserveResult.from_response(response)

    def _rerouted(self, response: pb.ObserveResponse, request: pb.ObserveRequest, name: str,
                  metadata: Metadata) -> ObserveResult | QParamsError:
        """The outcome of one stream item: `response`'s, or, refused naming another
        owner, or failed retryably with a key (a slot frozen by a move), the outcome
        of observing it again as observe does (the owner may be down yet: retried
        while the retry policy allows). Items of one session are observed again one
        at a time, in order."""
        outcome = stream_outcome(response, name)
        if self._follows(response.status) or (request.client_id and retryable_error(outcome)):
            return self._observe_outcome(request, name, metadata)
        return outcome

    # ------------------------------------------------------------------ batches

    def observe_batch(self, items: Iterable[tuple[str, TensorLike]], *, reduce: str = "auto",
                      omit_qparams: bool = False,
                      timeout: float | None = None, metadata: Metadata = None
                      ) -> list[ObserveResult | QParamsError]:
        """Observes every (name, tensor) of `items`, on one or many sessions, in one
        ObserveBatch call (at most 4096 items, within the message size limit); returns,
        in order, one ObserveResult or one QParamsError (the item's refusal, with its
        `session`) per item. reduce and omit_qparams: as for observe.

        Raises:
            TypeError, ValueError: a bad item or argument, before any call.
            ResourceExhausted: more than 4096 items (nothing is observed).
            Unavailable, DeadlineExceeded...: the call failed (after the retries of
                keyed items, see the class); without keys, the server may or may not
                have applied the items. Sharded: one call
                per owning replica; the first failed one (by replica name) is raised,
                and the other replicas applied theirs.
        """
        check_reduce(reduce)
        names, request = [], pb.ObserveBatchRequest()
        for name, x in items:
            names.append(name)
            request.observations.append(self._request(name, x, reduce, omit_qparams))
        failed: dict[str, QParamsError] = {}
        response = self._retry.batch(
            request, lambda part: self._batch_attempt(part, failed, timeout, metadata))
        if failed:  # the last attempt's calls that failed
            raise failed[min(failed)]
        return [stream_outcome(r, name) for r, name in zip(response.responses, names)]

    def _batch_attempt(self, request: pb.ObserveBatchRequest, failed: dict[str, QParamsError],
                       timeout: float | None, metadata: Metadata) -> pb.ObserveBatchResponse:
        """One attempt at `request`: one ObserveBatch (raised if it fails), or one per
        owning replica by the topology read last, then the observations refused
        naming another owner sent there. `failed` is emptied, then holds the calls
        of this attempt that failed, by replica (their observations' status is the
        error)."""
        failed.clear()
        slot_map = self._router.slot_map()
        if slot_map is None:
            response = self._call("ObserveBatch", request, timeout, metadata)
        else:
            response = self._observe_batch_by_owner(slot_map, request, failed, timeout,
                                                    metadata)
        return self._reroute_batch(request, response, failed, timeout, metadata)

    def _observe_batch_by_owner(self, slot_map: SlotMap, request: pb.ObserveBatchRequest,
                                failed: dict[str, QParamsError], timeout: float | None,
                                metadata: Metadata) -> pb.ObserveBatchResponse:
        """ObserveBatch split into one call per owning replica, made concurrently, the
        answers put back in order. A failed call makes its error the status of each
        of its observations' responses and is kept in `failed` by replica."""
        parts = slot_map.split(observation.name for observation in request.observations)
        calls = {}
        for replica, indexes in parts.items():
            part = pb.ObserveBatchRequest(observations=[request.observations[i] for i in indexes])
            calls[replica] = self._stub.ObserveBatch.future(
                part, timeout=timeout or self.timeout,
                metadata=self._addressed(replica, metadata))
        responses: list[pb.ObserveResponse | None] = [None] * len(request.observations)
        for replica, call in calls.items():
            indexes = parts[replica]
            try:
                answer = call.result()
            except grpc.RpcError as e:
                failed[replica] = error_from_rpc(e, replica)
                for i in indexes:
                    responses[i] = _failed_item(failed[replica])
                continue
            if len(answer.responses) != len(indexes):
                raise QParamsError(f"replica {replica}: ObserveBatch answered "
                                   f"{len(answer.responses)} of {len(indexes)} observations")
            for i, response in zip(indexes, answer.responses):
                responses[i] = response
        return pb.ObserveBatchResponse(responses=responses)

    def _reroute_batch(self, request: pb.ObserveBatchRequest, response: pb.ObserveBatchResponse,
                       failed: dict[str, QParamsError], timeout: float | None,
                       metadata: Metadata) -> pb.ObserveBatchResponse:
        """`response` with the observations refused naming another owner sent again in
        one ObserveBatch per owner, addressed to it (the topology read again first);
        their answers replace the refusals, in order. A retry call that fails makes
        its error each of its observations' status (retryable if the call's error
        is: the owner may be down yet) and is kept in `failed` by owner."""
        moved: dict[str, list[int]] = {}
        for i, r in enumerate(response.responses):
            if self._follows(r.status):
                moved.setdefault(r.status.owner, []).append(i)
        if not moved:
            return response
        try:
            self._router.refresh()
        except QParamsError:
            pass
        for owner, indexes in sorted(moved.items()):
            part = pb.ObserveBatchRequest(observations=[request.observations[i] for i in indexes])
            try:
                answer = self._stub.ObserveBatch(part, timeout=timeout or self.timeout,
                                                 metadata=self._addressed(owner, metadata))
            except grpc.RpcError as e:
                failed[owner] = error_from_rpc(e, owner)
                for i in indexes:
                    response.responses[i].CopyFrom(_failed_item(failed[owner]))
                continue
            if len(answer.responses) == len(indexes):
                for i, r in zip(indexes, answer.responses):
                    response.responses[i].CopyFrom(r)
        return response

    def observe_async(self, name: str, x: TensorLike, *, reduce: str = "auto",
                      omit_qparams: bool = False) -> concurrent.futures.Future:
        """Queues one forward of the session `name` on x for the client's background
        sender and returns at once with a Future of its ObserveResult.

        x is reduced (see observe) and copied before this returns, so the caller may
        change it. A background thread sends what is queued in ObserveBatch calls of
        up to 64 observations, once 64 wait, or the oldest has waited 50 ms, or flush()
        asks, or someone waits on a Future; observations of one client are applied in
        the order they were queued.
        At most 256 observations wait at once; beyond that this blocks. The first
        refused observation is also raised by the next observe_async or flush.
        Sharded: each batch is split into one ObserveBatch per owning replica; a
        replica's failed call fails only its own observations.
        reduce and omit_qparams: as for observe.
        """
        check_reduce(reduce)
        request = self._request(name, x, reduce, omit_qparams, key=False)
        self._in_this_process()
        with self._queue_lock:
            if self._queue is None:
                self._queue = ObserveQueue(self._send_batch)
            queue = self._queue
        # Keyed in the order of the queue, which the server applies: sequences keyed
        # apart from it would reach a session out of order, beyond its window.
        with self._submit_lock:
            return queue.submit(self._keys.key(request))

    def _send_batch(self, request: pb.ObserveBatchRequest) -> pb.ObserveBatchResponse:
        """observe_async's sender: the attempts of observe_batch (a failed call fails
        only its own observations)."""
        return self._retry.batch(request, lambda part: self._batch_attempt(part, {}, None, None))

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every observe_async observation is answered; raises the first
        failure among them not raised yet (a QParamsError with its `session`)."""
        self._in_this_process()
        with self._queue_lock:
            queue = self._queue
        if queue is not None:
            queue.flush(timeout)
