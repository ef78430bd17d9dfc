"""The PyTorch paths users take after eager mode, against the real server: FX mode on
CNNs and MLPs with flatten, reshape, pooling, residual adds and concatenation; fork,
forkserver and spawn children and DataLoader workers; sessions named after layers and
exports that carry the model's own names; torch.ao's observer contract (its
arguments, custom ranges, float16/bfloat16 inputs, state_dict and an offline
convert); runs that are not silently reused.
"""

from __future__ import annotations

import copy
import json
import multiprocessing
import pickle
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from torch.ao.quantization import (DeQuantStub, QConfig, QConfigMapping, QuantStub, convert,
                                   fuse_modules, prepare)
from torch.ao.quantization.observer import MinMaxObserver, PerChannelMinMaxObserver
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qparams
import qparams.torch as qtorch
from qparams.torch import RemoteObserver, name_observers, onnx_tensor_names
from helpers import f32_bits


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients():
    """The server waits for open streams when it stops: close them first."""
    yield
    qtorch.close_clients()


def remote(run: str, server, **activation: object) -> QConfig:
    return QConfig(
        activation=RemoteObserver.with_args(run=run, server=server.target, **activation),
        weight=RemoteObserver.with_args(run=run, server=server.target, dtype=torch.qint8,
                                        qscheme=torch.per_channel_symmetric))


TORCH = QConfig(activation=MinMaxObserver.with_args(dtype=torch.quint8),
                weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8,
                                                          qscheme=torch.per_channel_symmetric))


def data(n: int, shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) * (1 + i) + 0.25 * i for i in range(n)]


def qparams_bits(scale: torch.Tensor, zero_point: torch.Tensor) -> tuple:
    return f32_bits(scale), zero_point.tolist(), str(zero_point.dtype)


# ---------------------------------------------------------------- FX mode

class CNN(nn.Module):
    """conv -> relu -> pool -> flatten -> linear, a residual add and a concat."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4 + 16, 10)

    def forward(self, x):
        y = self.relu(self.conv1(x))
        y = y + self.conv2(y)                       # residual add
        a = torch.flatten(self.pool(y), 1)          # (N, 64)
        b = self.avg(y).reshape(x.shape[0], -1)     # (N, 16)
        return self.fc(torch.cat([a, b], dim=1))


class MLP(nn.Module):
    """Linear layers with a reshape between them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(8, 6)
        self.fc3 = nn.Linear(24, 3)

    def forward(self, x):
        y = torch.relu(self.fc1(x)).reshape(-1, 4, 8)
        y = self.fc2(y).view(y.shape[0], 24)
        return self.fc3(y)


@pytest.mark.parametrize("model_class, shape", [(CNN, (4, 1, 8, 8)), (MLP, (5, 16))],
                         ids=["cnn", "mlp"])
def test_fx_calibration_matches_torch_ao_bit_for_bit(server, client, name, model_class,
                                                     shape) -> None:
    torch.manual_seed(0)
    model = model_class().eval()
    example = (torch.randn(shape),)
    ours = prepare_fx(copy.deepcopy(model), QConfigMapping().set_global(remote(name, server)),
                      example)
    theirs = prepare_fx(copy.deepcopy(model), QConfigMapping().set_global(TORCH), example)
    names = name_observers(ours, name)
    assert all(n.startswith(name + "/") for n in names)
    with torch.no_grad():
        for x in data(5, shape, seed=3):
            ours(x)
            theirs(x)
    # Every observer pair, in graph order, gives the same qparams and dtypes.
    def observers(gm: torch.fx.GraphModule) -> list:
        modules = dict(gm.named_modules(remove_duplicate=False))
        return [modules[n.target] for n in gm.graph.nodes
                if n.op == "call_module" and "activation_post_process" in str(n.target)]
    pairs = list(zip(observers(ours), observers(theirs)))
    assert pairs and all(isinstance(a, RemoteObserver) for a, _ in pairs)
    for a, b in pairs:
        assert qparams_bits(*a.calculate_qparams()) == qparams_bits(*b.calculate_qparams())
    q_ours, q_theirs = convert_fx(ours), convert_fx(theirs)
    for x in data(3, shape, seed=4):
        assert torch.equal(q_ours(x), q_theirs(x))
    # Layers' names, weights included (made inside convert_fx).
    sessions = {s.name[len(name) + 1:] for s in client.list_sessions(name + "/")}
    weights = {n for n, p in model.named_parameters() if n.endswith("weight")}
    assert weights <= sessions, sessions
    assert "fc.input" in sessions or "fc3.input" in sessions, sessions


