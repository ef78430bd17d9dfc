"""qparams.Client against the real server: every method, every error class, tensors
of every supported kind, reduce modes, streams, TLS and tokens."""

from __future__ import annotations

import concurrent.futures
import pathlib
import shutil
import subprocess
import threading

import grpc
import numpy as np
import pytest
import torch

import qparams
from qparams._errors import error_from_status
from conftest import REPO
from helpers import f32_bits


def same(a: qparams.QParams, b: qparams.QParams) -> bool:
    """Bit-identical qparams (-0.0 and NaN told apart by their bits)."""
    return (a.shape == b.shape and f32_bits(a.scale) == f32_bits(b.scale)
            and f32_bits(a.minval) == f32_bits(b.minval)
            and (a.zero_point is None) == (b.zero_point is None)
            and (a.zero_point is None or a.zero_point.tolist() == b.zero_point.tolist())
            and a.precision == b.precision)


def rng_array(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3


# ---------------------------------------------------------------- connecting

def test_target_from_argument_environment_and_default(server, monkeypatch) -> None:
    monkeypatch.delenv("QPARAMS_TARGET", raising=False)
    assert qparams.Client().target == qparams.DEFAULT_TARGET == "127.0.0.1:50051"
    monkeypatch.setenv("QPARAMS_TARGET", server.target)
    with qparams.Client() as c:
        assert c.target == server.target
        assert c.health() == "SERVING"
    assert qparams.Client("elsewhere:1").target == "elsewhere:1"


def test_health_and_calculators(client) -> None:
    assert client.health() == "SERVING"
    assert client.health("qparams.v1.QParamsService") == "SERVING"
    calculators = client.list_calculators()
    assert [c.key for c in calculators] == ["default", "dynamic", "entropy", "global_minmax",
                                            "moving_average", "mse", "percentile", "static"]
    assert {c.key: c.stateful for c in calculators}["dynamic"] is False


def test_bad_client_arguments_fail_before_any_call() -> None:
    with pytest.raises(ValueError, match="timeout"):
        qparams.Client("x:1", timeout=0)
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        qparams.Client("x:1", tls_cert="a.pem")
    with pytest.raises(ValueError, match="printable"):
        qparams.Client("x:1", token="has space")
    with pytest.raises(ValueError, match="needs TLS"):
        qparams.Client("x:1", tls_server_name="localhost")
    with pytest.raises(ValueError, match="cannot be read"):
        qparams.Client("x:1", tls_ca="/nonexistent.pem")


# ---------------------------------------------------------------- compute

@pytest.mark.parametrize("make", [
    lambda a: a, lambda a: a.astype(np.float16), lambda a: a.astype(np.float64),
    lambda a: torch.from_numpy(a), lambda a: torch.from_numpy(a).half(),
    lambda a: torch.from_numpy(a).bfloat16(), lambda a: torch.from_numpy(a).double(),
], ids=["np32", "np16", "np64", "t32", "t16", "tbf16", "t64"])
def test_compute_takes_every_supported_tensor(client, make) -> None:
    x = make(rng_array((4, 6)))
    q = client.compute(x, dtype="int8", qscheme="asymmetric", granularity="per_channel:0")
    assert q.shape == (4, 1) and q.scale.dtype == np.float32 and q.zero_point.dtype == np.int32
    expected = {np.float16: "float16", torch.float16: "float16", torch.bfloat16: "bfloat16",
                np.float64: "float64", torch.float64: "float64"}
    assert q.precision == expected.get(getattr(x, "dtype", None), expected.get(
        getattr(getattr(x, "dtype", None), "type", None), "float32"))


def test_compute_spec_as_mapping_keywords_or_message(client) -> None:
    x = rng_array((8, 4))
    spec = {"dtype": "uint8", "qscheme": "asymmetric", "granularity": {"kind": "per_channel",
                                                                     "axis": 1}}
    a = client.compute(x, spec)
    b = client.compute(x, dtype="uint8", qscheme="asymmetric", granularity="per_channel:1")
    c = client.compute(x, qparams.quant_spec(spec))
    d = client.compute(x, {"dtype": "int8"}, dtype="uint8", qscheme="ASYMMETRIC",
                       granularity="per_channel:1")
    assert same(a, b) and same(a, c) and same(a, d)
    static = client.compute(x, spec, calculator="static")
    assert same(a, static)


def test_non_contiguous_and_transposed_tensors(client) -> None:
    base = rng_array((6, 8), seed=3)
    spec = dict(dtype="int8", qscheme="asymmetric", granularity="per_channel:1")
    for view in (torch.from_numpy(base).t(), torch.from_numpy(base)[:, ::2],
                 torch.from_numpy(base).bfloat16().t()[1::2]):
        assert not view.is_contiguous()
        dense = view.contiguous().clone()
        assert same(client.compute(view, spec), client.compute(dense, spec))
    view = base.T[::2]
    assert not view.flags.c_contiguous
    assert same(client.compute(view, spec), client.compute(np.ascontiguousarray(view), spec))
    big_endian = base.astype(">f4")
    assert same(client.compute(big_endian, spec), client.compute(base, spec))


@pytest.mark.parametrize("x", [
    np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int32), np.ones(2, np.complex64),
    np.ones(2, bool), torch.arange(4), torch.ones(2, dtype=torch.complex64), [1.0, 2.0], 3.0,
], ids=["np-int64", "np-int32", "np-complex", "np-bool", "t-int64", "t-complex", "list",
        "float"])
