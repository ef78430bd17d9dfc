"""qparams.torch.RemoteFakeQuantize and QATRun against the real server: torch.ao's
FakeQuantize contract (with_args, ranges, enable/disable, buffers, calculate_qparams,
state_dict, extra_repr), prepare_qat + convert and prepare_qat_fx + convert_fx with
exports by layer name; lag 0 at W = 1 equal to ordinary moving_average sessions and
torch's fake-quantize functions, step by step; a restart from a checkpoint equal to
the uninterrupted run; a rank that stops contributing; and QAT of a small CNN on
sklearn's digits on two gloo ranks (qat_digits.py): identical qparams on every rank at
every step, the W = 1 run's bits with lr = 0, and int8 accuracy within half a point
of torch.ao's own QAT."""

from __future__ import annotations

import copy
import json
import pickle
import threading
from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.ao.quantization import (QConfig, QConfigMapping, convert, disable_fake_quant,
                                   disable_observer, enable_fake_quant, enable_observer,
                                   prepare_qat)
from torch.ao.quantization.fake_quantize import FakeQuantize
from torch.ao.quantization.observer import (HistogramObserver, MinMaxObserver,
                                            MovingAverageMinMaxObserver)
from torch.ao.quantization.quantize_fx import convert_fx, prepare_qat_fx

import qparams
import qat_digits
from helpers import Net, f32_bits
from qparams.torch import QATRun, RemoteFakeQuantize
from qparams.torch import _registry

# Modules pass their inputs through, with a warning, until their session holds a range.
pytestmark = pytest.mark.filterwarnings("ignore:RemoteFakeQuantize .* passing inputs")


def qconfig(weight_qscheme: torch.qscheme = torch.per_channel_symmetric, **kwargs: Any) -> QConfig:
    return QConfig(activation=RemoteFakeQuantize.with_args(dtype=torch.quint8, **kwargs),
                   weight=RemoteFakeQuantize.with_args(dtype=torch.qint8, qscheme=weight_qscheme,
                                                       **kwargs))


def prepared_net(weight_qscheme: torch.qscheme = torch.per_channel_symmetric,
                 **kwargs: Any) -> nn.Module:
    torch.manual_seed(0)
    model = Net().train()
    model.qconfig = qconfig(weight_qscheme, **kwargs)
    return prepare_qat(model)


def batch(s: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(500 + s)) * (1 + s % 3)


def state(model: nn.Module, prefix: str) -> dict[str, tuple]:
    """Every RemoteFakeQuantize's buffers, exactly, by session name below `prefix`."""
    return {m.session_name[len(prefix):]: (m.scale.view(torch.int32).tolist(),
                                           m.zero_point.tolist())
            for m in model.modules() if isinstance(m, RemoteFakeQuantize)}


def train(model: nn.Module, run: QATRun, steps: range, optimizer: torch.optim.Optimizer,
          prefix: str, finish: bool = True) -> list[dict]:
    """Steps `steps` of a regression toward zero; the buffers after each hook."""
    states = []
    for s in steps:
        run.step(s)
        states.append(state(model, prefix))
        model(batch(s)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    if finish:
        run.finish()
        states.append(state(model, prefix))
    return states


# ---------------------------------------------------------------- the FakeQuantize contract

def test_with_args_ranges_and_observers_as_fake_quantize() -> None:
    fq = RemoteFakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0,
                                      quant_max=255, dtype=torch.quint8,
                                      qscheme=torch.per_tensor_affine, reduce_range=True)()
    theirs = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0,
                                    quant_max=255, dtype=torch.quint8,
                                    qscheme=torch.per_tensor_affine, reduce_range=True)()
    assert (fq.quant_min, fq.quant_max, fq.dtype, fq.qscheme, fq.is_per_channel) == \
        (theirs.quant_min, theirs.quant_max, theirs.dtype, theirs.qscheme, False)
    assert fq.calculator == "moving_average" and fq.averaging_constant == 0.01
    assert RemoteFakeQuantize(MinMaxObserver).calculator == "global_minmax"
    per_channel = RemoteFakeQuantize(dtype=torch.qint8, qscheme=torch.per_channel_affine,
                                     ch_axis=1)
    assert (per_channel.ch_axis, per_channel.quant_min, per_channel.quant_max) == (1, -128, 127)
    assert per_channel.activation_post_process.quant_min == -128  # what prepare_fx reads
    with pytest.raises(ValueError, match="HistogramObserver"):
        RemoteFakeQuantize(HistogramObserver)
    with pytest.raises(ValueError, match="calculator"):
        RemoteFakeQuantize(calculator="percentile")
    with pytest.raises(AssertionError, match="quant_min"):
        RemoteFakeQuantize(quant_min=5, quant_max=2)
    with pytest.raises(AssertionError, match="include 0"):
        RemoteFakeQuantize(quant_min=2, quant_max=5)
    with pytest.raises(ValueError, match="dtype"):
        RemoteFakeQuantize(dtype=torch.qint32)


