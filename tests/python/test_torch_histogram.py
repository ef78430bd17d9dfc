"""RemoteObserver with the histogram calculators (percentile, entropy, mse) in torch.ao's
eager prepare/convert and FX prepare_fx/convert_fx: the converted model's activation
qparams are torch.ao's arithmetic over the session's clipping range, the same as the
session's own for int8; state_dict carries the range for an offline convert; the
arguments torch.ao and the service refuse."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from torch.ao.quantization import QConfig, QConfigMapping, convert, prepare
from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx

import qparams.torch as qtorch
from qparams.torch import RemoteObserver, name_observers
from test_torch_paths import CNN, trained_digits_cnn


@pytest.fixture(scope="module", autouse=True)
def _close_shared_clients():
    yield
    qtorch.close_clients()


def qconfig(run: str, server, calculator: str, **kwargs: object) -> QConfig:
    return QConfig(
        activation=RemoteObserver.with_args(run=run, server=server.target, calculator=calculator,
                                            **kwargs),
        weight=RemoteObserver.with_args(run=run, server=server.target, dtype=torch.qint8,
                                        qscheme=torch.per_channel_symmetric))


def activation_observers(model: nn.Module) -> list[RemoteObserver]:
    return [m for m in model.modules()
            if isinstance(m, RemoteObserver) and m.calculator != "global_minmax"]


@pytest.mark.parametrize("calculator", ["percentile", "entropy", "mse"])
def test_eager_prepare_convert(server, client, name, calculator) -> None:
    model, x, y = trained_digits_cnn()
    prepared = copy.deepcopy(model)
    prepared.qconfig = qconfig(name, server, calculator, histogram={"num_bins": 1024})
    prepared = prepare(prepared)
    name_observers(prepared, name)
    with torch.no_grad():
        for i in range(1500, 1797, 60):
            prepared(x[i:i + 60])
    observers = activation_observers(prepared)
    assert observers
    for o in observers:
        ours = o.calculate_qparams()
        session = client.get_qparams(o.session_name)
        # int8 over [lo, amax]: torch.ao's arithmetic and the session's agree.
        assert torch.equal(ours[0], torch.from_numpy(session.scale.reshape(1)))
        assert ours[1].tolist() == session.zero_point.reshape(1).tolist()
        assert session.calibration is not None
        assert float(o.max_val) == session.calibration.amax
    quantized = convert(prepared)
    accuracy = (quantized(x[:1500]).argmax(1) == y[:1500]).float().mean().item()
    assert accuracy > 0.8
    qtorch.delete_run(name, server=server.target)


def test_fx_prepare_convert_and_offline_state_dict(server, client, name) -> None:
    model = CNN().eval()
    example = (torch.randn(4, 1, 8, 8),)
    prepared = prepare_fx(copy.deepcopy(model),
                          QConfigMapping().set_global(qconfig(name, server, "entropy")), example)
    name_observers(prepared, name)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(6):
            prepared(torch.randn(4, 1, 8, 8, generator=g))
    state = copy.deepcopy(prepared.state_dict())  # reads each clipping range
    converted = convert_fx(copy.deepcopy(prepared))
    out = converted(example[0])

    # An offline copy converts from the buffers alone: the same model.
    offline = prepare_fx(copy.deepcopy(model), QConfigMapping().set_global(
        qconfig(name + "-offline", server, "entropy")), example)
    offline.load_state_dict(state)
    assert torch.equal(convert_fx(offline)(example[0]), out)
    for run in (name, name + "-offline"):  # convert_fx observes the weights
        qtorch.delete_run(run, server=server.target)


def test_an_asymmetric_range_starts_at_zero_until_a_negative_value(server, name) -> None:
    o = RemoteObserver(calculator="percentile", histogram={"percentile": 100.0},
                       server=server.target, name=name)
    o(torch.tensor([0.5, 2.0, 7.3]))
    scale, zero_point = o.calculate_qparams()
    assert (float(o.min_val), float(o.max_val)) == (0.0, float(torch.tensor(7.3)))
    assert zero_point.item() == 0
    o(torch.tensor([-1.0]))
    o.calculate_qparams()
    assert float(o.min_val) == -float(o.max_val)
    o.client.delete_session(name)


def test_refusals(server) -> None:
    with pytest.raises(ValueError, match="per-tensor only"):
        RemoteObserver(calculator="entropy", qscheme=torch.per_channel_affine,
                       server=server.target)
    with pytest.raises(ValueError, match="histogram= belongs"):
        RemoteObserver(calculator="global_minmax", histogram={"num_bins": 1024},
                       server=server.target)
    with pytest.raises(ValueError, match="unknown key"):
        RemoteObserver(calculator="mse", histogram={"bins": 1024}, server=server.target)