def test_unsupported_tensors_raise_type_error_naming_the_dtype(client, name, x) -> None:
    with pytest.raises(TypeError) as e:
        client.compute(x)
    dtype = getattr(x, "dtype", None)
    assert (str(dtype) if dtype is not None else type(x).__name__) in str(e.value)
    with pytest.raises(TypeError):
        client.observe(name, x)


def test_non_finite_values_are_the_servers_invalid_argument(client) -> None:
    for bad in (np.nan, np.inf, -np.inf):
        x = rng_array((3, 4))
        x[1, 2] = bad
        with pytest.raises(qparams.InvalidArgument) as e:
            client.compute(x)
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "index 6" in e.value.message


# ---------------------------------------------------------------- sessions

def test_session_lifecycle(client, name) -> None:
    session = client.create_session(name, calculator="global_minmax", dtype="int4",
                                    qscheme="asymmetric", granularity="per_block:1:2",
                                    target="activation")
    assert session.name == name and session.calculator == "global_minmax"
    assert session.spec.quant_min == -8 and session.spec.quant_max == 7
    assert session.spec.range_calculator == "minmax"
    assert client.get_session(name) == session
    q = client.get_qparams(name)
    assert not q.initialized and q.shape == (0,) and q.scale.size == 0
    with pytest.raises(qparams.AlreadyExists):
        client.create_session(name, target="weight")
    client.set_granularity(name, "per_channel:0")
    assert client.get_session(name).spec.granularity.per_channel.axis == 0
    r = client.observe(name, rng_array((3, 4)))
    assert r.observation_count == 1 and r.qparams.shape == (3, 1)
    with pytest.raises(qparams.FailedPrecondition):
        client.set_granularity(name, "per_tensor")
    frozen = client.set_export_mode(name, True)
    assert frozen.export_mode
    cached = client.observe(name, rng_array((3, 4), seed=9) * 100)
    assert same(cached.qparams, r.qparams) and cached.observation_count == 1
    client.set_export_mode(name, False)
    client.delete_session(name)
    with pytest.raises(qparams.NotFound):
        client.get_session(name)
    with pytest.raises(qparams.NotFound):
        client.delete_session(name)


@pytest.mark.parametrize("convention,global_scale", [("", 0x43C00001), ("modelopt", 0x3B2AAAAB)],
                         ids=["compressed_tensors", "modelopt"])
