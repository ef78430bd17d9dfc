"""Idempotency keys and safe retries of observations (docs/retries.md).

Every observation a Client sends carries its key: the client's random `client_id`
and the next `sequence` of its session (ObserveRequest fields). The server applies a
key at most once and answers a retry of an applied one with the original count and
`duplicate` set, so an observation whose call failed with UNAVAILABLE,
DEADLINE_EXCEEDED or UNKNOWN (the server may or may not have applied it) is sent again, with
the same key, after an exponential backoff with jitter, while the next attempt would
start within `total` seconds of the first.
"""

from __future__ import annotations

import os
import random
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from qparams._errors import DeadlineExceeded, Unavailable, Unknown
from qparams.v1 import qparams_pb2 as pb

__all__ = ["Keys", "RetryPolicy"]

# The server never answers UNKNOWN: gRPC reports it for a call a proxy or the transport
# reset ("Stream removed"), which may or may not have been applied (docs/retries.md).
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.UNKNOWN)
_RETRYABLE_CODES = tuple(code.value[0] for code in _RETRYABLE)
T = TypeVar("T")


def _new_client_id() -> str:
    """22 random characters of [A-Za-z0-9_-] (128 bits), as the server takes."""
    return secrets.token_urlsafe(16)


class Keys:
    """The keys of one client: a random client id and, per (thread, session name),
    the last sequence given. Thread-safe. Each thread keys under an id of its own,
    the client's id followed by ".N" for every thread but the first to key: a
    thread's calls are in order, while calls of concurrent threads may reach the
    server in any order, further apart than its window (docs/retries.md). A forked
    child keys with an id of its own (drawn at its first key), so that it and its
    parent, each numbering on, never send the same key."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._start()

    def _start(self) -> None:
        # Also in a forked child, where the parent's lock may have been held at the
        # fork: replaced, not acquired.
        self._pid = os.getpid()
        self._client_id = _new_client_id()
        self._lock = threading.Lock()
        self._sequences: dict[tuple[int, str], int] = {}
        self._threads = 0
        self._local = threading.local()

    @property
    def client_id(self) -> str:
        """This process's client id."""
        if self._pid != os.getpid():
            self._start()
        return self._client_id

    def key(self, request: pb.ObserveRequest) -> pb.ObserveRequest:
        """Gives `request` the next sequence of its session under the calling thread's
        id, unless keys are off or it carries a key already; returns it."""
        if self.enabled and not request.client_id:
            client_id = self.client_id
            with self._lock:
                thread = getattr(self._local, "index", None)
                if thread is None:
                    thread = self._local.index = self._threads
                    self._threads += 1
                sequence = self._sequences.get((thread, request.name), 0) + 1
                self._sequences[(thread, request.name)] = sequence
            request.client_id = client_id if thread == 0 else f"{client_id}.{thread}"
            request.sequence = sequence
        return request


def retryable_error(error: BaseException) -> bool:
    """Whether a failed call may be retried: UNAVAILABLE, DEADLINE_EXCEEDED or UNKNOWN,
    as a QParamsError or as gRPC's own RpcError."""
    if isinstance(error, (Unavailable, DeadlineExceeded, Unknown)):
        return True
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return error.code() in _RETRYABLE
    return False


def retryable_response(response: pb.ObserveResponse) -> bool:
    """Whether a stream or batch item failed with UNAVAILABLE, DEADLINE_EXCEEDED or
    UNKNOWN."""
    return response.status.code in _RETRYABLE_CODES


class RetryPolicy:
    """How long observations are retried: the first wait `initial` seconds (jittered
    in its upper half), doubling up to `maximum`, and no attempt starting later than
    `total` seconds after the first (0: no retry)."""

    def __init__(self, total: float, initial: float, maximum: float) -> None:
        if not total >= 0:
            raise ValueError(f"retry_total must be >= 0 seconds, not {total!r}")
        if not initial > 0:
            raise ValueError(f"retry_initial_backoff must be > 0 seconds, not {initial!r}")
        if not maximum >= initial:
            raise ValueError(f"retry_max_backoff must be >= retry_initial_backoff "
                             f"({initial!r}), not {maximum!r}")
        self.total, self.initial, self.maximum = total, initial, maximum

    def waits(self) -> Callable[[], bool]:
        """A fresh backoff for one call: each call of the result sleeps before the
        next attempt and returns True, or returns False at once when that attempt
        would start too late."""
        deadline = time.monotonic() + self.total
        state = [self.initial]

        def wait() -> bool:
            delay = state[0] * (0.5 + 0.5 * random.random())
            if time.monotonic() + delay > deadline:
                return False
            time.sleep(delay)
            state[0] = min(state[0] * 2, self.maximum)
            return True

        return wait

    def call(self, keyed: bool, attempt: Callable[[], T]) -> T:
        """attempt(), again after each retryable failure while time remains, if the
        request is `keyed` (an unkeyed one could be applied twice)."""
        wait = self.waits()
        while True:
            try:
                return attempt()
            except BaseException as e:
                if not (keyed and retryable_error(e) and wait()):
                    raise

    def batch(self, request: pb.ObserveBatchRequest,
              send: Callable[[pb.ObserveBatchRequest], pb.ObserveBatchResponse]
              ) -> pb.ObserveBatchResponse:
        """send(request), sending again the keyed observations whose call or own
        response failed retryably, while time remains; the responses in order."""
        wait = self.waits()
        responses: list[Any] = [None] * len(request.observations)
        pending = list(range(len(request.observations)))
        while True:
            part = pb.ObserveBatchRequest(observations=[request.observations[i] for i in pending])
            try:
                answer = send(part)
            except BaseException as e:
                keyed = all(observation.client_id for observation in part.observations)
                if not (keyed and retryable_error(e) and wait()):
                    raise
                continue
            if len(answer.responses) != len(pending):
                return answer  # a short answer, which the caller reports
            again = []
            for i, response in zip(pending, answer.responses):
                responses[i] = response
                if request.observations[i].client_id and retryable_response(response):
                    again.append(i)
            if not again or not wait():
                return pb.ObserveBatchResponse(responses=responses)
            pending = again
