"""qparams.torch.RemoteObserver against the real server: torch.ao's eager and FX
flows end to end with bit-for-bit parity to MinMaxObserver/PerChannelMinMaxObserver,
session naming, errors from the background sender, input dtypes and layouts, specs
torch.ao cannot convert, and copies."""

from __future__ import annotations

import copy
import math
import pickle
import re

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.ao.quantization import QConfig, QConfigMapping, convert, prepare
from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qparams
import qparams.torch as qtorch
from qparams.torch import RemoteObserver, name_observers
from helpers import Net, f32_bits


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients():
    """The server waits for open streams when it stops: close them first."""
    yield
    qtorch.close_clients()


@pytest.fixture(autouse=True)
def _no_error_left(server):
    """Every test consumes the errors it provokes: none may leak into the next test."""
    yield
    qtorch.shared_client(server.target).flush(timeout=30)




def same(a: qparams.QParams, b: qparams.QParams) -> bool:
    """Bit-identical qparams (numpy or torch fields). A per-tensor observer's session
    sees tensors flattened: its shape (1,) matches any all-ones shape."""
    def arr(x):
        return None if x is None else np.asarray(x)
    return ((a.shape == b.shape or math.prod(a.shape) == math.prod(b.shape) == 1) and f32_bits(arr(a.scale)) == f32_bits(arr(b.scale))
            and (a.minval is None) == (b.minval is None)
            and (a.minval is None or f32_bits(arr(a.minval)) == f32_bits(arr(b.minval)))
            and (a.zero_point is None) == (b.zero_point is None)
            and (a.zero_point is None
                 or arr(a.zero_point).ravel().tolist() == arr(b.zero_point).ravel().tolist())
            and a.precision == b.precision and a.initialized == b.initialized)


def batches(n: int, shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) * (1 + i) + 0.25 * i for i in range(n)]


class FxNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def remote_qconfig(run: str, target: str) -> QConfig:
    return QConfig(
        activation=RemoteObserver.with_args(run=run, server=target, dtype=torch.quint8,
                                            qscheme=torch.per_tensor_affine),
        weight=RemoteObserver.with_args(run=run, server=target, dtype=torch.qint8,
                                        qscheme=torch.per_channel_symmetric, target="weight"))


TORCH_QCONFIG = QConfig(
    activation=MinMaxObserver.with_args(dtype=torch.quint8, qscheme=torch.per_tensor_affine),
    weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8,
                                              qscheme=torch.per_channel_symmetric))


def assert_same_linear(a, b) -> None:
    """Two quantized Linear modules with bit-identical output and weight qparams."""
    assert f32_bits(a.scale) == f32_bits(b.scale)
    assert a.zero_point == b.zero_point
    wa, wb = a.weight(), b.weight()
    assert f32_bits(wa.q_per_channel_scales()) == f32_bits(wb.q_per_channel_scales())
    assert wa.q_per_channel_zero_points().tolist() == wb.q_per_channel_zero_points().tolist()
    assert wa.q_per_channel_axis() == wb.q_per_channel_axis() == 0
    assert torch.equal(wa.int_repr(), wb.int_repr())


def weight_sessions(client: qparams.Client, run: str) -> dict[tuple[int, ...], str]:
    """The run's weight sessions by qparams shape (the eager weight observers are made
    inside convert, so they keep their counter names)."""
    return {tuple(s.qparams.shape): s.name for s in client.list_sessions(run + "/")
            if s.spec.target == qparams.pb.WEIGHT}


# ---------------------------------------------------------------- torch.ao flows