def test_per_tensor_observer_takes_any_rank(server, client, name) -> None:
    obs = RemoteObserver(run=name, server=server.target)
    ref = MinMaxObserver()
    for x in (torch.randn(2, 3, 4, 4), torch.randn(2, 48) * 3, torch.randn(7)):
        obs(x)
        ref(x)
    assert qparams_bits(*obs.calculate_qparams()) == qparams_bits(*ref.calculate_qparams())


# ---------------------------------------------------------------- fork, spawn, workers

def _child_observe(observer: RemoteObserver, seed: int, queue) -> None:
    try:
        for x in data(3, (4, 5), seed):
            observer(x)
        observer.flush()
        queue.put(("ok", observer.client.get_session(observer.session_name).observation_count))
    except BaseException as e:  # reported to the parent, which fails the test
        queue.put(("error", repr(e)))


def _run_children(method: str, target, args: list[tuple]) -> list[tuple]:
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    children = [context.Process(target=target, args=(*a, queue)) for a in args]
    for child in children:
        child.start()
    try:
        return [queue.get(timeout=120) for _ in children]
    finally:
        for child in children:
            child.join(60)
            if child.is_alive():
                child.kill()


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_children_observe_after_the_parent_used_the_client(server, name, method) -> None:
    obs = RemoteObserver(server=server.target, name=name)
    ref = MinMaxObserver()
    for x in data(2, (4, 5), seed=10):
        obs(x)
        ref(x)
    obs.flush()  # the parent's client and its background thread are in use
    outcomes = _run_children(method, _child_observe, [(obs, 20 + i) for i in range(2)])
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    for i in range(2):
        for x in data(3, (4, 5), 20 + i):
            ref(x)
    for x in data(1, (4, 5), seed=11):  # the parent's client still works after
        obs(x)
        ref(x)
    assert qparams_bits(*obs.calculate_qparams()) == qparams_bits(*ref.calculate_qparams())
    assert obs.client.get_session(name).observation_count == 2 + 6 + 1


def test_forked_children_observe_through_their_helpers(server, name) -> None:
    obs = RemoteObserver(server=server.target, name=name)
    ref = MinMaxObserver()
    for x in (torch.ones(3), torch.full((3,), -2.0)):
        obs(x)
        ref(x)
    obs.flush()  # the parent's client and its background thread are in use
    outcomes = _run_children("fork", _child_observe, [(obs, 30 + i) for i in range(2)])
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    for i in range(2):
        for x in data(3, (4, 5), 30 + i):
            ref(x)
    obs(torch.full((3,), 2.0))  # the parent works on
    ref(torch.full((3,), 2.0))
    assert qparams_bits(*obs.calculate_qparams()) == qparams_bits(*ref.calculate_qparams())
    assert obs.client.get_session(name).observation_count == 2 + 6 + 1


def _calls_everything(client: qparams.Client, name: str) -> list:
    """Unary, stream, batch, async, listing, stateless and error paths of `client`."""
    x = np.array([[1.0, -3.0]], np.float32)
    results = [client.observe(name, x).observation_count]
    results += [r.observation_count for r in client.observe_many([(name, x), (name, x)])]
    results.append(client.observe_batch([(name, x)])[0].observation_count)
    client.observe_async(name, x)
    client.flush()
    results.append(len(list(client.read_sessions(name))))
    results.append(len(list(client.list_sessions(name))))
    results.append(client.get_qparams(name).initialized)
    results.append(float(client.compute(x, dtype="int8").scale.ravel()[0]) > 0)
    results.append(client.topology().slot_count)
    results.append(client.health())
    try:
        client.get_session(name + ".missing")
    except qparams.NotFound as e:
        results.append(e.code.name)
    client.close()
    return results