def test_nvfp4_sessions_expose_the_two_level_scales(client, name, convention, global_scale) -> None:
    # nvfp4.md §3.6 E1: blocks of amax 7 and 3.5.
    session = client.create_session(name, calculator="global_minmax", dtype="float4_e2m1fn_x2",
                                    scale_dtype="float8_e4m3fn", convention=convention,
                                    granularity="per_block:-1:16", target="weight")
    assert session.spec.convention == (convention or "compressed_tensors")
    empty = client.get_qparams(name)
    assert empty.shape == (0,) and empty.scale_e4m3 is None
    assert empty.global_scale is None and empty.amax is None
    x = np.zeros((1, 32), np.float32)
    x[0, 3], x[0, 20] = -7, 3.5
    q = client.observe(name, x).qparams
    assert q.scale_e4m3.dtype == np.uint8 and q.scale_e4m3.shape == (1, 2)
    assert q.scale_e4m3.tolist() == [[0x7E, 0x76]]
    assert q.scale.tolist() == [[448.0, 224.0]]
    assert f32_bits(q.global_scale) == [global_scale] and q.amax == 7.0
    assert q.zero_point is None and q.minval is None
    assert q.to_torch().scale_e4m3.tolist() == [[0x7E, 0x76]]
    assert client.get_qparams(name).to_proto() == q.to_proto()
    with pytest.raises(qparams.InvalidArgument, match="spec.convention"):
        client.create_session(name + "x", calculator="static", dtype="float4_e2m1fn_x2",
                              scale_dtype="float8_e4m3fn", convention="ModelOpt",
                              granularity="per_block:-1:16", target="weight")
    plain = client.compute(x, calculator="dynamic")
    assert plain.scale_e4m3 is None and plain.global_scale is None and plain.amax is None


def test_moving_average_takes_its_constant(client, name) -> None:
    s = client.create_session(name, calculator="moving_average", averaging_constant=0.5,
                              target="activation")
    assert s.averaging_constant == 0.5
    with pytest.raises(qparams.InvalidArgument, match="averaging_constant"):
        client.create_session(name + "x", calculator="static", averaging_constant=0.5, target="weight")


def test_list_sessions_pages_through_every_session(client, name) -> None:
    names = [f"{name}/{i:02d}" for i in range(7)]
    for n in reversed(names):
        client.create_session(n, target="weight")
    client.create_session(name + "-outside", target="weight")
    assert [s.name for s in client.list_sessions(name + "/", page_size=2)] == names
    assert [s.name for s in client.list_sessions(name + "/")] == names
    with pytest.raises(qparams.InvalidArgument, match="page_size"):
        list(client.list_sessions(name, page_size=-1))


def test_read_sessions_streams_every_session_under_a_prefix(client, name) -> None:
    names = [f"{name}/{i:03d}" for i in range(70)]  # more than one server page (64)
    for n in reversed(names):
        client.create_session(n, target="weight")
    client.create_session(name + "-outside", target="weight")
    client.observe(names[3], np.array([[1.0, -2.0], [0.5, 4.0]], dtype=np.float32))
    read = list(client.read_sessions(name + "/"))
    assert [s.name for s in read] == names
    assert read == list(client.list_sessions(name + "/"))  # whole sessions, alike
    assert read[3].observation_count == 1
    assert list(client.read_sessions(name + "/none")) == []
    # Closing the iterator early cancels the call; the client goes on working.
    stream = client.read_sessions(name + "/")
    assert next(stream).name == names[0]
    stream.close()
    assert client.get_session(names[0]).name == names[0]
    with pytest.raises(qparams.InvalidArgument, match="prefix"):
        list(client.read_sessions("bad prefix!"))


def test_bad_names_and_specs_are_invalid_argument(client) -> None:
    with pytest.raises(qparams.InvalidArgument, match="name"):
        client.get_session("bad name!")
    with pytest.raises(qparams.InvalidArgument):
        client.create_session("t/badspec", dtype="int9", target="weight")
    with pytest.raises(qparams.InvalidArgument, match="Compute"):
        client.create_session("t/dyn", calculator="dynamic", target="weight")