def test_eager_prepare_convert_matches_sessions_and_torch_ao(server, client, name) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    data = batches(6, (8, 16), seed=1)
    ours, theirs = copy.deepcopy(model), copy.deepcopy(model)
    ours.qconfig = remote_qconfig(name, server.target)
    theirs.qconfig = TORCH_QCONFIG
    prepared, reference = prepare(ours), prepare(theirs)
    named = name_observers(prepared, name)
    assert sorted(named) == [f"{name}/{m}.output" for m in ("fc1", "fc2", "quant")]
    with torch.no_grad():
        for x in data:
            prepared(x)
            reference(x)
    # The quant range comes from the session's resolved spec once it is opened.
    observer = prepared.fc1.activation_post_process
    assert (observer.quant_min, observer.quant_max) == (0, 255)
    # inplace=False deep-copies the prepared model, observers included.
    quantized, expected = convert(prepared, inplace=False), convert(reference)

    assert f32_bits(quantized.quant.scale) == f32_bits(expected.quant.scale)
    assert quantized.quant.zero_point.tolist() == expected.quant.zero_point.tolist()
    assert_same_linear(quantized.fc1, expected.fc1)
    assert_same_linear(quantized.fc2, expected.fc2)

    # ... and they are the sessions' qparams.
    q = client.get_qparams(f"{name}/quant.output")
    assert f32_bits(q.scale) == f32_bits(quantized.quant.scale)
    assert q.zero_point.ravel().tolist() == quantized.quant.zero_point.tolist()
    for layer, shape in (("fc1", (8, 1)), ("fc2", (4, 1))):
        qlinear = getattr(quantized, layer)
        act = client.get_qparams(f"{name}/{layer}.output")
        assert (f32_bits(act.scale), act.zero_point.ravel().tolist()) == (
            f32_bits(qlinear.scale), [qlinear.zero_point])
        weight = client.get_qparams(f"{name}/{layer}.weight")
        assert f32_bits(weight.scale) == f32_bits(qlinear.weight().q_per_channel_scales())
        assert weight.zero_point.ravel().tolist() == \
            qlinear.weight().q_per_channel_zero_points().tolist()
    session = client.get_session(f"{name}/fc1.output")
    assert (session.calculator, session.observation_count) == ("global_minmax", len(data))


@pytest.mark.parametrize("dtype,qscheme,reference,extra", [
    (torch.quint8, torch.per_tensor_affine, MinMaxObserver, {}),
    (torch.qint8, torch.per_tensor_affine, MinMaxObserver, {}),
    (torch.qint8, torch.per_tensor_symmetric, MinMaxObserver, {}),
    (torch.quint8, torch.per_channel_affine, PerChannelMinMaxObserver, dict(ch_axis=1)),
    (torch.qint8, torch.per_channel_symmetric, PerChannelMinMaxObserver,
     dict(ch_axis=0, target="weight")),
])
def test_calculate_qparams_returns_torch_aos_values_and_dtypes(server, name, dtype, qscheme,
                                                               reference, extra) -> None:
    """A drop-in for torch.ao's observers: the same scale bits, zero points, shapes and
    dtypes (torch.ao's zero points are int32 for affine schemes, int64 for symmetric)."""
    ours = RemoteObserver(server=server.target, name=name, dtype=dtype, qscheme=qscheme,
                          **extra)
    theirs = reference(dtype=dtype, qscheme=qscheme,
                       **{k: v for k, v in extra.items() if k == "ch_axis"})
    for x in batches(3, (8, 16), seed=5):
        ours(x)
        theirs(x)
    (scale, zero_point), (want_scale, want_zero_point) = (ours.calculate_qparams(),
                                                          theirs.calculate_qparams())
    assert f32_bits(scale) == f32_bits(want_scale)
    assert zero_point.tolist() == want_zero_point.tolist()
    assert (scale.dtype, scale.shape, zero_point.dtype, zero_point.shape) == (
        want_scale.dtype, want_scale.shape, want_zero_point.dtype, want_zero_point.shape)