EVERYTHING = [2, 3, 4, 5, 1, 1, True, True, 256, "SERVING", "NOT_FOUND"]


def _child_calls_everything(client: qparams.Client, name: str, queue) -> None:
    """A forked child's calls through the client it inherited, reported."""
    try:
        queue.put(("ok", _calls_everything(client, name)))
    except BaseException as e:  # reported to the parent, which fails the test
        queue.put(("error", repr(e)))


def _child_makes_a_client(target: str, name: str, queue) -> None:
    """A forked child's calls through a client it creates (a DataLoader
    worker_init_fn, a multiprocessing function), reported."""
    try:
        queue.put(("ok", _calls_everything(qparams.Client(target), name)))
    except BaseException as e:  # reported to the parent, which fails the test
        queue.put(("error", repr(e)))


def test_a_forked_client_makes_every_kind_of_call(server, client, name) -> None:
    client.create_session(name, target="activation", calculator="global_minmax")
    client.observe(name, np.ones((1, 2), np.float32))
    [(kind, results)] = _run_children("fork", _child_calls_everything, [(client, name)])
    assert kind == "ok", results
    assert results == EVERYTHING
    assert client.get_session(name).observation_count == 6  # and the parent works on


def test_a_client_created_in_a_forked_child_makes_every_kind_of_call(server, client,
                                                                     name) -> None:
    """The parent made calls (gRPC's core runs in it) before the fork; the child's
    own new Client works on its first call, with no setting."""
    client.create_session(name, target="activation", calculator="global_minmax")
    client.observe(name, np.ones((1, 2), np.float32))
    [(kind, results)] = _run_children("fork", _child_makes_a_client, [(server.target, name)])
    assert kind == "ok", results
    assert results == EVERYTHING
    assert client.get_session(name).observation_count == 6  # and the parent works on


class _Dataset(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> torch.Tensor:
        return data(1, (6,), seed=100 + i)[0]


class _ObservingDataset(_Dataset):
    """A dataset whose workers observe what they load (a forked worker's calls)."""

    def __init__(self, observer: RemoteObserver) -> None:
        self.observer = observer

    def __getitem__(self, i: int) -> torch.Tensor:
        x = super().__getitem__(i)
        self.observer(x)
        self.observer.flush()
        return x


def test_dataloader_workers_that_observe(server, name) -> None:
    obs = RemoteObserver(server=server.target, name=name)
    obs(torch.zeros(6))
    obs.flush()
    loader = torch.utils.data.DataLoader(_ObservingDataset(obs), batch_size=3, num_workers=2)
    ref = MinMaxObserver()
    ref(torch.zeros(6))
    for _ in range(2):
        for batch in loader:
            ref(batch)
    assert qparams_bits(*obs.calculate_qparams()) == qparams_bits(*ref.calculate_qparams())
    assert obs.client.get_session(name).observation_count == 1 + 2 * 12


def test_dataloader_workers_fork_while_observing(server, name) -> None:
    obs = RemoteObserver(server=server.target, name=name)
    ref = MinMaxObserver()
    loader = torch.utils.data.DataLoader(_Dataset(), batch_size=3, num_workers=2)
    for _ in range(3):  # workers forked each epoch while the sender thread runs
        for batch in loader:
            obs(batch)
            ref(batch)
    assert qparams_bits(*obs.calculate_qparams()) == qparams_bits(*ref.calculate_qparams())
    assert obs.client.get_session(name).observation_count == 12


# ---------------------------------------------------------------- layer names and exports

class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quant = QuantStub()
        self.conv = nn.Conv2d(1, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(8 * 4 * 4, 32)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(32, 10)
        self.dequant = DeQuantStub()

    def forward(self, x):
        x = self.pool(self.relu(self.conv(self.quant(x))))
        x = self.relu1(self.fc1(torch.flatten(x, 1)))
        return self.dequant(self.fc2(x))


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return x, torch.tensor(d.target)


def trained_digits_cnn() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x, y = digits()
    model = DigitsCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        for i in range(0, 1500, 50):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[i:i + 50]), y[i:i + 50]).backward()
            optimizer.step()
    return model.eval(), x, y