def test_buffers_forward_calculate_qparams_and_state_dict() -> None:
    fq = RemoteFakeQuantize(dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=1)
    x = torch.randn(4, 3, 5)
    with pytest.warns(UserWarning, match="passing inputs through"):
        assert torch.equal(fq(x), x)  # uninitialized: as it is
    with pytest.warns(UserWarning, match="default scale"):
        assert [t.tolist() for t in fq.calculate_qparams()] == [[1.0], [0]]
    empty = fq.state_dict()
    assert set(empty) == {"fake_quant_enabled", "observer_enabled", "scale", "zero_point"}

    fq.set_qparams(torch.tensor([0.01, 0.02, 0.03]), torch.tensor([0, 0, 0]))
    scale, zero_point = fq.calculate_qparams()
    assert zero_point.dtype == torch.int64 and f32_bits(scale) == f32_bits([0.01, 0.02, 0.03])
    assert torch.equal(fq(x), torch.fake_quantize_per_channel_affine(
        x, fq.scale, fq.zero_point, 1, -128, 127))
    # Two forwards in one step: the union of their ranges, per channel.
    y = torch.randn(2, 3, 5) * 4
    lo = torch.minimum(x.amin(dim=(0, 2)), y.amin(dim=(0, 2)))
    assert torch.equal(fq._pending[1].reshape(-1), x.amin(dim=(0, 2)))
    fq(y)
    assert torch.equal(fq._pending[1].reshape(-1), lo)
    assert fq._pending[3] == [1, 3, 1]

    disable_observer(fq)
    disable_fake_quant(fq)
    assert fq.observer_enabled.tolist() == [0] and fq.fake_quant_enabled.tolist() == [0]
    fq._pending = None
    assert torch.equal(fq(x), x) and fq._pending is None
    enable_observer(fq)
    enable_fake_quant(fq)
    assert "quant_min=-128, quant_max=127" in repr(fq) and "ch_axis=1" in repr(fq)

    loaded = RemoteFakeQuantize(dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=1)
    loaded.load_state_dict(pickle.loads(pickle.dumps(fq.state_dict())))
    assert torch.equal(loaded.scale, fq.scale) and torch.equal(loaded.zero_point, fq.zero_point)
    assert torch.equal(loaded(x), fq(x))
    blank = RemoteFakeQuantize(dtype=torch.qint8, qscheme=torch.per_channel_symmetric)
    blank.load_state_dict(empty)
    assert not blank.initialized
    copied = copy.deepcopy(fq)
    assert copied._run is None and torch.equal(copied.scale, fq.scale)


def test_signed_zeros_of_a_union_do_not_depend_on_the_order() -> None:
    fq = RemoteFakeQuantize()
    for first, second in ((-0.0, 0.0), (0.0, -0.0)):
        fq._pending = None
        fq(torch.tensor([first]))
        fq(torch.tensor([second]))
        _, lo, hi, _ = fq._pending
        assert (f32_bits(lo), f32_bits(hi)) == (f32_bits(-0.0), f32_bits(0.0))


# ---------------------------------------------------------------- prepare, convert, export

def test_prepare_qat_convert_and_export_by_layer_name(client, name) -> None:
    prefix = name + "/"
    model = prepared_net()
    run = QATRun(client, model, prefix)
    assert sorted(run.activations) == [prefix + n for n in ("fc1.output", "fc2.output",
                                                            "quant.output")]
    assert sorted(run.weights) == [prefix + "fc1.weight", prefix + "fc2.weight"]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train(model, run, range(6), optimizer, prefix)
    quantized = convert(copy.deepcopy(model).eval())
    aimet = json.loads(client.export(prefix, "aimet"))
    params = {e["name"]: e for e in aimet["param_encodings"]}
    activations = {e["name"]: e for e in aimet["activation_encodings"]}
    assert sorted(params) == ["fc1.weight", "fc2.weight"]
    assert sorted(activations) == ["fc1.output", "fc2.output", "quant.output"]
    for layer in ("fc1", "fc2"):
        weight = getattr(quantized, layer).weight()
        assert f32_bits(params[f"{layer}.weight"]["scale"]) == \
            f32_bits(weight.q_per_channel_scales())
        fq = getattr(model, layer).activation_post_process
        assert getattr(quantized, layer).scale == float(fq.scale)
        assert f32_bits(activations[f"{layer}.output"]["scale"]) == f32_bits(fq.scale)
    assert float(quantized.quant.scale) == float(model.quant.activation_post_process.scale)
    # The same model again (another process of the run): its sessions are shared.
    QATRun(client, prepared_net(), prefix)
    with pytest.raises(qparams.AlreadyExists, match="averaging_constant"):
        QATRun(client, prepared_net(averaging_constant=0.5), prefix)