def test_fx_prepare_convert_matches_torch_ao(server, client, name) -> None:
    torch.manual_seed(0)
    model = FxNet().eval()
    data = batches(5, (8, 16), seed=2)
    prepared = prepare_fx(copy.deepcopy(model),
                          QConfigMapping().set_global(remote_qconfig(name, server.target)),
                          (data[0],))
    reference = prepare_fx(copy.deepcopy(model), QConfigMapping().set_global(TORCH_QCONFIG),
                           (data[0],))
    named = name_observers(prepared, name)
    assert sorted(named) == [f"{name}/{n}" for n in ("fc1.input", "fc2.input", "fc2.output")]
    with torch.no_grad():
        for x in data:
            prepared(x)
            reference(x)
    quantized, expected = convert_fx(prepared), convert_fx(reference)

    # The input's quantize node: its scale and zero point are graph attributes.
    assert f32_bits(quantized.fc1_input_scale_0) == f32_bits(expected.fc1_input_scale_0)
    assert int(quantized.fc1_input_zero_point_0) == int(expected.fc1_input_zero_point_0)
    assert_same_linear(quantized.fc1, expected.fc1)
    assert_same_linear(quantized.fc2, expected.fc2)
    x = data[-1]
    assert torch.equal(quantized(x), expected(x))
    assert {s.name for s in client.list_sessions(name + "/")} == set(named) | {
        f"{name}/fc1.weight", f"{name}/fc2.weight"}


# ---------------------------------------------------------------- forward and naming

def test_forward_returns_its_input_and_keeps_gradients_away(server, name) -> None:
    obs = RemoteObserver(server=server.target, name=name)
    x = torch.randn(4, 6, requires_grad=True)
    before = x.detach().clone()
    y = x * 2
    out = obs(y)
    assert out is y
    assert list(obs.parameters()) == []
    assert [n for n, _ in obs.named_buffers()] == ["eps", "min_val", "max_val"]
    out.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
    assert torch.equal(x.detach(), before)
    result = obs.last_observation.result(timeout=30)
    assert result.observation_count == 1
    assert obs(torch.empty(0, 6)) is not None  # empty inputs are skipped, as torch.ao does
    obs.flush()
    assert obs.client.get_session(name).observation_count == 1


def test_default_names_and_name_observers(server, client, name, monkeypatch) -> None:
    first = RemoteObserver(server=server.target, run=name)
    second = RemoteObserver(server=server.target, run=name)
    k = int(re.fullmatch(re.escape(name) + r"/observer\.(\d+)", first.session_name).group(1))
    assert second.session_name == f"{name}/observer.{k + 1}"
    monkeypatch.setenv("QPARAMS_RUN", name + "-env")
    assert RemoteObserver().session_name.startswith(name + "-env/observer.")
    monkeypatch.delenv("QPARAMS_RUN")
    generated = qtorch.default_run()
    assert re.fullmatch(r"calib-\d{8}T\d{6}-\d+", generated) and generated == qtorch.default_run()
    assert RemoteObserver(name="a/b").session_name == "a/b"

    model = Net()
    model.qconfig = remote_qconfig(name, server.target)
    prepared = prepare(model)
    named = name_observers(prepared)  # the run each observer was made with
    assert sorted(named) == [f"{name}/{m}.output" for m in ("fc1", "fc2", "quant")]
    assert named[f"{name}/fc1.output"] is prepared.fc1.activation_post_process
    with torch.no_grad():
        prepared(torch.randn(3, 16))
    qtorch.flush_all()
    assert sorted(s.name for s in client.list_sessions(name + "/")) == sorted(named)
    assert all(s.observation_count == 1 for s in client.list_sessions(name + "/"))

    assert name_observers(prepared, name) == named  # the same names again: fine
    with pytest.raises(RuntimeError, match="already uses its session"):
        name_observers(prepared, name + "-other")
    assert prepared.fc1.activation_post_process.session_name == \
        f"{name}/fc1.output"  # nothing renamed
    assert f"session='{name}/fc1.output'" in repr(prepared.fc1)
    assert "calculator='global_minmax'" in repr(prepared.fc1)