def test_calibrate_convert_export_and_reload_by_layer_name(server, client, name,
                                                           tmp_path) -> None:
    model, x, y = trained_digits_cnn()
    fused = fuse_modules(copy.deepcopy(model), [["conv", "relu"], ["fc1", "relu1"]])
    prepared = copy.deepcopy(fused)
    prepared.qconfig = remote(name, server)
    prepared = prepare(prepared)
    name_observers(prepared, name)
    with torch.no_grad():
        for i in range(1500, 1797, 60):
            prepared(x[i:i + 60])
    quantized = convert(prepared)
    accuracy = (quantized(x[:1500]).argmax(1) == y[:1500]).float().mean().item()
    assert accuracy > 0.8

    sessions = sorted(s.name[len(name) + 1:] for s in client.list_sessions(name + "/"))
    assert sessions == ["conv.output", "conv.weight", "fc1.output", "fc1.weight",
                        "fc2.output", "fc2.weight", "quant.output"], sessions

    # ONNX: the names of the same (fused) model exported by torch.onnx.export.
    names = onnx_tensor_names(fused, (x[:2],))
    path = tmp_path / "model.onnx"
    torch.onnx.export(fused, (x[:2],), str(path))
    graph = onnx.load(str(path)).graph
    tensors = ({t.name for t in graph.initializer} | {i.name for i in graph.input}
               | {o for n in graph.node for o in n.output})
    for fmt in ("onnx", "aimet"):
        document = json.loads(client.export(name + "/", fmt, tensor_names=names))
        entries = (document["encodings"] if fmt == "onnx" else
                   document["activation_encodings"] + document["param_encodings"])
        assert len(entries) == 7
        assert {e["name"] for e in entries} <= tensors, fmt

    # AIMET's encodings, loaded back by the model's own parameter names, are the
    # converted model's weight qparams.
    aimet = json.loads(client.export(name + "/", "aimet", tensor_names=names))
    by_name = {e["name"]: e for e in aimet["param_encodings"]}
    for module, param in (("conv", "conv.0.weight"), ("fc1", "fc1.0.weight"),
                          ("fc2", "fc2.weight")):
        weight = getattr(quantized, module).weight()
        assert f32_bits(by_name[param]["scale"]) == f32_bits(weight.q_per_channel_scales())

    # compressed-tensors: module targets are the model's modules.
    state_dict, config = client.export_compressed_tensors(name + "/")
    assert {"conv.weight_scale", "fc1.weight_scale", "fc2.weight_scale"} <= set(state_dict)
    targets = {t for group in config["config_groups"].values() for t in group["targets"]}
    assert {"conv", "fc1", "fc2"} <= targets
    modules = dict(model.named_modules())
    assert all(t in modules for t in targets if t != "quant"), targets


# ---------------------------------------------------------------- torch.ao's contract

@pytest.mark.parametrize("args", [
    dict(dtype=torch.quint8, qscheme=torch.per_tensor_symmetric, quant_min=0, quant_max=127),
    dict(dtype=torch.quint8, qscheme=torch.per_tensor_affine, quant_min=0, quant_max=100),
    dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, quant_min=-100, quant_max=100),
    dict(dtype=torch.quint8, qscheme=torch.per_tensor_affine, reduce_range=True),
    dict(dtype=torch.qint8, qscheme=torch.per_tensor_affine, reduce_range=True),
    dict(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, eps=1e-3),
], ids=["quint8-sym-0-127", "quint8-affine-0-100", "qint8-sym-100", "quint8-reduce",
        "qint8-reduce", "eps"])
