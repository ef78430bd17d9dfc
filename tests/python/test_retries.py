"""Safe retries of observations (docs/retries.md) through the Python client: an
answer lost after the server applied the observation (a client interceptor drops it
and fails the call with UNAVAILABLE) is retried with the same key and applied once,
also when the server restarts in between; without keys it is not retried; a forked
child keys with an id of its own."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest

import qparams
from qparams._fork_proxy import ProxyRpcError
from qparams._retry import Keys
from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc

X = np.array([-1.0, 2.0], np.float32)


class LoseAnswers(grpc.UnaryUnaryClientInterceptor):
    """Lets the next `lose` observe calls reach the server and be answered, then
    drops each answer and fails the call with UNAVAILABLE (after `between()`, if
    given), as a connection cut after the server applied it would."""

    def __init__(self) -> None:
        self.lose = 0
        self.lost = 0
        self.between: Callable[[], Any] | None = None

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        outcome = continuation(details, request)
        if self.lose > 0 and details.method.endswith(("/Observe", "/ObserveBatch")):
            outcome.result()  # the server answered: it applied the observation
            self.lose -= 1
            self.lost += 1
            if self.between is not None:
                self.between()
            raise ProxyRpcError(grpc.StatusCode.UNAVAILABLE, "the answer was lost", ())
        return outcome


def losing_client(target: str, **kwargs: Any) -> tuple[qparams.Client, LoseAnswers]:
    """A client whose calls go through a LoseAnswers interceptor."""
    client = qparams.Client(target, retry_initial_backoff=0.005, **kwargs)
    interceptor = LoseAnswers()
    client._service = pb_grpc.QParamsServiceStub(
        grpc.intercept_channel(client._channel, interceptor))
    return client, interceptor


def test_a_lost_answer_is_retried_and_applied_once(server, name) -> None:
    client, lose = losing_client(server.target)
    client.create_session(name, calculator="moving_average", target="activation")
    lose.lose = 1
    result = client.observe(name, X)
    assert lose.lost == 1
    assert result.duplicate and result.observation_count == 1
    assert client.get_session(name).observation_count == 1
    assert result.qparams.scale.tolist() == client.get_qparams(name).scale.tolist()
    after = client.observe(name, X * 2)  # a new key
    assert not after.duplicate and after.observation_count == 2
    client.close()


def test_a_lost_batch_answer_is_retried_and_each_item_applied_once(server, name) -> None:
    client, lose = losing_client(server.target)
    client.create_session(name, calculator="moving_average", target="activation")
    lose.lose = 1
    results = client.observe_batch([(name, X), (name, X * 3)])
    assert [(r.duplicate, r.observation_count) for r in results] == [(True, 1), (True, 2)]
    assert client.get_session(name).observation_count == 2
    client.close()


def test_without_keys_a_lost_answer_is_not_retried(server, name) -> None:
    client, lose = losing_client(server.target, idempotency_keys=False)
    client.create_session(name, calculator="moving_average", target="activation")
    lose.lose = 1
    with pytest.raises(qparams.Unavailable):
        client.observe(name, X)
    assert client.get_session(name).observation_count == 1  # applied, answer lost
    client.close()


def test_a_retry_after_a_server_restart_is_answered_as_a_duplicate(start_server, name,
                                                                   tmp_path) -> None:
    data = f"--data_dir={tmp_path}"
    first = start_server(data, "--durability=always")
    client, lose = losing_client(first.target)
    client.create_session(name, calculator="moving_average", target="activation")
    restarted = []

    def restart() -> None:  # between the applied observation and its retry
        first.stop()
        restarted.append(start_server(data, "--durability=always", f"--listen={first.target}"))

    lose.between = restart
    lose.lose = 1
    result = client.observe(name, X)
    assert restarted and restarted[0].target == first.target
    assert result.duplicate and result.observation_count == 1
    assert client.get_session(name).observation_count == 1
    client.close()


class RefuseSpecFetches(grpc.UnaryUnaryClientInterceptor):
    """Fails the next `refuse` GetSession calls with UNAVAILABLE without sending them,
    as a balancer whose replica is down answers (HTTP 503)."""

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        if self.refuse > 0 and details.method.endswith("/GetSession"):
            self.refuse -= 1
            raise ProxyRpcError(grpc.StatusCode.UNAVAILABLE, "replica down", ())
        return continuation(details, request)


@pytest.mark.parametrize("keys", [True, False])
def test_the_first_observations_spec_fetch_is_retried_with_it(server, name, keys) -> None:
    """The first reduced observation of a name fetches the session's spec: an
    UNAVAILABLE there is retried as the observation is (the soak's client, starting
    while a replica restarted, gave up at once)."""
    with qparams.Client(server.target) as creator:
        creator.create_session(name, calculator="moving_average", target="activation")
    client = qparams.Client(server.target, retry_initial_backoff=0.005,
                            idempotency_keys=keys)
    refuse = RefuseSpecFetches(2)
    client._service = pb_grpc.QParamsServiceStub(grpc.intercept_channel(client._channel, refuse))
    if keys:
        assert client.observe(name, X).observation_count == 1
        assert refuse.refuse == 0
    else:  # no keys, no retries
        with pytest.raises(qparams.Unavailable, match="replica down"):
            client.observe(name, X)
        assert refuse.refuse == 1
    client.close()


def test_retry_options_are_checked() -> None:
    for kwargs in ({"retry_total": -1}, {"retry_initial_backoff": 0},
                   {"retry_initial_backoff": 2.0, "retry_max_backoff": 1.0}):
        with pytest.raises(ValueError, match="retry_"):
            qparams.Client("127.0.0.1:1", **kwargs)


def test_retries_end_within_the_total_time() -> None:
    client = qparams.Client("127.0.0.1:1", retry_total=0.3, retry_initial_backoff=0.01,
                            timeout=2.0)
    start = time.monotonic()
    with pytest.raises(qparams.Unavailable):
        client.observe("nobody/listens", X, reduce="never")
    assert time.monotonic() - start < 3.0
    client.close()


def _child(client: qparams.Client, name: str, queue) -> None:  # noqa: ANN001
    try:
        results = [client.observe(name, X).duplicate for _ in range(2)]
        queue.put(("ok", client.client_id, results))
    except BaseException as e:  # reported to the parent, which fails the test
        queue.put(("error", repr(e), []))


def test_a_forked_child_keys_with_an_id_of_its_own(server, client, name) -> None:
    client.create_session(name, calculator="moving_average", target="activation")
    assert not client.observe(name, X).duplicate  # sequence 1 of the parent's id
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(client, name, queue))
    child.start()
    try:
        kind, child_id, duplicates = queue.get(timeout=120)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert kind == "ok", child_id
    assert child_id != client.client_id and len(child_id) == 22
    assert duplicates == [False, False]  # the child's sequences 1 and 2 are its own
    assert not client.observe(name, X).duplicate  # the parent's sequence 2
    assert client.get_session(name).observation_count == 4


def test_each_thread_keys_under_an_id_of_its_own() -> None:
    """Concurrent threads' calls may reach the server further apart than its window:
    each thread numbers its sessions' observations under its own id (the client's,
    then ".1", ".2", ...), so one thread's keys arrive in order."""
    keys = Keys(True)
    first = keys.key(pb.ObserveRequest(name="s"))
    assert (first.client_id, first.sequence) == (keys.client_id, 1)
    other: list[pb.ObserveRequest] = []
    thread = threading.Thread(
        target=lambda: other.extend(keys.key(pb.ObserveRequest(name="s")) for _ in range(2)))
    thread.start()
    thread.join()
    assert [(r.client_id, r.sequence) for r in other] == [
        (f"{keys.client_id}.1", 1), (f"{keys.client_id}.1", 2)]
    assert keys.key(pb.ObserveRequest(name="s")).sequence == 2