def test_arguments_map_to_torch_attributes_and_spec() -> None:
    # Nothing here reaches a server: construction is local. int8/uint8 quant ranges are
    # torch.ao's from the start; other dtypes' stay None until the session resolves them.
    obs = RemoteObserver(server="127.0.0.1:9")
    assert (obs.dtype, obs.qscheme, obs.quant_min, obs.quant_max, obs.reduce_range) == (
        torch.quint8, torch.per_tensor_affine, 0, 255, False)
    spec = obs.quant_spec
    assert (spec.dtype, spec.qscheme, spec.target) == ("uint8", qparams.pb.ASYMMETRIC,
                                                       qparams.pb.ACTIVATION)
    assert spec.granularity.WhichOneof("kind") == "per_tensor"

    obs = RemoteObserver(dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=-1,
                         target="weight")
    assert (obs.dtype, obs.qscheme, obs.ch_axis, obs.quant_min, obs.quant_max) == (
        torch.qint8, torch.per_channel_symmetric, -1, -128, 127)
    assert obs.quant_spec.granularity.per_channel.axis == -1
    assert obs.quant_spec.qscheme == qparams.pb.SYMMETRIC
    assert obs.quant_spec.target == qparams.pb.WEIGHT

    obs = RemoteObserver(dtype="int8", qscheme="symmetric_with_clipping",
                         granularity="per_channel:1")
    assert (obs.dtype, obs.qscheme, obs.ch_axis, obs.quant_min, obs.quant_max) == (
        torch.qint8, torch.per_channel_symmetric, 1, -128, 127)
    obs = RemoteObserver(dtype=torch.quint8, qscheme=torch.per_channel_affine, ch_axis=1,
                         quant_min=0, quant_max=127, spec={"float_range": (None, 6.0)})
    assert (obs.qscheme, obs.quant_min, obs.quant_max) == (torch.per_channel_affine, 0, 127)
    assert obs.quant_spec.float_range.max == 6.0
    assert not obs.quant_spec.float_range.HasField("min")
    obs = RemoteObserver(dtype="float8_e4m3fn", qscheme="symmetric")
    assert (obs.dtype, obs.quant_min, obs.quant_max) == (torch.qint8, None, None)
    assert RemoteObserver(dtype="uint4", qscheme="asymmetric").dtype == torch.quint8

    for bad, error in [
            (dict(dtype=torch.float16), ValueError), (dict(dtype=torch.qint32), ValueError),
            (dict(dtype=3), TypeError),
            (dict(qscheme=torch.per_channel_affine_float_qparams), ValueError),
            (dict(qscheme="clipped"), ValueError), (dict(target="bias"), ValueError),
            (dict(reduce="sometimes"), ValueError), (dict(granularity="per_row"), ValueError),
            (dict(quant_min=0), ValueError), (dict(spec={"dtype": "int8"}), ValueError),
            (dict(spec={"colour": 1}), ValueError), (dict(spec=[("a", 1)]), TypeError),
            (dict(client_options={"target": "x:1"}), ValueError)]:
        with pytest.raises(error):
            RemoteObserver(**bad)
    assert RemoteObserver(torch.qint8).dtype == torch.qint8  # MinMaxObserver's positions


# ---------------------------------------------------------------- errors of the stream

@pytest.mark.parametrize("where", ["forward", "flush", "calculate_qparams"])
def test_deleted_session_raises_not_found_once_at_the_next_call(server, name, where) -> None:
    obs = RemoteObserver(server=server.target, name=name, dtype=torch.qint8,
                         qscheme=torch.per_tensor_symmetric)
    data = batches(3, (4, 8), seed=3)
    obs(data[0])
    obs.flush()
    with qparams.Client(server.target) as other:
        other.delete_session(name)
        obs(data[1])
        # Wait for the server's answer without taking the kept error.
        assert isinstance(obs.last_observation.exception(timeout=30), qparams.NotFound)
        call = {"forward": lambda: obs(data[1]), "flush": obs.flush,
                "calculate_qparams": obs.calculate_qparams}[where]
        with pytest.raises(qparams.NotFound, match=re.escape(name)) as raised:
            call()
        assert raised.value.session == name
        obs.flush()  # raised once, not again

        # Fixed (the session is back): the observer works again.
        other.create_session(name, obs.quant_spec, calculator="global_minmax")
        obs(data[2])
        reference = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
        reference(data[2])
        scale, zero_point = obs.calculate_qparams()
        expected = reference.calculate_qparams()
        assert f32_bits(scale) == f32_bits(expected[0])
        assert zero_point.tolist() == expected[1].tolist()
        assert other.get_session(name).observation_count == 1