@pytest.mark.parametrize("bad", ["per_channel", "per_channel:x", "per_block:1:", "per_block:1,",
                                 "per_block:a,b", "per_tensor:0", "channel:0", "per_block:1:2x",
                                 ""])
def test_malformed_granularity_strings_raise_value_error(client, name, bad) -> None:
    with pytest.raises(ValueError, match="granularity"):
        client.create_session(name, granularity=bad, target="weight")
    with pytest.raises(ValueError, match="granularity"):
        client.set_granularity(name, bad)
    with pytest.raises(qparams.NotFound):
        client.get_session(name)  # nothing was sent


def test_other_malformed_values_raise_before_any_call(client, name) -> None:
    with pytest.raises(ValueError, match="qscheme"):
        client.create_session(name, qscheme="sym", target="weight")
    with pytest.raises(ValueError, match="target"):
        client.create_session(name, target="bias")
    with pytest.raises(ValueError, match="unknown spec keys"):
        client.create_session(name, dtyp="int8", target="weight")
    with pytest.raises(ValueError, match="float_range"):
        client.create_session(name, float_range=1.0, target="weight")
    with pytest.raises(ValueError, match="reduce"):
        client.observe(name, rng_array((2,)), reduce="sometimes")
    with pytest.raises(qparams.NotFound):
        client.get_session(name)


# ---------------------------------------------------------------- reduce