def test_custom_ranges_follow_torch_ao(server, name, args) -> None:
    obs = RemoteObserver(server=server.target, name=name, **args)
    ref = MinMaxObserver(**args)
    for x in data(3, (4, 6), seed=5):
        obs(x * 1e-4 if "eps" in args else x)
        ref(x * 1e-4 if "eps" in args else x)
    assert (obs.quant_min, obs.quant_max) == (ref.quant_min, ref.quant_max)
    assert qparams_bits(*obs.calculate_qparams()) == qparams_bits(*ref.calculate_qparams())


def test_custom_symmetric_uint8_zero_point_by_rule(server, name) -> None:
    args = dict(dtype=torch.quint8, qscheme=torch.per_tensor_symmetric, quant_min=0,
                quant_max=127)
    torch_rule = RemoteObserver(server=server.target, name=name + "/torch", **args)
    coreai = RemoteObserver(server=server.target, name=name + "/coreai", rule="coreai_opt",
                            **args)
    for obs in (torch_rule, coreai):
        obs(torch.tensor([-1.0, 2.0, 0.5]))
    assert torch_rule.calculate_qparams()[1].item() == 63  # (0 + 127) // 2, torch.ao's
    assert coreai.calculate_qparams()[1].item() == 64      # coreai_opt's


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_compute_as_torch_ao_or_as_coreai_opt(server, name, dtype) -> None:
    torch_rule = RemoteObserver(server=server.target, name=name + "/torch",
                                qscheme=torch.per_tensor_symmetric, dtype=torch.qint8)
    coreai = RemoteObserver(server=server.target, name=name + "/coreai", rule="coreai_opt",
                            qscheme=torch.per_tensor_symmetric, dtype=torch.qint8)
    ref = MinMaxObserver(qscheme=torch.per_tensor_symmetric, dtype=torch.qint8)
    for x in data(3, (8, 9), seed=6):
        x = (x / 3).to(dtype)
        for obs in (torch_rule, coreai, ref):
            obs(x)
    assert qparams_bits(*torch_rule.calculate_qparams()) == qparams_bits(*ref.calculate_qparams())
    session = coreai.get_qparams()
    assert session.precision == ("bfloat16" if dtype == torch.bfloat16 else "float16")
    assert f32_bits(coreai.calculate_qparams()[0]) == f32_bits(session.scale)


def test_torch_ao_arguments_are_accepted_or_refused_by_name(server) -> None:
    for args in (dict(dtype=torch.qint8, qscheme=torch.per_tensor_affine, reduce_range=False,
                      quant_min=None, quant_max=None, factory_kwargs=None, eps=1e-6),
                 dict(ch_axis=1, dtype=torch.qint8, qscheme=torch.per_channel_affine),
                 dict(averaging_constant=0.5, calculator="moving_average")):
        obs = RemoteObserver.with_args(server=server.target, **args)()
        assert isinstance(obs, RemoteObserver)
    positional = RemoteObserver(torch.qint8, torch.per_tensor_symmetric, False, -100, 100)
    assert (positional.dtype, positional.quant_min, positional.quant_max) == (torch.qint8, -100,
                                                                               100)
    with pytest.raises(TypeError, match="bins"):
        RemoteObserver(bins=2048)
    with pytest.raises(ValueError, match="is_dynamic"):
        RemoteObserver(is_dynamic=True)
    with pytest.raises(AssertionError, match="include 0"):
        RemoteObserver(quant_min=1, quant_max=100)
    with pytest.raises(NotImplementedError, match="reduce range"):
        RemoteObserver(qscheme=torch.per_tensor_symmetric, reduce_range=True)
    with pytest.raises(ValueError, match="per_channel_affine_float_qparams"):
        RemoteObserver(qscheme=torch.per_channel_affine_float_qparams)
    with pytest.raises(ValueError, match="rule='coreai_opt'"):
        RemoteObserver(calculator="static")
    with pytest.raises(ValueError, match="rule"):
        RemoteObserver(rule="tf")