@pytest.mark.parametrize("where", ["forward", "flush", "calculate_qparams"])
def test_nan_input_raises_invalid_argument_once_at_the_next_call(server, name, where) -> None:
    obs = RemoteObserver(server=server.target, name=name)
    reference = MinMaxObserver()
    good = batches(2, (4, 8), seed=4)
    obs(good[0])
    reference(good[0])
    bad = good[1].clone()
    bad[1, 2] = float("nan")
    obs(bad)
    assert isinstance(obs.last_observation.exception(timeout=30), qparams.InvalidArgument)
    call = {"forward": lambda: obs(good[1]), "flush": obs.flush,
            "calculate_qparams": obs.calculate_qparams}[where]
    with pytest.raises(qparams.InvalidArgument) as raised:
        call()
    assert raised.value.session == name
    obs.flush()  # once only

    obs(good[1])  # the raising forward observed nothing: this one counts
    reference(good[1])
    scale, zero_point = obs.calculate_qparams()
    expected = reference.calculate_qparams()
    assert (f32_bits(scale), zero_point.tolist()) == (f32_bits(expected[0]),
                                                      expected[1].tolist())
    assert (zero_point.dtype, scale.dtype) == (expected[1].dtype, torch.float32)
    assert obs.client.get_session(name).observation_count == 2


def test_broken_stream_raises_at_flush_and_recovers(start_server, name) -> None:
    s = start_server("--shutdown_grace=1s")
    # No retries: the client would send the flush to the stopped server again for
    # retry_total (30 s) before raising what this test checks.
    obs = RemoteObserver(server=s.target, name=name, client_options={"retry_total": 0})
    obs(torch.randn(4, 4))
    obs.flush()
    s.stop()
    obs(torch.randn(4, 4))
    with pytest.raises(qparams.QParamsError) as raised:  # UNAVAILABLE, or CANCELLED
        obs.flush()                                      # if it met the closing stream
    assert raised.value.session == name
    obs.flush()  # raised once
    qtorch.close_clients()  # the dead server's client goes; observers open new ones


def test_existing_session_is_checked_then_reused(server, client, name) -> None:
    data = batches(4, (6, 8), seed=5)
    # Another rank made it with the same spec (axis 1 where this observer says -1).
    client.create_session(name, dtype="int8", qscheme="asymmetric", target="weight",
                          granularity="per_channel:1", calculator="global_minmax")
    client.observe(name, data[0])
    obs = RemoteObserver(server=server.target, name=name, dtype=torch.qint8,
                         qscheme=torch.per_channel_affine, ch_axis=-1, target="weight")
    reference = PerChannelMinMaxObserver(ch_axis=1, dtype=torch.qint8,
                                         qscheme=torch.per_channel_affine)
    reference(data[0])
    for x in data[1:]:
        obs(x)
        reference(x)
    scale, zero_point = obs.calculate_qparams()
    assert obs.ch_axis == 1  # normalised for torch.ao's _quantize_weight
    expected = reference.calculate_qparams()
    assert (f32_bits(scale), zero_point.tolist()) == (f32_bits(expected[0]),
                                                      expected[1].tolist())
    assert scale.shape == zero_point.shape == (8,)
    assert client.get_session(name).observation_count == len(data)

    for field, kwargs in [("calculator", dict(calculator="static", rule="coreai_opt")),
                          ("dtype", dict(dtype=torch.quint8)),
                          ("qscheme", dict(qscheme=torch.per_channel_symmetric)),
                          ("granularity", dict(ch_axis=0)),
                          ("target", dict(target="activation")),
                          ("float_range", dict(spec={"float_range": (-1.0, None)}))]:
        args = dict(dtype=torch.qint8, qscheme=torch.per_channel_affine, ch_axis=1,
                    target="weight")
        args.update(kwargs)
        other = RemoteObserver(server=server.target, name=name, **args)
        with pytest.raises(qparams.AlreadyExists, match=field) as raised:
            other(data[0])
        assert raised.value.session == name
    assert client.get_session(name).observation_count == len(data)


