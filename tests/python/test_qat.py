"""Step-merged sessions through qparams.Client.step and resume_steps (docs/qat.md,
reference/qat.md), against the real server: W ranks (threads, each with its own
Client) contribute random batches, ranges and "nothing" in random arrival orders, and
every session's qparams after every step equal, bit for bit, one ordinary session
observed once per step with the concatenated batch (qat.md §3); the worked example
of qat.md §7; bad contributions refused with the field named and nothing changed;
reads as of old steps and past their deadline; retries answered duplicate; a rank
that stops contributing, closed by the step timeout; checkpoints and resume_steps;
a lost answer retried and applied once; and the split of a step call over sharded
replicas behind HAProxy."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import numpy as np
import pytest

import qparams
import qparams._routing
from qparams import StepContribution, StepRead
from qparams._fork_proxy import ProxyRpcError
from qparams.v1 import qparams_pb2 as pb
from qparams.v1 import qparams_pb2_grpc as pb_grpc
from test_sharded import REPLICAS, Cluster, owner_of
from test_sharded import cluster as sharded_cluster  # noqa: F401 (a fixture)

TIMEOUT = 30.0  # seconds: the deadline of every wait of the test's own
CALCULATORS = (("moving_average", 0.5), ("global_minmax", None), ("static", None))
SPECS = {"per_tensor": dict(target="activation", dtype="uint8", qscheme="asymmetric"),
         "per_channel": dict(target="weight", dtype="int8", qscheme="symmetric",
                             granularity="per_channel:1")}


def bits(q: qparams.QParams) -> tuple:
    """Everything a QParams holds, exactly (float32 bit patterns, -0.0 included)."""
    if not q.initialized:
        return (False,)
    return (True, q.shape, q.scale.view(np.uint32).tolist(), q.zero_point.tolist(),
            None if q.minval is None else q.minval.view(np.uint32).tolist())


def create_pairs(client: qparams.Client, name: str) -> list[tuple[str, str]]:
    """(step-merged session, ordinary reference session) for every granularity and
    calculator, created alike."""
    pairs = []
    for kind, spec in SPECS.items():
        for calculator, constant in CALCULATORS:
            stepped, reference = f"{name}/{kind}/{calculator}", f"{name}/ref/{kind}/{calculator}"
            for session in (stepped, reference):
                client.create_session(session, calculator=calculator,
                                      averaging_constant=constant, **spec)
            pairs.append((stepped, reference))
    return pairs


class Plan:
    """Each rank's input of each step, seeded: a (rows, 6) float32 batch (1 to 5 rows,
    channels of different offsets and spreads) or None ("nothing", one time in four;
    some steps have no range at all)."""

    def __init__(self, world: int, steps: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.batches: list[list[np.ndarray | None]] = []
        for t in range(steps):
            row = []
            for _ in range(world):
                if rng.random() < 0.25 or t == 2:  # step 2: nobody carries a range
                    row.append(None)
                    continue
                rows = int(rng.integers(1, 6))
                x = rng.standard_normal((rows, 6)) * rng.uniform(0.1, 3, 6) + rng.uniform(-1, 2, 6)
                row.append(x.astype(np.float32))
            self.batches.append(row)
        # arrival order of each step: a permutation of the ranks
        self.orders = [rng.permutation(world).tolist() for _ in range(steps)]

    def concatenated(self, t: int) -> np.ndarray | None:
        parts = [x for x in self.batches[t] if x is not None]
        return np.concatenate(parts) if parts else None


def reference_states(client: qparams.Client, pairs: list[tuple[str, str]],
                     plan: Plan) -> dict[str, list[tuple]]:
    """Each reference session observed once per step with the step's concatenated
    batch (not at all in a step without one): its qparams after every step."""
    states: dict[str, list[tuple]] = {}
    for stepped, reference in pairs:
        q = qparams.QParams(pb.QParams(shape=[0]), initialized=False)
        states[stepped] = []
        for t in range(len(plan.batches)):
            x = plan.concatenated(t)
            if x is not None:
                q = client.observe(reference, x).qparams
            states[stepped].append(bits(q))
    return states


class Turns:
    """Lets threads act one at a time in a given global order (no sleeps)."""

    def __init__(self) -> None:
        self.position = 0
        self.condition = threading.Condition()

    def wait(self, position: int) -> None:
        with self.condition:
            assert self.condition.wait_for(lambda: self.position == position, TIMEOUT), \
                f"turn {position} never came (at {self.position})"

    def done(self) -> None:
        with self.condition:
            self.position += 1
            self.condition.notify_all()


def run_ranks(target: str, world: int, pairs: list[tuple[str, str]], plan: Plan,
              ordered: bool) -> list[dict[str, list[tuple]]]:
    """W rank threads, each with its own Client, through every step of `plan`; every
    rank reads every session as of every step. `ordered`: the ranks contribute in the
    plan's order, one at a time, each step's call carrying the reads as of the step
    before (which never wait); else concurrently, each call carrying the reads as of
    its own step (which wait for the slowest rank). Returns each rank's reads."""
    names = [stepped for stepped, _ in pairs]
    steps = len(plan.batches)
    turns = Turns()
    seen: list[dict[str, list[tuple]]] = [{n: [None] * steps for n in names} for _ in range(world)]
    errors: list[BaseException] = []

    def record(rank: int, result: qparams.StepResult) -> None:
        for read in result.reads:
            assert read.step >= 0
            seen[rank][read.name][read.step] = bits(read.qparams)

    def rank_main(rank: int) -> None:
        # Ranks alternate: block ranges reduced here, and tensors the server reduces.
        reduce = "always" if rank % 2 == 0 else "never"
        try:
            with qparams.Client(target) as client:
                for t in range(steps):
                    x = plan.batches[t][rank]
                    contributions = [StepContribution(n, t, x) for n in names]
                    if ordered:
                        turns.wait(t * world + plan.orders[t].index(rank))
                        reads = [StepRead(n, t - 1) for n in names] if t else []
                        record(rank, client.step(rank, world, contributions, reads,
                                                 reduce=reduce))
                        turns.done()
                    else:
                        record(rank, client.step(rank, world, contributions,
                                                 [StepRead(n, t) for n in names], reduce=reduce))
                if ordered:
                    record(rank, client.step(rank, world, (), [(n, steps - 1) for n in names]))
        except BaseException as e:  # raised in the test's thread
            errors.append(e)
            with turns.condition:  # the others' turns never come: let them fail fast
                turns.position = -1
                turns.condition.notify_all()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "a rank thread did not finish"
    if errors:
        raise errors[0]
    return seen