def test_prepare_qat_fx_convert_fx_and_conv_bn_weights(client, name) -> None:
    class ConvBnNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 3)
            self.bn = nn.BatchNorm2d(4)
            self.relu = nn.ReLU()
            self.fc = nn.Linear(4 * 6 * 6, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.relu(self.bn(self.conv(x))).flatten(1))

    torch.manual_seed(0)
    example = torch.randn(2, 1, 8, 8)
    mapping = QConfigMapping().set_global(qconfig(torch.per_tensor_symmetric))
    model = prepare_qat_fx(ConvBnNet().train(), mapping, (example,))
    prefix = name + "/"
    run = QATRun(client, model, prefix)
    # ConvBnReLU's weight fake-quant sees the batch-norm-scaled weight: lag L, observed
    # in forward, as activations are.
    assert prefix + "conv.weight" in run.activations and prefix + "fc.weight" in run.weights
    assert prefix + "fc.input" in run.activations
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for s in range(4):
        run.step(s)
        model(torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(s))).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    run.finish()
    torch.backends.quantized.engine = "qnnpack"
    quantized = convert_fx(copy.deepcopy(model).eval())
    with torch.no_grad():
        assert quantized(example).shape == (2, 3)
    sessions = {s.name[len(prefix):] for s in client.list_sessions(prefix)}
    assert {"conv.weight", "fc.weight", "fc.input"} <= sessions, sessions
    assert client.get_session(prefix + "conv.weight").steps.last_applied_step == 3


def test_stale_sessions_of_an_earlier_run_are_refused(client, name, monkeypatch) -> None:
    prefix = name + "/"
    model = prepared_net()
    train(model, QATRun(client, model, prefix), range(2), torch.optim.SGD(
        model.parameters(), lr=0.0), prefix)
    monkeypatch.setattr(_registry, "STARTED", _registry.STARTED + 1e9)  # "a later process"
    again = QATRun(client, prepared_net(), prefix)
    with pytest.raises(qparams.FailedPrecondition, match="resume"):
        again.step(0)


# ---------------------------------------------------------------- lag 0 at W = 1