def test_moving_average_session_takes_its_constant(server, client, name) -> None:
    obs = RemoteObserver(server=server.target, name=name, calculator="moving_average",
                         averaging_constant=0.5)
    for x in batches(3, (4, 4), seed=6):
        obs(x)
    obs.flush()
    session = client.get_session(name)
    assert (session.calculator, session.averaging_constant, session.observation_count) == (
        "moving_average", 0.5, 3)
    with pytest.raises(qparams.AlreadyExists, match="averaging_constant"):
        RemoteObserver(server=server.target, name=name, calculator="moving_average",
                       averaging_constant=0.25)(torch.ones(2))


# ---------------------------------------------------------------- inputs and specs

def _inputs(kind: str, seed: int) -> list[torch.Tensor]:
    base = batches(3, (8, 32), seed)
    if kind == "bfloat16":
        return [x.to(torch.bfloat16) for x in base]
    if kind == "float16":
        return [x.to(torch.float16) for x in base]
    if kind == "transposed":
        return [x.t().t().t() for x in batches(3, (32, 8), seed)]  # (8, 32), strides (1, 8)
    if kind == "sliced":
        return [x[:, ::4] for x in batches(3, (8, 128), seed)]  # (8, 32), not contiguous
    raise AssertionError(kind)


@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel:0", "per_channel:-1"])
@pytest.mark.parametrize("kind", ["bfloat16", "float16", "transposed", "sliced"])
def test_inputs_of_any_dtype_and_layout_match_client_observe(server, client, name, kind,
                                                             granularity) -> None:
    obs = RemoteObserver(server=server.target, name=name, dtype="int8", qscheme="asymmetric",
                         granularity=granularity, rule="coreai_opt")
    client.create_session(name + ".whole", obs.quant_spec, calculator="global_minmax")
    data = _inputs(kind, seed=7)
    if kind in ("transposed", "sliced"):
        assert not data[0].is_contiguous()
    for x in data:
        assert obs(x) is x
        client.observe(name + ".whole", x, reduce="never")
    got = obs.get_qparams()
    assert got.precision == {"bfloat16": "bfloat16", "float16": "float16"}.get(kind, "float32")
    assert isinstance(got.scale, torch.Tensor)
    assert same(got, client.get_qparams(name + ".whole"))
    assert got.shape == {"per_tensor": (1,), "per_channel:0": (8, 1),
                         "per_channel:-1": (1, 32)}[granularity]
    scale, zero_point = obs.calculate_qparams()
    assert f32_bits(scale) == f32_bits(got.scale)
    assert zero_point.tolist() == got.zero_point.ravel().tolist()