@pytest.mark.parametrize("ordered", [True, False], ids=["ordered", "concurrent"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_step_equals_one_session_on_the_concatenated_batch(server, client, name, world,
                                                                 ordered) -> None:
    pairs = create_pairs(client, name)
    plan = Plan(world, steps=7, seed=1000 * world + ordered)
    expected = reference_states(client, pairs, plan)
    seen = run_ranks(server.target, world, pairs, plan, ordered)
    for rank in range(world):
        assert seen[rank] == expected, f"rank {rank}"
    for stepped, reference in pairs:
        a, b = client.get_session(stepped), client.get_session(reference)
        assert (list(a.running_min), list(a.running_max)) == \
            (list(b.running_min), list(b.running_max)), stepped
        assert a.steps.last_applied_step == len(plan.batches) - 1
        assert not a.steps.pending and not a.steps.incomplete


def test_the_worked_example_of_qat_md_7(client, name) -> None:
    stepped, reference = f"{name}/example", f"{name}/reference"
    for session in (stepped, reference):
        client.create_session(session, target="activation", calculator="moving_average",
                              averaging_constant=0.5)
    inputs = [  # (rank 0's input, rank 1's input): their min and max are the table's
        (np.float32([-1, 2]), np.float32([-3, 1])),
        (np.float32([-1, 4]), None),
        (np.float32([0.5, 2]), np.float32([-2, 6])),
    ]
    table = [(-3.0, 2.0), (-2.0, 3.0), (-2.0, 4.5)]
    for t, ((x0, x1), running) in enumerate(zip(inputs, table)):
        first = client.step(1, 2, [(stepped, t, x1)])  # rank 1 first: the order is free
        assert first.contributions[0].last_applied_step == t - 1
        read = client.step(0, 2, [(stepped, t, x0)], [(stepped, t)]).reads[0]
        assert read.step == t
        session = client.get_session(stepped)
        assert (session.running_min[0], session.running_max[0]) == running
        concatenated = np.concatenate([x for x in (x0, x1) if x is not None])
        assert bits(read.qparams) == bits(client.observe(reference, concatenated).qparams)
    session = client.get_session(reference)
    assert (session.running_min[0], session.running_max[0]) == table[-1]


def test_bad_contributions_are_refused_naming_the_field(client, name) -> None:
    client.create_session(name, target="activation", calculator="moving_average")
    client.step(0, 2, [(name, 0, np.float32([-1, 2]))])
    before = client.get_session(name)
    refusals = [
        (dict(rank=2, world=2, x=np.float32([1, 2])), qparams.InvalidArgument, "rank"),
        (dict(rank=-1, world=2, x=np.float32([1, 2])), qparams.InvalidArgument, "rank"),
        (dict(step=-1, x=np.float32([1, 2])), qparams.InvalidArgument, "step"),
        (dict(x=np.float32([1, np.nan])), qparams.InvalidArgument, "NaN"),
        (dict(x=np.float32([1, np.inf])), qparams.InvalidArgument, "infinite"),
        (dict(x=np.float32([[1, 2]])), qparams.FailedPrecondition, "shape"),
        (dict(x=np.float64([1, 2])), qparams.FailedPrecondition, "dtype"),
        (dict(step=5000, x=np.float32([1])), qparams.FailedPrecondition, "ahead"),
    ]
    for case, kind, field in refusals:
        with pytest.raises(kind) as refused:
            client.step(case.get("rank", 1), case.get("world", 2),
                        [(name, case.get("step", 0), case["x"])])
        assert refused.value.session == name
        assert field in refused.value.message, refused.value.message
    # A whole range with a NaN is the range's refusal.
    nan_range = pb.RangeObservation(input_shape=[2], min=pb.Tensor(
        dtype=pb.FLOAT32, shape=[1], data=np.float32([np.nan]).tobytes()), max=pb.Tensor(
        dtype=pb.FLOAT32, shape=[1], data=np.float32([1]).tobytes()))
    with pytest.raises(qparams.InvalidArgument) as refused:
        client.step(1, 2, [(name, 0, nan_range)])
    assert "range.min" in refused.value.message, refused.value.message
    # Nothing changed: rank 1's step 0 is still missing, and completes it.
    assert client.get_session(name).steps == before.steps
    read = client.step(1, 2, [(name, 0, np.float32([-3, 1]))], [(name, 0)]).reads[0]
    assert read.qparams.minval.tolist() == [-3.0]
    # Mistakes the client sees itself.
    with pytest.raises(TypeError):
        client.step(0, 2, [(name, 1.0, np.float32([1]))])
    with pytest.raises(TypeError):
        client.step(0, 2, [(name, 1, [1.0, 2.0])])
    with pytest.raises(TypeError):
        client.step(0, True, [])


def test_reads_retries_and_old_steps(server, client, name) -> None:
    client.create_session(name, target="activation", calculator="global_minmax")
    results = [client.step(0, 1, [(name, t, np.float32([-t, t]))], [(name, t)]) for t in range(10)]
    assert [r.contributions[0].last_applied_step for r in results] == list(range(10))
    # A retry of an applied contribution: duplicate, whatever it carries; nothing applied.
    again = client.step(0, 1, [(name, 3, np.float32([-100, 100]))], [(name, None)])
    assert again.contributions[0].duplicate and again.contributions[0].last_applied_step == 9
    assert again.reads[0].step == 9
    assert bits(again.reads[0].qparams) == bits(results[9].reads[0].qparams)
    # The last 8 applied steps stay readable; older ones are refused.
    assert bits(client.step(0, 1, (), [(name, 2)]).reads[0].qparams) == \
        bits(results[2].reads[0].qparams)
    with pytest.raises(qparams.FailedPrecondition) as refused:
        client.step(0, 1, (), [(name, 1)])
    assert refused.value.session == name
    # A read of a step nobody contributed to waits until the call's deadline.
    with qparams.Client(server.target, retry_total=0) as impatient:
        with pytest.raises(qparams.DeadlineExceeded):
            impatient.step(0, 1, (), [(name, 10)], timeout=0.3)
    # Ordinary observations are refused once the session took a step.
    with pytest.raises(qparams.FailedPrecondition):
        client.observe(name, np.float32([1.0]))


def test_a_rank_that_stops_contributing_is_closed_by_the_step_timeout(client, name) -> None:
    client.create_session(name, target="activation", calculator="moving_average")
    client.step(1, 2, [(name, 0, np.float32([-1, 1]))])  # rank 1 contributes step 0 only
    for t in range(4):
        # Each read waits for rank 1 until the 200 ms step timeout closes the step.
        read = client.step(0, 2, [(name, t, np.float32([-2, 2 + t]))], [(name, t)],
                           step_timeout=0.2).reads[0]
        assert read.step == t and read.initialized
    steps = client.get_session(name).steps
    assert steps.last_applied_step == 3
    assert [(s.step, s.world_size, list(s.missing_ranks)) for s in steps.incomplete] == \
        [(t, 2, [1]) for t in (1, 2, 3)]
    # A late contribution to a step closed without it is refused, naming the step.
    with pytest.raises(qparams.FailedPrecondition) as refused:
        client.step(1, 2, [(name, 2, np.float32([0, 1]))])
    assert "2" in refused.value.message


def run_steps(client: qparams.Client, name: str, first: int, last: int) -> list[tuple]:
    out = []
    for t in range(first, last + 1):
        x = np.random.default_rng(t).standard_normal(8).astype(np.float32) * (1 + t)
        out.append(bits(client.step(0, 1, [(name, t, x)], [(name, t)]).reads[0].qparams))
    return out


def test_checkpoints_and_resume_steps(client, name) -> None:
    client.create_session(name, target="activation", calculator="moving_average",
                          averaging_constant=0.25)
    uninterrupted = run_steps(client, name, 0, 2)
    checkpoint = client.step(0, 1, (), [StepRead(name, 2, checkpoint=True)]).reads[0].checkpoint
    assert checkpoint
    uninterrupted += run_steps(client, name, 3, 7)
    # Only as of the last applied step.
    with pytest.raises(qparams.FailedPrecondition):
        client.step(0, 1, (), [StepRead(name, 5, checkpoint=True)])
    client.step(0, 1, [(name, 8, np.float32([9.0]))])  # an open step the resume discards

    client.resume_steps({name: checkpoint}, 3)
    assert client.get_session(name).steps.last_applied_step == 2
    assert not client.get_session(name).steps.pending
    assert run_steps(client, name, 3, 7) == uninterrupted[3:]  # not duplicates: applied again

    # An empty checkpoint restarts the session uninitialized.
    client.resume_steps({name: b""}, 0)
    assert run_steps(client, name, 0, 7) == uninterrupted
    # A checkpoint belongs to its session.
    client.create_session(f"{name}-other", target="activation", calculator="moving_average",
                          averaging_constant=0.25)
    with pytest.raises(qparams.FailedPrecondition) as refused:
        client.resume_steps({f"{name}-other": checkpoint}, 3)
    assert refused.value.session == f"{name}-other"
    with pytest.raises(qparams.NotFound) as refused:
        client.resume_steps({f"{name}-missing": b""}, 0)
    assert refused.value.session == f"{name}-missing"
    with pytest.raises(TypeError):
        client.resume_steps({name: "text"}, 0)


# ---------------------------------------------------------------- sharded

def test_a_step_call_is_split_by_owning_replica(sharded_cluster: Cluster, monkeypatch) -> None:
    cluster = sharded_cluster
    from qparams import _steps
    names = [f"qat/layer{i}.output" for i in range(12)]
    assert {owner_of(n) for n in names} == set(REPLICAS)
    target = f"unix:{cluster.haproxy.socket}"
    calls: list[Any] = []
    real = _steps._calls

    def spy(client, method, names_, groups, *args: Any) -> Any:
        calls.append(sorted(str(g) for g in groups))
        return real(client, method, names_, groups, *args)

    monkeypatch.setattr(_steps, "_calls", spy)
    world = 2
    plan = Plan(world, steps=4, seed=77)
    with qparams.Client(target) as client:
        pairs = []
        for n in names:
            client.create_session(n, target="activation", calculator="moving_average",
                                  averaging_constant=0.5)
            client.create_session(f"ref/{n}", target="activation",
                                  calculator="moving_average", averaging_constant=0.5)
            pairs.append((n, f"ref/{n}"))
        expected = reference_states(client, pairs, plan)
    seen = run_ranks(target, world, pairs, plan, ordered=False)
    assert seen[0] == seen[1] == expected
    # One call per replica per step call, none refused for another owner.
    assert calls and all(groups == sorted(REPLICAS) for groups in calls), calls

    # A client whose slot map is wrong (r0 owning every slot) sends every item to r0,
    # which refuses the others' naming their owner: those go there, after the
    # topology is read again, and the answers are the same.
    calls.clear()
    with qparams.Client(target) as client:
        real_map = client._router.slot_map()
        client._router._slot_map = qparams._routing.SlotMap(pb.Topology(
            slot_count=real_map.slot_count, replicas=list(REPLICAS), epoch=real_map.epoch,
            ranges=[pb.SlotRange(low=0, high=real_map.slot_count - 1, replica="r0")]))
        last = len(plan.batches) - 1
        result = client.step(0, world, (), [(n, last) for n in names])
        assert [bits(r.qparams) for r in result.reads] == [expected[n][last] for n in names]
        assert client._router.slot_map().owner(names[0]) == owner_of(names[0])
    assert calls[0] == ["r0"] and calls[1] == ["r1", "r2"], calls


class LoseStepAnswers(grpc.UnaryUnaryClientInterceptor):
    """Lets the next `lose` Step calls reach the server and be answered, then drops
    each answer and fails the call with UNAVAILABLE, as a connection cut after the
    server applied it would."""

    def __init__(self, lose: int) -> None:
        self.lose = lose

    def intercept_unary_unary(self, continuation, details, request):  # noqa: ANN001, ANN201
        outcome = continuation(details, request)
        if self.lose > 0 and details.method.endswith("/Step"):
            outcome.result()  # the server answered: it applied the contributions
            self.lose -= 1
            raise ProxyRpcError(grpc.StatusCode.UNAVAILABLE, "the answer was lost", ())
        return outcome


def test_a_lost_answer_is_retried_and_applied_once(server, client, name) -> None:
    client.create_session(name, target="activation", calculator="moving_average",
                          averaging_constant=0.5)
    losing = qparams.Client(server.target, retry_initial_backoff=0.005)
    interceptor = LoseStepAnswers(1)
    losing._service = pb_grpc.QParamsServiceStub(
        grpc.intercept_channel(losing._channel, interceptor))
    with losing:
        first = losing.step(0, 1, [(name, 0, np.float32([-1, 2]))], [(name, 0)])
        interceptor.lose = 2  # twice in a row
        second = losing.step(0, 1, [(name, 1, np.float32([-3, 4]))], [(name, 1)])
    assert interceptor.lose == 0
    # Each contribution reached the server more than once: the retries were duplicates.
    assert first.contributions[0].duplicate and second.contributions[0].duplicate
    session = client.get_session(name)
    assert (session.running_min[0], session.running_max[0]) == (-2.0, 3.0)
    assert session.steps.last_applied_step == 1 and not session.steps.incomplete
    latest = client.step(0, 1, (), [(name, 1)]).reads[0]
    assert bits(second.reads[0].qparams) == bits(latest.qparams)
