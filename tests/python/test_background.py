"""The background queue of observe_async (qparams._background.ObserveQueue) against a
fake ObserveBatch: how it cuts batches, when it sends, and where failures go. No
server; nothing waits on a clock (the linger is an hour unless a test is about it)."""

from __future__ import annotations

import threading

import grpc
import pytest

import qparams
from qparams._background import ObserveQueue
from qparams.v1 import qparams_pb2 as pb

HOUR = 3600.0


class FakeServer:
    """Answers each ObserveBatch call: counts per name, NOT_FOUND for names starting
    with "missing"; `fail` makes the next call raise that gRPC error; `gate`, when
    set, holds every call until it is released."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.counts: dict[str, int] = {}
        self.fail: grpc.StatusCode | None = None
        self.gate: threading.Event | None = None
        self.entered = threading.Semaphore(0)

    def __call__(self, request: pb.ObserveBatchRequest) -> pb.ObserveBatchResponse:
        self.entered.release()
        if self.gate is not None:
            self.gate.wait()
        self.batches.append([o.name for o in request.observations])
        if self.fail is not None:
            code, self.fail = self.fail, None
            raise FakeRpcError(code)
        response = pb.ObserveBatchResponse()
        for o in request.observations:
            r = response.responses.add()
            if o.name.startswith("missing"):
                r.status.code, r.status.message = grpc.StatusCode.NOT_FOUND.value[0], o.name
                continue
            self.counts[o.name] = self.counts.get(o.name, 0) + 1
            r.observation_count = self.counts[o.name]
        return response


class FakeRpcError(grpc.RpcError, grpc.Call):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "the fake server failed"

    def initial_metadata(self): return None
    def trailing_metadata(self): return None
    def is_active(self) -> bool: return False
    def time_remaining(self): return None
    def cancel(self) -> bool: return False
    def add_callback(self, callback) -> bool: return False


def request(name: str, size: int = 0) -> pb.ObserveRequest:
    r = pb.ObserveRequest(name=name)
    r.tensor.dtype, r.tensor.data = pb.FLOAT32, b"\0" * size
    return r


def test_batches_are_cut_by_count_and_by_bytes() -> None:
    server = FakeServer()
    queue = ObserveQueue(server, batch_size=4, batch_bytes=1000, linger=HOUR)
    futures = [queue.submit(request(f"s{i % 2}")) for i in range(10)]
    futures += [queue.submit(request("big", 600)) for _ in range(3)]
    queue.flush()
    sizes = [len(b) for b in server.batches]
    assert sum(sizes) == 13 and max(sizes) <= 4
    assert sizes[:2] == [4, 4]  # full batches leave without waiting for the linger
    assert all(b.count("big") <= 1 for b in server.batches)  # 2 x 600 > 1000 bytes
    assert [f.result().observation_count for f in futures[:10:2]] == [1, 2, 3, 4, 5]
    queue.close()


def test_a_larger_observation_than_batch_bytes_goes_alone() -> None:
    server = FakeServer()
    queue = ObserveQueue(server, batch_bytes=100, linger=HOUR)
    queue.submit(request("a"))
    queue.submit(request("huge", 500))
    queue.submit(request("b"))
    queue.flush()
    assert server.batches == [["a"], ["huge"], ["b"]]
    queue.close()


def test_waiting_on_a_future_sends_at_once() -> None:
    server = FakeServer()
    queue = ObserveQueue(server, linger=HOUR)
    future = queue.submit(request("a"))
    assert future.result(timeout=30).observation_count == 1
    assert queue.submit(request("missing")).exception(timeout=30).session == "missing"
    with pytest.raises(qparams.NotFound):  # also kept for the next call
        queue.flush()
    queue.close()


def test_the_linger_sends_a_lone_observation() -> None:
    server = FakeServer()
    queue = ObserveQueue(server, linger=0.001)
    queue.submit(request("a"))
    assert server.entered.acquire(timeout=30)  # sent without flush, result or close
    queue.close()
    assert server.batches == [["a"]]


def test_close_sends_what_is_queued() -> None:
    server = FakeServer()
    queue = ObserveQueue(server, linger=HOUR)
    futures = [queue.submit(request("a")) for _ in range(3)]
    queue.close()
    assert server.batches == [["a", "a", "a"]]
    assert all(f.done() for f in futures)
    with pytest.raises(RuntimeError, match="closed"):
        queue.submit(request("a"))


def test_a_failed_call_fails_its_whole_batch_and_is_raised_once() -> None:
    server = FakeServer()
    queue = ObserveQueue(server, linger=HOUR)
    server.fail = grpc.StatusCode.UNAVAILABLE
    futures = [queue.submit(request(n)) for n in ("a", "b")]
    with pytest.raises(qparams.Unavailable) as e:
        queue.flush()
    assert e.value.session == "a"
    assert [f.exception().session for f in futures] == ["a", "b"]
    assert all(isinstance(f.exception(), qparams.Unavailable) for f in futures)
    queue.flush()  # raised once; the next batch goes out again
    assert queue.submit(request("a")).result(timeout=30).observation_count == 1
    queue.close()


def test_submit_blocks_at_max_in_flight() -> None:
    server = FakeServer()
    server.gate = threading.Event()
    queue = ObserveQueue(server, max_in_flight=2, batch_size=2, linger=HOUR)
    queue.submit(request("a"))
    queue.submit(request("a"))  # a full batch: sent, and held by the gate
    assert server.entered.acquire(timeout=30)
    third = threading.Thread(target=queue.submit, args=(request("a"),))
    third.start()
    third.join(0.05)
    assert third.is_alive()  # blocked: two unanswered
    server.gate.set()
    third.join(30)
    assert not third.is_alive()
    queue.close()
    assert server.counts == {"a": 3}