@pytest.mark.parametrize("args, reason", [
    (dict(dtype="int4", qscheme="symmetric", granularity="per_block:1:8", target="weight"),
     "dtype int4 is not int8 or uint8.*granularity per_block:1:8 is per-block"),
    (dict(dtype="float8_e4m3fn", qscheme="symmetric"), "dtype float8_e4m3fn is not int8"),
    (dict(dtype="int8", qscheme="symmetric", granularity="per_block:1:32", target="weight",
          spec={"scale_dtype": "float8_e8m0fnu"}),
     "scale_dtype float8_e8m0fnu has no zero point.*per_block:1:32 is per-block"),
    (dict(dtype="float4_e2m1fn_x2", qscheme="symmetric", granularity="per_block:1:32",
          target="weight"), "dtype float4_e2m1fn_x2 is not int8"),
])
def test_other_specs_calibrate_but_refuse_calculate_qparams(server, client, name, args,
                                                            reason) -> None:
    obs = RemoteObserver(server=server.target, name=name, rule="coreai_opt", **args)
    client.create_session(name + ".whole", obs.quant_spec, calculator="global_minmax")
    for x in batches(3, (8, 64), seed=8):
        obs(x)
        client.observe(name + ".whole", x, reduce="never")
    got = obs.get_qparams()
    assert got.initialized and got.scale.numel() > 0
    assert same(got, client.get_qparams(name + ".whole"))
    with pytest.raises(ValueError, match=reason) as raised:
        obs.calculate_qparams()
    assert "torch.ao.quantization cannot convert" in str(raised.value)
    assert "get_qparams()" in str(raised.value) and name in str(raised.value)


def test_a_refused_spec_flushes_before_it_refuses(server, client, name) -> None:
    """calculate_qparams on an NVFP4 spec flushes first, as on any spec: the queued
    observations are applied when it raises, and a failure among them is raised before
    the refusal (issue 37: the refusal came before the flush)."""
    obs = RemoteObserver(server=server.target, name=name, rule="coreai_opt",
                         dtype="float4_e2m1fn_x2", qscheme="symmetric",
                         granularity="per_block:-1:16", target="weight",
                         spec={"scale_dtype": "float8_e4m3fn"})
    data = batches(4, (8, 64), seed=9)
    for x in data:
        obs(x)
    with pytest.raises(ValueError, match="dtype float4_e2m1fn_x2 is not int8"):
        obs.calculate_qparams()
    assert obs.last_observation.done()  # flushed, not merely queued
    assert client.get_session(name).observation_count == len(data)

    bad = data[0].clone()
    bad[0, 0] = float("nan")
    obs(bad)
    with pytest.raises(qparams.InvalidArgument) as raised:
        obs.calculate_qparams()
    assert raised.value.session == name
    with pytest.raises(ValueError, match="torch.ao.quantization cannot convert"):
        obs.calculate_qparams()
    assert client.get_session(name).observation_count == len(data)


def test_uninitialized_session_warns_and_gives_torch_defaults(server, client, name) -> None:
    obs = RemoteObserver(server=server.target, name=name, dtype=torch.qint8,
                         qscheme=torch.per_channel_symmetric, target="weight")
    with pytest.warns(UserWarning, match=re.escape(name)):
        scale, zero_point = obs.calculate_qparams()
    assert scale.tolist() == [1.0] and zero_point.tolist() == [0]
    assert client.get_session(name).initialized is False  # created by the read
    assert obs.get_qparams().initialized is False


# ---------------------------------------------------------------- copies

def test_deepcopy_and_pickle_keep_the_session(server, client, name) -> None:
    obs = RemoteObserver(server=server.target, name=name, dtype=torch.qint8,
                         qscheme=torch.per_channel_symmetric, target="weight")
    reference = PerChannelMinMaxObserver(dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    data = batches(3, (4, 16), seed=9)
    obs(data[0])
    reference(data[0])
    copied = copy.deepcopy(obs)
    restored = pickle.loads(pickle.dumps(obs))
    for twin, x in ((copied, data[1]), (restored, data[2])):
        assert twin.session_name == name and twin is not obs
        assert twin.last_observation is None
        assert twin.client is obs.client  # the process's shared client again
        twin(x)
        reference(x)
    expected = reference.calculate_qparams()
    for o in (obs, copied, restored):
        scale, zero_point = o.calculate_qparams()
        assert (f32_bits(scale), zero_point.tolist()) == (f32_bits(expected[0]),
                                                          expected[1].tolist())
    assert client.get_session(name).observation_count == 3
    # A closed registry: every copy finds the new shared client.
    qtorch.close_clients()
    obs(data[0])
    assert copied.client is obs.client is qtorch.shared_client(server.target)
    obs.flush()
    assert client.get_session(name).observation_count == 4