def test_lag_0_equals_ordinary_sessions_and_torch_fake_quantize(client, name) -> None:
    prefix = name + "/"
    model = prepared_net()
    run = QATRun(client, model, prefix, lag=0)
    seen: list[tuple[str, torch.Tensor, torch.Tensor, RemoteFakeQuantize]] = []

    def record(module: RemoteFakeQuantize, inputs: tuple, output: torch.Tensor) -> None:
        seen.append((module.session_name, inputs[0].detach().clone(), output.detach().clone(),
                     module))

    for m in model.modules():
        if isinstance(m, RemoteFakeQuantize):
            m.register_forward_hook(record)
            reference = f"{name}-ref/{m.session_name[len(prefix):]}"
            target = "weight" if m.session_name in run.weights else "activation"
            client.create_session(reference, m.quant_spec(target), calculator="moving_average",
                                  averaging_constant=m.averaging_constant)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    checked = 0
    for s in range(5):
        run.step(s)
        seen.clear()
        model(batch(s)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        for session, x, out, module in seen:
            reference = f"{name}-ref/{session[len(prefix):]}"
            q = client.observe(reference, x if module.is_per_channel else x.reshape(-1)).qparams
            scale = torch.from_numpy(q.scale.reshape(-1).copy())
            zero_point = torch.from_numpy(q.zero_point.reshape(-1).copy())
            assert f32_bits(module.scale) == f32_bits(scale), (s, session)
            assert module.zero_point.tolist() == zero_point.tolist(), (s, session)
            if module.is_per_channel:
                want = torch.fake_quantize_per_channel_affine(
                    x, scale, zero_point, module.ch_axis, module.quant_min, module.quant_max)
            else:
                want = torch.fake_quantize_per_tensor_affine(
                    x, scale, zero_point, module.quant_min, module.quant_max)
            assert torch.equal(out, want), (s, session)
            checked += 1
    assert checked == 5 * 5  # 3 activations and 2 weights per step
    run.finish()


# ---------------------------------------------------------------- restarts and faults

@pytest.mark.parametrize("lag", [1, 2])
def test_restart_from_a_checkpoint_continues_bit_identically(client, name, lag) -> None:
    steps, checkpoint_at, killed_after = 9, 4, 6
    # The uninterrupted run.
    model = prepared_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    whole = train(model, QATRun(client, model, f"{name}/a/", lag=lag), range(steps),
                  optimizer, f"{name}/a/")
    final = copy.deepcopy(model.state_dict())

    # A job that saves its checkpoint at the end of step 3 and dies after step 6.
    prefix = f"{name}/b/"
    model = prepared_net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run = QATRun(client, model, prefix, lag=lag)
    train(model, run, range(checkpoint_at), optimizer, prefix, finish=False)
    saved = pickle.dumps({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "qat": run.state_dict()})
    train(model, run, range(checkpoint_at, killed_after + 1), optimizer, prefix, finish=False)

    # Restarted from the checkpoint, in a fresh model, run and optimizer.
    checkpoint = pickle.loads(saved)
    assert checkpoint["qat"]["next_step"] == checkpoint_at
    model = prepared_net()
    model.load_state_dict(checkpoint["model"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    optimizer.load_state_dict(checkpoint["optimizer"])
    run = QATRun(client, model, prefix, lag=lag)
    run.resume(checkpoint["qat"])
    with pytest.raises(ValueError, match="resumed at step"):
        run.step(0)
    resumed = train(model, run, range(checkpoint_at, steps), optimizer, prefix)
    assert resumed == whole[checkpoint_at:]
    for key, value in model.state_dict().items():
        assert torch.equal(value, final[key]), key


def test_a_rank_that_stops_contributing_is_closed_by_the_step_timeout(server, name) -> None:
    prefix = name + "/"
    errors: list[BaseException] = []

    def rank_main(rank: int, steps: int) -> None:
        try:
            with qparams.Client(server.target) as client:
                model = prepared_net()
                run = QATRun(client, model, prefix, world_size=2, rank=rank, step_timeout=0.2)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
                train(model, run, range(steps), optimizer, prefix, finish=rank == 0)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=rank_main, args=(0, 6)),
               threading.Thread(target=rank_main, args=(1, 3))]  # rank 1 stops after step 2
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()
    assert not errors, errors
    with qparams.Client(server.target) as client:
        weights = client.get_session(prefix + "fc1.weight").steps
        assert [(i.step, list(i.missing_ranks)) for i in weights.incomplete] == \
            [(s, [1]) for s in (3, 4, 5)]
        # Activations lag a step: rank 1 sent step 1's ranges at step 2, never step 2's.
        activations = client.get_session(prefix + "fc1.output").steps
        assert [(i.step, list(i.missing_ranks)) for i in activations.incomplete] == \
            [(s, [1]) for s in (2, 3, 4, 5)]
        assert activations.last_applied_step == weights.last_applied_step == 5


# ---------------------------------------------------------------- data parallel, digits

def strip(states: list[dict[str, list]], prefix: str) -> list[dict[str, list]]:
    return [{k[len(prefix):]: v for k, v in s.items()} for s in states]


def test_digits_qat_on_two_gloo_ranks(server, client, name, tmp_path) -> None:
    torch.set_num_threads(1)
    prefix, epochs, lr0_steps = name + "/", 20, 6
    torch.multiprocessing.spawn(
        qat_digits.rank_main, nprocs=2, join=True,
        args=(2, str(tmp_path / "store"), server.target, prefix, str(tmp_path), epochs,
              lr0_steps))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # Every rank's fake-quant qparams, identical at every step.
    assert ranks[0]["train"] == ranks[1]["train"]
    assert ranks[0]["final"] == ranks[1]["final"]
    assert len(ranks[0]["train"]) == epochs * (898 // qat_digits.BATCH)
    # lr = 0: every step's qparams are W = 1's on the same global batches (forwarded in
    # the ranks' halves, whose activations are then bit for bit the ranks').
    x, y, x_test, y_test = qat_digits.digits()
    model = qat_digits.prepared("remote")
    single = qat_digits.train(model, QATRun(client, model, prefix + "w1/"), x, y, epochs=1,
                              lr=0.0, split=2, limit=lr0_steps)
    assert strip(ranks[0]["lr0"], prefix + "lr0/") == strip(single, prefix + "w1/")
    assert strip(ranks[1]["lr0"], prefix + "lr0/") == strip(single, prefix + "w1/")
    # Trained, converted to int8: within half a point of torch.ao's single-process QAT.
    theirs = qat_digits.prepared("torch")
    qat_digits.train(theirs, None, x, y, epochs=epochs, lr=0.05)
    reference = qat_digits.accuracy(qat_digits.convert_int8(theirs), x_test, y_test)
    assert reference > 90
    assert abs(ranks[0]["accuracy"] - reference) <= 0.5, (ranks[0]["accuracy"], reference)
