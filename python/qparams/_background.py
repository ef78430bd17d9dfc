"""Observations handed over by a training step and sent by a background thread, many
to an ObserveBatch call, so that the step goes on while the network and the server
work and pays gRPC's per-message cost once per batch instead of once per observation.

Thread safety: every public method may be called from any thread. Lock order: only
`_lock` (never held while blocking on the network).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable

import grpc

from qparams._errors import QParamsError, error_from_rpc
from qparams._results import stream_outcome
from qparams.v1 import qparams_pb2 as pb

#: The most observations the server takes in one ObserveBatch.
MAX_BATCH_OBSERVATIONS = 4096


class _Observation(concurrent.futures.Future):
    """A Future whose waiters do not wait for the batch to fill: waiting on it has the
    queue send what it holds at once."""

    def __init__(self, queue: "ObserveQueue") -> None:
        super().__init__()
        self._queue = queue

    def result(self, timeout: float | None = None):  # type: ignore[override]
        if not self.done():
            self._queue.send_now()
        return super().result(timeout)

    def exception(self, timeout: float | None = None):  # type: ignore[override]
        if not self.done():
            self._queue.send_now()
        return super().exception(timeout)


class _Item:
    __slots__ = ("future", "request", "size")

    def __init__(self, future: _Observation, request: pb.ObserveRequest) -> None:
        self.future = future
        self.request = request
        self.size = request.ByteSize()


class ObserveQueue:
    """Observations sent in order by one background thread, in ObserveBatch calls.

    The thread sends what is queued as one batch once `batch_size` observations wait,
    or the oldest has waited `linger` seconds, or flush() or close() asks, or someone
    waits on an observation's Future; while a
    batch is on the wire the next one fills. A batch holds at most `batch_bytes` of
    requests (a larger observation goes alone). At most `max_in_flight` observations
    are queued or unanswered at once; submit() blocks beyond that, which bounds the
    memory held for a slow server. The first failure (a refused observation, or a
    failed call, which fails every observation of its batch) is kept and raised by the
    next submit() or flush(); every observation's Future also carries its own outcome.
    """

    def __init__(self, observe_batch: Callable[[pb.ObserveBatchRequest], pb.ObserveBatchResponse],
                 *, max_in_flight: int = 256, batch_size: int = 64,
                 batch_bytes: int = 4 << 20, linger: float = 0.05) -> None:
        self._observe_batch = observe_batch
        self._max_in_flight = max_in_flight
        self._batch_size = min(batch_size, max_in_flight, MAX_BATCH_OBSERVATIONS)
        self._batch_bytes = batch_bytes
        self._linger = linger
        self._lock = threading.Condition()
        self._queued: collections.deque[_Item] = collections.deque()
        self._oldest = 0.0  # time.monotonic() of the first item queued, while any is
        self._unanswered = 0  # queued or on the wire
        self._flushes = 0  # flush() calls waiting: the thread sends at once
        self._now = False  # send_now() was called since the last batch left
        self._error: QParamsError | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, request: pb.ObserveRequest) -> concurrent.futures.Future:
        """Queues `request`; its Future resolves to the response's result, or to the
        error the server answered. Raises the error kept from an earlier observation
        (once), and blocks while max_in_flight observations are unanswered."""
        item = _Item(_Observation(self), request)
        with self._lock:
            self._raise_kept_error()
            if self._closed:
                raise RuntimeError("the client is closed")
            while self._unanswered >= self._max_in_flight:
                self._lock.wait()
                self._raise_kept_error()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="qparams-observe",
                                                daemon=True)
                self._thread.start()
            if not self._queued:
                self._oldest = time.monotonic()
            self._queued.append(item)
            self._unanswered += 1
            if len(self._queued) in (1, self._batch_size):  # a linger starts, or a batch is full
                self._lock.notify_all()
        return item.future

    def send_now(self) -> None:
        """Has the thread send what is queued without waiting for the batch to fill."""
        with self._lock:
            self._now = True
            self._lock.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Sends what is queued at once, waits until every submitted observation is
        answered, then raises the first failure not raised yet. TimeoutError if they
        are not answered in `timeout` s."""
        with self._lock:
            self._flushes += 1
            self._lock.notify_all()
            try:
                if not self._lock.wait_for(lambda: not self._unanswered, timeout):
                    raise TimeoutError(f"{self._unanswered} observations still unanswered "
                                       f"after {timeout} s")
            finally:
                self._flushes -= 1
            self._raise_kept_error()

    def close(self) -> None:
        """Sends what is queued, then stops the thread; does not raise their errors."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _raise_kept_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _next_batch(self) -> list[_Item] | None:
        """Waits for the next batch to send (None once closed and empty). Holds _lock."""
        while True:
            if self._queued:
                if (self._closed or self._flushes or self._now
                        or len(self._queued) >= self._batch_size):
                    break
                left = self._oldest + self._linger - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(left)
            elif self._closed:
                return None
            else:
                self._lock.wait()
        self._now = False
        batch = [self._queued.popleft()]
        size = batch[0].size
        while (self._queued and len(batch) < self._batch_size
               and size + self._queued[0].size <= self._batch_bytes):
            size += self._queued[0].size
            batch.append(self._queued.popleft())
        if self._queued:
            self._oldest = time.monotonic()
        return batch

    def _run(self) -> None:
        while True:
            with self._lock:
                batch = self._next_batch()
            if batch is None:
                return
            outcomes = self._send(batch)
            with self._lock:
                for item, outcome in zip(batch, outcomes):
                    if isinstance(outcome, QParamsError) and self._error is None:
                        self._error = outcome
                self._unanswered -= len(batch)
                self._lock.notify_all()
            for item, outcome in zip(batch, outcomes):
                if isinstance(outcome, QParamsError):
                    item.future.set_exception(outcome)
                else:
                    item.future.set_result(outcome)

    def _send(self, batch: list[_Item]) -> list:
        """Each item's ObserveResult or QParamsError (naming its session)."""
        request = pb.ObserveBatchRequest()
        request.observations.extend(item.request for item in batch)
        try:
            response = self._observe_batch(request)
            if len(response.responses) != len(batch):
                raise QParamsError(f"ObserveBatch answered {len(response.responses)} of "
                                   f"{len(batch)} observations")
            return [stream_outcome(r, item.request.name)
                    for r, item in zip(response.responses, batch)]
        except grpc.RpcError as e:
            failure = error_from_rpc(e)
        except QParamsError as e:
            failure = e
        except Exception as e:  # a bug of ours must not strand the waiting observers
            failure = QParamsError(f"the background observe call failed: {e!r}")
        outcomes = []
        for item in batch:
            error = type(failure)(failure.message)
            error.session = item.request.name
            outcomes.append(error)
        return outcomes