SPECS = [
    dict(dtype="int8", qscheme="asymmetric"),
    dict(dtype="int8", qscheme="symmetric", granularity="per_channel:-1"),
    dict(dtype="uint4", qscheme="asymmetric", granularity="per_block:2:4"),
    dict(dtype="int4", qscheme="symmetric", granularity="per_block:-1:2", target="activation"),
    dict(dtype="int8", qscheme="asymmetric", granularity="per_block:2,-1,4"),
    dict(dtype="float8_e4m3fn", granularity="per_channel:0"),
    dict(dtype="float4_e2m1fn_x2", granularity="per_block:-1:4"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: "-".join(map(str, s.values())))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reduce_modes_give_bit_identical_results(client, name, spec, dtype) -> None:
    results = {}
    for reduce in ("never", "always", "auto"):
        session = f"{name}/{reduce}"
        client.create_session(session, calculator="global_minmax", **{"target": "weight", **spec})
        for seed in range(3):
            x = torch.from_numpy(rng_array((4, 6, 8), seed)).to(dtype)
            x[0, 0, 0] = -0.0
            if seed == 2:  # the same shape, transposed from another layout
                x = torch.from_numpy(rng_array((6, 4, 8), seed)).to(dtype).transpose(0, 1)
            r = client.observe(session, x, reduce=reduce)
        results[reduce] = r
    assert same(results["never"].qparams, results["always"].qparams)
    assert same(results["never"].qparams, results["auto"].qparams)


def test_reduce_sends_the_smaller_message(client, name) -> None:
    from qparams._tensors import range_request
    spec = client.create_session(name, granularity="per_channel:0", target="weight").spec
    x = rng_array((4, 256))
    assert range_request(name, x, spec, "auto").HasField("range")
    assert range_request(name, x, spec, "never").HasField("tensor")
    tiny = rng_array((4, 1))  # 8 range values for 4 tensor values
    assert range_request(name, tiny, spec, "auto").HasField("tensor")
    assert range_request(name, tiny, spec, "always").HasField("range")


@pytest.mark.parametrize("reduce", ["never", "always", "auto"])
def test_reduce_modes_fail_alike(client, name, reduce) -> None:
    """The errors are the tensor's own whatever the mode: NaN/Inf, zero-size inputs,
    granularities that do not fit, changed block counts."""
    client.create_session(name, granularity="per_block:1:4", calculator="global_minmax", target="weight")
    outcomes = []
    cases = [np.full((2, 8), np.nan, np.float32), np.zeros((0, 8), np.float32),
             rng_array((2, 6)), rng_array((2, 8)), rng_array((3, 8)),
             rng_array((2, 8)).astype(np.float16)]
    for x in cases:
        try:
            client.observe(name, x, reduce=reduce)
            outcomes.append("ok")
        except qparams.QParamsError as e:
            outcomes.append(f"{e.code.name}: {e.message}")
    assert outcomes[3] == "ok"
    assert [o.split(":")[0] for o in outcomes] == [
        "INVALID_ARGUMENT", "INVALID_ARGUMENT", "INVALID_ARGUMENT", "ok",
        "FAILED_PRECONDITION", "FAILED_PRECONDITION"]
    if reduce == "never":
        test_reduce_modes_fail_alike.never = outcomes
    elif hasattr(test_reduce_modes_fail_alike, "never"):
        assert outcomes == test_reduce_modes_fail_alike.never


def test_a_granularity_changed_by_another_client_is_refetched(server, client, name) -> None:
    client.create_session(name, granularity="per_channel:0", target="weight")
    client.observe(name, rng_array((2, 4)), reduce="always")  # caches the spec
    with qparams.Client(server.target) as other:
        other.delete_session(name)
        other.create_session(name, granularity="per_channel:1", target="weight")
    r = client.observe(name, rng_array((2, 4)), reduce="always")
    assert r.qparams.shape == (1, 4)


# ---------------------------------------------------------------- streams

def test_observe_many_yields_one_outcome_per_item_in_order(client, name) -> None:
    a, b = f"{name}/a", f"{name}/b"
    client.create_session(a, calculator="global_minmax", granularity="per_channel:0", target="weight")
    client.create_session(b, dtype="uint8", qscheme="asymmetric", target="weight")
    bad = rng_array((2, 3))
    bad[0, 0] = np.inf
    items = [(a, rng_array((2, 3), 1)), (b, rng_array((5,), 2)), (f"{name}/none", rng_array((2,))),
             (a, bad), (a, torch.from_numpy(rng_array((2, 3), 3))), (b, rng_array((5,), 4))]
    outcomes = list(client.observe_many(iter(items)))
    assert [type(o).__name__ for o in outcomes] == [
        "ObserveResult", "ObserveResult", "NotFound", "InvalidArgument", "ObserveResult",
        "ObserveResult"]
    assert outcomes[2].session == f"{name}/none" and outcomes[3].session == a
    assert [o.observation_count for o in outcomes if isinstance(o, qparams.ObserveResult)] == \
        [1, 1, 2, 2]
    assert same(outcomes[4].qparams, client.get_qparams(a))


def test_observe_many_matches_observe(client, name) -> None:
    xs = [rng_array((8, 16), seed) for seed in range(20)]
    client.create_session(name + "/one", calculator="moving_average", granularity="per_channel:1",
                          target="activation")
    client.create_session(name + "/many", calculator="moving_average", granularity="per_channel:1",
                          target="activation")
    for x in xs:
        one = client.observe(name + "/one", x)
    results = list(client.observe_many((name + "/many", x) for x in xs))
    assert len(results) == 20 and same(results[-1].qparams, one.qparams)


def test_observe_many_raises_a_bad_item_after_the_answers_before_it(client, name) -> None:
    client.create_session(name, target="weight")
    seen = []
    with pytest.raises(TypeError, match="int64"):
        for outcome in client.observe_many([(name, rng_array((3,))),
                                            (name, np.arange(3)), (name, rng_array((3,)))]):
            seen.append(outcome)
    assert len(seen) == 1
    assert client.get_session(name).observation_count == 1


def test_observe_batch_answers_each_item_in_order(client, name) -> None:
    client.create_session(name, calculator="global_minmax", target="weight")
    client.create_session(name + "/b", calculator="moving_average", averaging_constant=0.5, target="weight")
    bad = rng_array((3,))
    bad[1] = np.inf
    items = [(name, rng_array((3,), 1)), (name + "/b", rng_array((2, 2), 2)), (name, bad),
             (name + "/missing", rng_array((3,))), (name, rng_array((3,), 3))]
    outcomes = client.observe_batch(items)
    assert [type(o).__name__ for o in outcomes] == [
        "ObserveResult", "ObserveResult", "InvalidArgument", "NotFound", "ObserveResult"]
    assert outcomes[2].session == name and outcomes[3].session == name + "/missing"
    assert [o.observation_count for o in (outcomes[0], outcomes[4])] == [1, 2]
    assert same(outcomes[4].qparams, client.get_qparams(name))
    assert client.observe_batch([]) == []
    omitted = client.observe_batch(items[:2], omit_qparams=True, reduce="never")
    assert [o.qparams for o in omitted] == [None, None]
    assert [o.observation_count for o in omitted] == [3, 2]


def test_observe_batch_over_the_limit_observes_nothing(client, name) -> None:
    client.create_session(name, target="weight")
    x = rng_array((2,))
    with pytest.raises(qparams.ResourceExhausted, match="observations"):
        client.observe_batch([(name, x)] * 4097)
    assert client.get_session(name).observation_count == 0
    assert len(client.observe_batch([(name, x)] * 4096, omit_qparams=True)) == 4096
    assert client.get_session(name).observation_count == 4096


def test_omit_qparams_leaves_them_to_get_qparams(client, name) -> None:
    client.create_session(name, calculator="global_minmax", granularity="per_channel:0", target="weight")
    x = rng_array((4, 8))
    result = client.observe(name, x, omit_qparams=True)
    assert result.qparams is None and result.observation_count == 1
    streamed = list(client.observe_many([(name, x), (name, x)], omit_qparams=True))
    assert [(o.qparams, o.observation_count) for o in streamed] == [(None, 2), (None, 3)]
    assert client.observe_async(name, x, omit_qparams=True).result().qparams is None
    assert same(client.observe(name, x).qparams, client.get_qparams(name))


def test_observe_async_keeps_the_order_of_observations(client, name) -> None:
    # moving_average depends on the order: queued observations over several sessions
    # end where observing them one by one ends.
    names = [f"{name}/{i}" for i in range(3)]
    for n in names + [name + "/ref"]:
        client.create_session(n, calculator="moving_average", averaging_constant=0.3, target="weight")
    xs = [rng_array((8,), seed) for seed in range(300)]
    for i, x in enumerate(xs):
        client.observe_async(names[i % 3], x, omit_qparams=True)
        if i % 3 == 0:
            client.observe(name + "/ref", x)
    client.flush()
    assert same(client.get_qparams(names[0]), client.get_qparams(name + "/ref"))
    assert [client.get_session(n).observation_count for n in names] == [100] * 3


def test_observe_async_and_flush(client, name) -> None:
    client.create_session(name, calculator="global_minmax", granularity="per_channel:0", target="weight")
    futures = [client.observe_async(name, rng_array((4, 32), seed)) for seed in range(200)]
    client.flush()
    assert all(f.done() for f in futures)
    assert futures[-1].result().observation_count == 200
    assert client.get_session(name).observation_count == 200


def test_background_errors_are_raised_once_and_never_lost(client, name) -> None:
    client.create_session(name, target="weight")
    ok = client.observe_async(name, rng_array((3,)))
    missing = client.observe_async(name + "/missing", rng_array((3,)))
    with pytest.raises(qparams.NotFound) as e:
        client.flush()
    assert e.value.session == name + "/missing"
    assert ok.result().observation_count == 1
    assert isinstance(missing.exception(), qparams.NotFound)
    client.flush()  # raised once
    bad = rng_array((3,))
    bad[0] = np.nan
    client.observe_async(name, bad)
    with pytest.raises(qparams.InvalidArgument):
        # the next observe_async or flush raises it, whichever comes first
        for _ in range(1000):
            client.observe_async(name, rng_array((3,))).result()
    client.flush()


def test_a_failed_background_call_fails_its_observations(start_server) -> None:
    s = start_server()
    c = qparams.Client(s.target, retry_total=0)  # the server is gone for good: no retries
    c.create_session("s", target="weight")
    c.observe_async("s", rng_array((3,))).result()
    s.stop()
    with pytest.raises(qparams.Unavailable):
        for _ in range(100):
            c.observe_async("s", rng_array((3,)))
        c.flush()
    c.close()


def test_client_is_thread_safe(client, name) -> None:
    client.create_session(name, calculator="global_minmax", target="weight")
    xs = [rng_array((64,), seed) for seed in range(64)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda x: client.observe(name, x), xs))
        list(pool.map(lambda x: client.observe_async(name, x), xs))
    client.flush()
    assert client.get_session(name).observation_count == 128
    expected = np.max(np.abs(np.stack(xs))) / 127.5
    assert abs(client.get_qparams(name).scale.item() - expected) < 1e-6