def test_state_dict_round_trip_and_offline_convert(server, name) -> None:
    model, x, _ = trained_digits_cnn()
    prepared = copy.deepcopy(model)
    prepared.qconfig = remote(name, server)
    prepared = prepare(prepared)
    name_observers(prepared, name)
    with torch.no_grad():
        prepared(x[:200])
    state = prepared.state_dict()
    assert {"quant.activation_post_process.min_val", "fc1.activation_post_process.max_val"} \
        <= set(state)
    online = convert(copy.deepcopy(prepared))

    # A new process's model, prepared against a server that is not there.
    offline = copy.deepcopy(model)
    offline.qconfig = QConfig(
        activation=RemoteObserver.with_args(run=name, server="127.0.0.1:1"),
        weight=PerChannelMinMaxObserver.with_args(dtype=torch.qint8,
                                                  qscheme=torch.per_channel_symmetric))
    offline = prepare(offline)
    offline.load_state_dict(state)
    assert torch.equal(offline.fc1.activation_post_process.min_val,
                       prepared.fc1.activation_post_process.min_val)
    converted = convert(offline)
    with torch.no_grad():
        assert torch.equal(converted(x[300:400]), online(x[300:400]))


def test_with_args_deepcopy_and_pickle(server, name) -> None:
    factory = RemoteObserver.with_args(server=server.target, name=name, dtype=torch.qint8)
    obs = factory()
    obs(torch.randn(3, 3))
    for copied in (copy.deepcopy(obs), pickle.loads(pickle.dumps(obs))):
        assert copied.session_name == name
        copied(torch.randn(3, 3))
        copied.flush()
    assert obs.client.get_session(name).observation_count == 3


# ---------------------------------------------------------------- runs

def test_an_earlier_runs_sessions_are_not_silently_reused(server, client, name) -> None:
    client.create_session(name + "/fc.output", target="activation", dtype="uint8",
                          qscheme="asymmetric", calculator="global_minmax")
    client.observe(name + "/fc.output", np.array([5.0, 6.0], np.float32))
    # This process started before the session was made: an observer of it is the
    # same run. A process started after it (another run; `_started` stands in for its
    # start) is told:
    obs = RemoteObserver(server=server.target, name=name + "/fc.output")
    obs._started = 1e12
    with pytest.raises(qparams.AlreadyExists, match="if_exists"):
        obs(torch.ones(2))
    resumed = RemoteObserver(server=server.target, name=name + "/fc.output", if_exists="resume")
    resumed._started = 1e12
    resumed(torch.ones(2))
    resumed.flush()
    assert client.get_session(name + "/fc.output").observation_count == 2
    qtorch.close_clients()  # as in a new process: nothing opened yet
    replaced = RemoteObserver(server=server.target, name=name + "/fc.output",
                              if_exists="replace")
    replaced._started = 1e12
    replaced(torch.ones(2))
    replaced.flush()
    assert client.get_session(name + "/fc.output").observation_count == 1
    assert qtorch.delete_run(name, server=server.target) == 1
    assert list(client.list_sessions(name + "/")) == []


# ---------------------------------------------------------------- the client's conventions

def test_exceptions_are_declared_classes_with_session_and_owner() -> None:
    assert qparams.NotFound.__module__ == "qparams._errors"
    assert issubclass(qparams.NotFound, qparams.QParamsError)
    error = qparams.FailedPrecondition("moved", session="a/b", owner="r1")
    assert (error.code, error.message, error.session, error.owner) == (
        qparams.FailedPrecondition.code, "moved", "a/b", "r1")


