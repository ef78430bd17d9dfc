"""One long-lived ObserveStream fed from a bounded queue, so that a training step
hands its observation over and goes on while the network and the server work.

Thread safety: every public method may be called from any thread. Lock order: only
`_lock` (never held while blocking on the network or on the stream's thread).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from qparams._errors import QParamsError, error_from_rpc
from qparams._results import stream_outcome
from qparams.v1 import qparams_pb2 as pb

_CLOSE = object()


class ObserveQueue:
    """Observations sent in order over one ObserveStream, opened on first use and again
    after a failure.

    At most `max_in_flight` observations are queued or unanswered at once; submit()
    blocks beyond that, which bounds the memory held for a slow server. The first
    failure (a refused observation or a broken stream) is kept and raised by the next
    submit() or flush(); every observation's Future also carries its own outcome.
    """

    def __init__(self, open_stream: Callable[[Iterator[pb.ObserveRequest]], Any],
                 max_in_flight: int = 64) -> None:
        self._open_stream = open_stream
        self._max_in_flight = max_in_flight
        self._lock = threading.Condition()
        self._pending: collections.deque[tuple[concurrent.futures.Future, str]] = collections.deque()
        self._outbox: collections.deque[Any] = collections.deque()
        self._error: QParamsError | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, request: pb.ObserveRequest) -> concurrent.futures.Future:
        """Queues `request`; its Future resolves to the response's result, or to the
        error the server answered. Raises the error kept from an earlier observation
        (once), and blocks while max_in_flight observations are unanswered."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._raise_kept_error()
            if self._closed:
                raise RuntimeError("the client is closed")
            while len(self._pending) >= self._max_in_flight:
                self._lock.wait()
                self._raise_kept_error()
            if self._thread is None:
                self._outbox = collections.deque()
                self._thread = threading.Thread(target=self._run, args=(self._outbox,),
                                                name="qparams-observe-stream", daemon=True)
                self._thread.start()
            self._pending.append((future, request.name))
            self._outbox.append(request)
            self._lock.notify_all()
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every submitted observation is answered, then raises the first
        failure not raised yet. TimeoutError if they are not answered in `timeout` s."""
        with self._lock:
            if not self._lock.wait_for(lambda: not self._pending, timeout):
                raise TimeoutError(f"{len(self._pending)} observations still unanswered "
                                   f"after {timeout} s")
            self._raise_kept_error()

    def close(self) -> None:
        """Ends the stream after the queued observations; does not raise their errors."""
        with self._lock:
            self._closed = True
            self._outbox.append(_CLOSE)
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _raise_kept_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _requests(self, outbox: collections.deque) -> Iterator[pb.ObserveRequest]:
        # Each stream reads its own outbox, so that a generator that gRPC has stopped
        # consuming can never take a request meant for the next stream.
        while True:
            with self._lock:
                self._lock.wait_for(lambda: outbox)
                item = outbox.popleft()
            if item is _CLOSE:
                return
            yield item

    def _run(self, outbox: collections.deque) -> None:
        failure: QParamsError | None = None
        try:
            for response in self._open_stream(self._requests(outbox)):
                with self._lock:
                    future, name = self._pending.popleft()
                    outcome = stream_outcome(response, name)
                    if isinstance(outcome, QParamsError):
                        self._error = self._error or outcome
                    self._lock.notify_all()
                if isinstance(outcome, QParamsError):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)
        except grpc.RpcError as e:
            failure = error_from_rpc(e)
        except Exception as e:  # a bug of ours must not strand the waiting observers
            failure = QParamsError(f"the observe stream failed: {e!r}")
        with self._lock:
            # The stream is over: whatever it did not answer fails with it, and the
            # next submit() opens a new one.
            stranded = list(self._pending)
            self._pending.clear()
            outbox.clear()
            outbox.append(_CLOSE)
            self._thread = None
            if stranded:
                failure = failure or QParamsError(
                    f"the observe stream ended before answering {len(stranded)} observations")
                failure.session = stranded[0][1]
                self._error = self._error or failure
            self._lock.notify_all()
        for future, name in stranded:
            error = type(failure)(failure.message)
            error.session = name
            future.set_exception(error)