# ---------------------------------------------------------------- errors

def test_every_status_code_has_its_class() -> None:
    for code in grpc.StatusCode:
        if code == grpc.StatusCode.OK:
            continue
        cls_name = "".join(p.capitalize() for p in code.name.split("_"))
        cls = getattr(qparams, cls_name)
        assert issubclass(cls, qparams.QParamsError) and cls.code == code
        e = error_from_status(code.value[0], "why")
        assert type(e) is cls and e.message == "why" and str(e) == f"{code.name}: why"


def test_transport_errors(name) -> None:
    with qparams.Client("127.0.0.1:1", timeout=5) as c:
        with pytest.raises(qparams.Unavailable):
            c.get_session(name)


def test_deadline_exceeded(start_server) -> None:
    # A stream whose items stop coming outlives its deadline. (Its own server: a call
    # cut by its deadline may stay open on the connection until the server's grace.)
    s = start_server("--shutdown_grace=100ms")
    release = threading.Event()

    def items():
        yield "t/none", rng_array((2,))
        release.wait(30)  # set only once the deadline has passed

    with qparams.Client(s.target) as c:
        try:
            with pytest.raises(qparams.DeadlineExceeded):
                list(c.observe_many(items(), timeout=0.2))
        finally:
            release.set()


def test_resource_exhausted(start_server) -> None:
    s = start_server("--max_tensor_elements=16", "--max_sessions=1")
    with qparams.Client(s.target) as c:
        with pytest.raises(qparams.ResourceExhausted):
            c.compute(rng_array((17,)))
        c.create_session("a", target="weight")
        with pytest.raises(qparams.ResourceExhausted):
            c.create_session("b", target="weight")