def test_every_call_takes_timeout_and_metadata() -> None:
    """Each method sends its own deadline and metadata (after the client's)."""
    import concurrent.futures

    import grpc
    seen: dict[str, tuple[float, str | None, str | None]] = {}

    def record(method: str, context: grpc.ServicerContext) -> None:
        headers = dict(context.invocation_metadata())
        seen[method] = (context.time_remaining(), headers.get("x-trace"),
                        headers.get("x-client"))
        context.abort(grpc.StatusCode.UNAVAILABLE, "recorded")

    def unary(method: str):
        return grpc.unary_unary_rpc_method_handler(lambda r, c: record(method, c))

    def streaming(method: str, kind):
        def handler(request, context):
            record(method, context)
            yield b""
        return kind(handler)

    handlers = {m: unary(m) for m in (
        "ListCalculators", "Compute", "CreateSession", "GetSession", "ListSessions",
        "DeleteSession", "Observe", "ObserveBatch", "GetQParams", "SetExportMode",
        "SetGranularity", "GetTopology")}
    def topology(request: bytes, context: grpc.ServicerContext) -> bytes:
        if "x-trace" in dict(context.invocation_metadata()):
            record("GetTopology", context)
        return qparams.pb.Topology(slot_count=256).SerializeToString()  # the client's look-up

    handlers["GetTopology"] = grpc.unary_unary_rpc_method_handler(topology)
    handlers["ReadSessions"] = streaming("ReadSessions", grpc.unary_stream_rpc_method_handler)
    handlers["ExportSessions"] = streaming("ExportSessions", grpc.unary_stream_rpc_method_handler)
    handlers["ObserveStream"] = streaming("ObserveStream", grpc.stream_stream_rpc_method_handler)
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([
        grpc.method_handlers_generic_handler("qparams.v1.QParamsService", handlers),
        grpc.method_handlers_generic_handler("grpc.health.v1.Health",
                                             {"Check": unary("Check")})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    x = np.ones(3, np.float32)
    try:
        # No retries: every call is answered Unavailable, which the client would
        # otherwise send again for retry_total (30 s) before raising.
        with qparams.Client(f"127.0.0.1:{port}", metadata=[("x-client", "c")],
                            retry_total=0) as c:
            calls = {
                "ListCalculators": lambda **k: c.list_calculators(**k),
                "Compute": lambda **k: c.compute(x, reduce="never", **k),
                "CreateSession": lambda **k: c.create_session("s", target="weight", **k),
                "GetSession": lambda **k: c.get_session("s", **k),
                "ListSessions": lambda **k: list(c.list_sessions(**k)),
                "DeleteSession": lambda **k: c.delete_session("s", **k),
                "Observe": lambda **k: c.observe("s", x, reduce="never", **k),
                "ObserveBatch": lambda **k: c.observe_batch([("s", x)], reduce="never", **k),
                "ObserveStream": lambda **k: list(c.observe_many([("s", x)], reduce="never",
                                                                 **k)),
                "GetQParams": lambda **k: c.get_qparams("s", **k),
                "SetExportMode": lambda **k: c.set_export_mode("s", **k),
                "SetGranularity": lambda **k: c.set_granularity("s", "per_tensor", **k),
                "GetTopology": lambda **k: c.topology(**k),
                "ReadSessions": lambda **k: list(c.read_sessions(**k)),
                "ExportSessions": lambda **k: c.export("", "aimet", **k),
                "Check": lambda **k: c.health(**k),
            }
            for method, call in calls.items():
                with pytest.raises(qparams.Unavailable):
                    call(timeout=77, metadata=[("x-trace", method)])
            with pytest.raises(ValueError, match="lowercase"):
                c.get_session("s", metadata=[("X-Trace", "upper")])
    finally:
        server.stop(grace=None)
    assert set(seen) == set(calls)
    for method, (remaining, trace, client_wide) in seen.items():
        assert 70 < remaining < 78 and trace == method and client_wide == "c", method


def test_oversize_tensors_are_refused_before_serialising(server, name) -> None:
    with qparams.Client(server.target, max_message_bytes=1 << 20) as small:
        small.create_session(name, target="activation", dtype="uint8", qscheme="asymmetric")
        x = np.ones(1 << 19, np.float32)  # 2 MiB
        with pytest.raises(ValueError, match='reduce="auto"'):
            small.observe(name, x, reduce="never")
        small.observe(name, x)  # reduced: 8 bytes on the wire
        with pytest.raises(ValueError, match='reduce="auto"'):
            small.compute(x, reduce="never", dtype="int8")
        whole = small.compute(x[:1000], reduce="never", dtype="int8", granularity="per_tensor")
        reduced = small.compute(x, dtype="int8", granularity="per_tensor")
        assert f32_bits(whole.scale) == f32_bits(reduced.scale)