def test_tokens_and_tenants(start_server, tmp_path, monkeypatch) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("token-of-tenant-a-0123 a\ntoken-of-tenant-b-0123 b\n")
    s = start_server(f"--auth_tokens_file={tokens}")
    with qparams.Client(s.target) as anonymous:
        assert anonymous.health() == "SERVING"  # health needs no token
        with pytest.raises(qparams.Unauthenticated):
            anonymous.list_calculators()
    with qparams.Client(s.target, token="wrong-token-0123456789") as wrong:
        with pytest.raises((qparams.Unauthenticated, qparams.PermissionDenied)):
            wrong.list_calculators()
    monkeypatch.setenv("QPARAMS_TOKEN", "token-of-tenant-a-0123")
    with qparams.Client(s.target) as a, qparams.Client(s.target, token="token-of-tenant-b-0123") as b:
        a.create_session("shared-name", target="weight")
        with pytest.raises(qparams.NotFound):
            b.get_session("shared-name")


def make_pki(d: pathlib.Path) -> None:
    shutil.copyfile(REPO / "tests/data/test-pki.cnf", d / "pki.cnf")
    req = ["openssl", "req", "-config", "pki.cnf", "-newkey", "ec", "-pkeyopt",
           "ec_paramgen_curve:P-256", "-nodes"]
    run = lambda *argv: subprocess.run(argv, cwd=d, check=True, capture_output=True)
    run(*req, "-x509", "-extensions", "ca_ext", "-days", "2", "-subj", "/CN=test CA",
        "-keyout", "ca.key", "-out", "ca.pem")
    for who, cn, serial in (("server", "localhost", "2"), ("client", "test client", "3")):
        run(*req, "-new", "-subj", f"/CN={cn}", "-keyout", f"{who}.key", "-out", f"{who}.csr")
        run("openssl", "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-set_serial", serial, "-days", "2", "-extfile", "pki.cnf", "-extensions",
            f"{who}_ext", "-out", f"{who}.pem")


def test_mutual_tls(start_server, tmp_path) -> None:
    make_pki(tmp_path)
    p = lambda f: str(tmp_path / f)
    s = start_server(f"--tls_cert={p('server.pem')}", f"--tls_key={p('server.key')}",
                     f"--tls_client_ca={p('ca.pem')}")
    with qparams.Client(s.target, tls_ca=p("ca.pem"), tls_cert=p("client.pem"),
                        tls_key=p("client.key"), tls_server_name="localhost") as c:
        assert [x.key for x in c.list_calculators()][0] == "default"
    with qparams.Client(s.target, tls_ca=p("ca.pem"), tls_server_name="localhost",
                        timeout=5) as no_cert:
        with pytest.raises(qparams.Unavailable):
            no_cert.list_calculators()
    with qparams.Client(s.target, timeout=5) as plaintext:
        with pytest.raises(qparams.Unavailable):
            plaintext.list_calculators()


def test_qparams_results(client) -> None:
    import pickle
    q = client.compute(rng_array((4, 6)), dtype="int8", qscheme="asymmetric",
                       granularity="per_channel:0")
    assert pickle.loads(pickle.dumps(q)) == q and q.to_proto().shape == [4, 1]
    t = q.to_torch()
    assert isinstance(t.scale, torch.Tensor) and t.scale.dtype == torch.float32
    assert t.zero_point.dtype == torch.int32 and t.minval.shape == (4, 1)
    assert f32_bits(t.scale) == f32_bits(q.scale) and "QParams(shape=(4, 1)" in repr(q)
    floating = client.compute(rng_array((4,)), dtype="float8_e4m3fn")
    assert floating.zero_point is None and floating.minval is None


def test_session_calls_carry_the_routing_header() -> None:
    """Each call naming a session sends it as x-qparams-session (what a balancer in
    front of sharded replicas routes on); calls naming none send no such header."""
    seen: list[tuple[str, str | None]] = []

    def record(method: str):
        def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
            headers = dict(context.invocation_metadata())
            seen.append((method, headers.get(qparams.client.SESSION_HEADER)))
            context.abort(grpc.StatusCode.UNAVAILABLE, "recorded")
        return grpc.unary_unary_rpc_method_handler(handler)

    methods = ["GetSession", "DeleteSession", "GetQParams", "SetExportMode", "ListSessions"]
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "qparams.v1.QParamsService", {m: record(m) for m in methods})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with qparams.Client(f"127.0.0.1:{port}", token="t0ken-for-routing-test") as client:
            for call in (lambda: client.get_session("run/fc1.weight"),
                         lambda: client.delete_session("run/fc1.weight"),
                         lambda: client.get_qparams("run/fc1.weight"),
                         lambda: client.set_export_mode("run/fc1.weight"),
                         lambda: list(client.list_sessions("run/")),
                         lambda: client.get_session("bad\nname")):
                with pytest.raises(qparams.Unavailable):
                    call()
    finally:
        server.stop(grace=None)
    assert seen == [("GetSession", "run/fc1.weight"), ("DeleteSession", "run/fc1.weight"),
                    ("GetQParams", "run/fc1.weight"), ("SetExportMode", "run/fc1.weight"),
                    ("ListSessions", None), ("GetSession", None)]


def test_topology_of_an_unsharded_server(client) -> None:
    topology = client.topology()
    assert topology.slot_count == 256
    assert topology.replica_id == ""
    assert [(r.low, r.high, r.replica) for r in topology.ranges] == [(0, 255, "")]
