"""Client.export / export_compressed_tensors against the real server, each format read
by an independent consumer: torch's quantize_per_tensor/per_channel, AIMET's published
(de)quantization convention, and ONNX's checker on QuantizeLinear graphs built from the
onnx export. The reference integers are the session's own:
q = clamp(round_half_even(x / scale) + zero_point, quant_min, quant_max), in float32."""

from __future__ import annotations

import json
import sys

import grpc
import numpy as np
import pytest
import torch

import qparams
from helpers import f32_bits
from qparams.v1 import qparams_pb2_grpc

# ---------------------------------------------------------------- the session's side


def weight(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Seeded float32 data, each row with its own offset (asymmetric ranges)."""
    g = np.random.default_rng(seed)
    x = g.standard_normal(shape).astype(np.float32) * 2
    return x + g.uniform(-1.5, 1.5, (shape[0],) + (1,) * (len(shape) - 1)).astype(np.float32)


def calibrate(client: qparams.Client, name: str, shape: tuple[int, ...], seed: int,
              **spec) -> np.ndarray:
    """Creates the session, observes two tensors, and returns one to quantize: the last
    one scaled by 1.5, so that some values are clamped."""
    client.create_session(name, calculator="global_minmax", **{"target": "weight", **spec})
    client.observe(name, weight(shape, seed))
    x = weight(shape, seed + 1000)
    client.observe(name, x)
    return x * np.float32(1.5)


def expand(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Block parameters (one per block, blocks per dim) repeated to the tensor's shape."""
    a = np.asarray(a)
    for axis, (n, size) in enumerate(zip(a.shape, shape)):
        if n not in (1, size):
            a = np.repeat(a, -(-size // n), axis=axis)
            a = a[(slice(None),) * axis + (slice(0, size),)]
    return np.broadcast_to(a, shape)


class Ours:
    """The session's qparams and quant range, and the integers they define on x."""

    def __init__(self, client: qparams.Client, name: str) -> None:
        session = client.get_session(name)
        q = client.get_qparams(name)
        assert q.initialized
        self.qmin, self.qmax = session.spec.quant_min, session.spec.quant_max
        self.shape = q.shape
        self.scale = q.scale
        self.zero_point = q.zero_point

    def quantize(self, x: np.ndarray) -> np.ndarray:
        s = expand(self.scale, x.shape).astype(np.float32)
        zp = expand(self.zero_point, x.shape).astype(np.float32)
        q = np.clip(np.rint(x / s) + zp, np.float32(self.qmin), np.float32(self.qmax))
        return q.astype(np.int64)

    def dequantize(self, x: np.ndarray) -> np.ndarray:
        s = expand(self.scale, x.shape).astype(np.float32)
        zp = expand(self.zero_point, x.shape).astype(np.int64)
        return (self.quantize(x) - zp).astype(np.float32) * s

    def away_from_ties(self, x: np.ndarray) -> np.ndarray:
        """x with the values whose x / scale lies within 1e-3 of a .5 tie set to 0:
        torch quantizes x * (1 / scale), which may round those to the other side."""
        r = x / expand(self.scale, x.shape).astype(np.float32)
        near = np.abs(np.abs(r - np.floor(r)) - 0.5) < 1e-3
        return np.where(near, np.float32(0), x).astype(np.float32)


def torch_ints(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int | None,
               dtype: torch.dtype) -> np.ndarray:
    """torch's quantization of x with these parameters, as integers."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    scale, zero_point = np.asarray(scale, np.float32), np.asarray(zero_point, np.int64)
    if axis is None:
        assert scale.size == 1 and zero_point.size == 1
        q = torch.quantize_per_tensor(t, float(scale.ravel()[0]), int(zero_point.ravel()[0]),
                                      dtype)
    else:
        q = torch.quantize_per_channel(t, torch.from_numpy(scale.ravel()).double(),
                                       torch.from_numpy(zero_point.ravel()), axis, dtype)
    return q.int_repr().numpy().astype(np.int64)


# ---------------------------------------------------------------- a. torch agrees

TORCH_SPECS = [(dtype, qscheme, granularity) for dtype in ("int8", "uint8")
               for qscheme in ("symmetric", "asymmetric")
               for granularity in ("per_tensor", "per_channel:0")]


def test_every_format_quantizes_as_the_session_with_torch(client, name) -> None:
    prefix = name + "/"
    xs, ours = {}, {}
    for i, (dtype, qscheme, gran) in enumerate(TORCH_SPECS):
        tensor = f"m{i}.weight"
        x = calibrate(client, prefix + tensor, (16, 64), seed=i, dtype=dtype, qscheme=qscheme,
                      granularity=gran)
        ours[tensor] = Ours(client, prefix + tensor)
        xs[tensor] = ours[tensor].away_from_ties(x)

    state, _ = client.export_compressed_tensors(prefix)
    onnx_doc = json.loads(client.export(prefix, "onnx"))
    aimet_doc = json.loads(client.export(prefix, "aimet"))
    onnx_entries = {e["name"]: e for e in onnx_doc["encodings"]}
    aimet_entries = {e["name"]: e for e in aimet_doc["param_encodings"]}
    assert aimet_doc["activation_encodings"] == []

    for i, (dtype, qscheme, gran) in enumerate(TORCH_SPECS):
        tensor, module = f"m{i}.weight", f"m{i}"
        mine, x = ours[tensor], xs[tensor]
        expected = mine.quantize(x)
        per_channel = gran != "per_tensor"
        axis = 0 if per_channel else None
        where = f"{tensor} ({dtype}, {qscheme}, {gran})"

        # compressed-tensors: a signed grid; uint8's zero point shifted by -128.
        scale = state[f"{module}.weight_scale"]
        assert scale.dtype == torch.float32, where
        assert list(scale.shape) == ([16, 1] if per_channel else [1]), where
        assert f32_bits(scale) == f32_bits(mine.scale), where
        zp = state.get(f"{module}.weight_zero_point")
        if zp is None:
            zp = torch.zeros(scale.shape, dtype=torch.int8)
        assert zp.dtype == torch.int8 and zp.shape == scale.shape, where
        shift = 128 if dtype == "uint8" else 0
        assert (zp.numpy().astype(np.int64).ravel() + shift).tolist() == \
            mine.zero_point.ravel().tolist(), where
        signed = torch_ints(x, scale.numpy(), zp.numpy(), axis, torch.qint8)
        assert np.array_equal(signed + shift, expected), where
        if dtype == "uint8":  # the same integers on the unsigned grid
            unsigned = torch_ints(x, scale.numpy(), zp.numpy().astype(np.int64) + 128, axis,
                                  torch.quint8)
            assert np.array_equal(unsigned, expected), where

        # onnx: QuantizeLinear's y_scale / y_zero_point / axis.
        e = onnx_entries[tensor]
        assert e["output_dtype"] == dtype, where
        y_scale = np.asarray(e["y_scale"], np.float64).astype(np.float32)
        assert y_scale.shape == ((16,) if per_channel else ()), where
        assert f32_bits(y_scale) == f32_bits(mine.scale), where
        assert np.asarray(e["y_zero_point"]).shape == y_scale.shape, where
        assert e.get("axis") == axis, where
        got = torch_ints(x, y_scale, np.asarray(e["y_zero_point"]), e.get("axis"),
                         torch.qint8 if dtype == "int8" else torch.quint8)
        assert np.array_equal(got, expected), where

        # aimet: the unsigned grid q_aimet = clamp(round(x / scale) - offset, 0, 255),
        # which is torch's quint8 with zero point -offset.
        e = aimet_entries[tensor]
        assert (e["dtype"], e["bw"]) == ("INT", 8), where
        assert e["enc_type"] == ("PER_CHANNEL" if per_channel else "PER_TENSOR"), where
        assert e["is_sym"] is (qscheme == "symmetric"), where
        a_scale = np.asarray(e["scale"], np.float64).astype(np.float32)
        assert f32_bits(a_scale) == f32_bits(mine.scale), where
        offset = np.asarray(e["offset"], np.int64)
        assert offset.shape == a_scale.shape == ((16,) if per_channel else (1,)), where
        assert offset.tolist() == (mine.qmin - mine.zero_point.ravel()).astype(np.int64).tolist()
        got = torch_ints(x, a_scale, -offset, axis, torch.quint8)
        assert np.array_equal(got + int(mine.qmin), expected), where


# ---------------------------------------------------------------- b. AIMET readback


def aimet_dequantize(x: np.ndarray, entry: dict) -> np.ndarray:
    """AIMET's published convention, in float32: q = clamp(round(x / scale) - offset,
    0, 2^bw - 1); x̂ = (q + offset) * scale. Channels on axis 0, blocks on axis 1."""
    scale = np.asarray(entry["scale"], np.float64).astype(np.float32).ravel()
    offset = np.asarray(entry["offset"], np.float64).ravel()
    assert offset.shape == scale.shape and np.all(offset == np.round(offset))
    if entry["enc_type"] == "PER_TENSOR":
        assert scale.size == 1
        shape = (1,) * x.ndim
    elif entry["enc_type"] == "PER_CHANNEL":
        shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    else:
        assert entry["enc_type"] == "PER_BLOCK" and x.ndim == 2
        assert x.shape[1] % entry["block_size"] == 0
        shape = (x.shape[0], x.shape[1] // entry["block_size"])
    s = expand(scale.reshape(shape), x.shape)
    o = expand(offset.astype(np.float32).reshape(shape), x.shape)
    q = np.clip(np.rint(x / s) - o, np.float32(0), np.float32(2 ** entry["bw"] - 1))
    return (q + o) * s


AIMET_CASES = {  # tensor name: (shape, spec)
    "conv.weight": ((16, 64), dict(dtype="int8", qscheme="symmetric",
                                   granularity="per_channel:0")),
    "fc.weight": ((16, 64), dict(dtype="uint8", qscheme="asymmetric")),
    "blocked.weight": ((8, 64), dict(dtype="int4", qscheme="symmetric",
                                     granularity="per_block:1:16")),
    "fc.input": ((4, 16, 64), dict(dtype="uint8", qscheme="asymmetric",
                                   target="activation")),
}


def test_aimet_dequantizes_as_the_session(client, name) -> None:
    prefix = name + "/"
    xs, ours = {}, {}
    for i, (tensor, (shape, spec)) in enumerate(AIMET_CASES.items()):
        xs[tensor] = calibrate(client, prefix + tensor, shape, seed=10 + i, **spec)
        ours[tensor] = Ours(client, prefix + tensor)
    document = json.loads(client.export(prefix, "aimet"))
    assert document["version"] == "1.0.0" and document["excluded_layers"] == []
    params = {e["name"]: e for e in document["param_encodings"]}
    activations = {e["name"]: e for e in document["activation_encodings"]}
    assert sorted(params) == ["blocked.weight", "conv.weight", "fc.weight"]
    assert list(params) == sorted(params)  # session-name order
    assert list(activations) == ["fc.input"]

    for tensor, x in xs.items():
        entry = (activations if tensor == "fc.input" else params)[tensor]
        expected = ours[tensor].dequantize(x)
        got = aimet_dequantize(x, entry)
        assert f32_bits(got) == f32_bits(expected), tensor

    blocked = params["blocked.weight"]
    assert (blocked["enc_type"], blocked["block_size"], blocked["bw"]) == ("PER_BLOCK", 16, 4)
    assert len(blocked["scale"]) == 8 * 4 and blocked["offset"] == [-8] * 32
    assert "block_size" not in params["conv.weight"]
    assert params["conv.weight"]["offset"] == [-128] * 16
    assert params["fc.weight"]["offset"] == [-int(ours["fc.weight"].zero_point.item())]


# ---------------------------------------------------------------- c. ONNX

try:
    import onnx
    from onnx import TensorProto, helper
    OPSET = onnx.defs.onnx_opset_version()
except ImportError:  # Debian's python3-onnx
    onnx = None
    OPSET = 0
needs_onnx = pytest.mark.skipif(onnx is None, reason="onnx is not installed (python3-onnx)")
BLOCKED_OPSET = 21  # QuantizeLinear-21: block_size, int4/uint4 outputs
_ONNX_TYPES = {"int8": "INT8", "uint8": "UINT8", "int4": "INT4", "uint4": "UINT4",
               "int2": "INT2", "uint2": "UINT2", "float8e4m3fn": "FLOAT8E4M3FN",
               "float8e5m2": "FLOAT8E5M2", "float4e2m1": "FLOAT4E2M1"}


def quantize_linear_model(entry: dict, x_shape: tuple[int, ...]) -> "onnx.ModelProto":
    """A graph of one QuantizeLinear node with the entry's inputs and attributes."""
    element = getattr(TensorProto, _ONNX_TYPES[entry["output_dtype"]])
    y_scale = np.asarray(entry["y_scale"], np.float64).astype(np.float32)
    initializers = [helper.make_tensor("y_scale", TensorProto.FLOAT, y_scale.shape,
                                       y_scale.ravel().tolist())]
    inputs = ["x", "y_scale"]
    if "y_zero_point" in entry:
        zp = np.asarray(entry["y_zero_point"], np.int64)
        assert zp.shape == y_scale.shape
        initializers.append(helper.make_tensor("y_zero_point", element, zp.shape,
                                               zp.ravel().tolist()))
        inputs.append("y_zero_point")
    attributes = {}
    if entry.get("axis") is not None:
        attributes["axis"] = entry["axis"]
    if entry.get("block_size") is not None:
        attributes["block_size"] = entry["block_size"]
    node = helper.make_node("QuantizeLinear", inputs, ["y"], **attributes)
    graph = helper.make_graph(
        [node], "quantize", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", element, x_shape)], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def onnx_sessions(client: qparams.Client, prefix: str, cases: dict) -> tuple[dict, dict]:
    """Calibrates the cases; returns their onnx entries and (x, Ours) by tensor name."""
    data = {}
    for i, (tensor, (shape, spec)) in enumerate(cases.items()):
        x = calibrate(client, prefix + tensor, shape, seed=20 + i, **spec)
        data[tensor] = (x, Ours(client, prefix + tensor))
    document = json.loads(client.export(prefix, "onnx"))
    assert document["version"] == "2.0.0"
    entries = {e["name"]: e for e in document["encodings"]}
    assert sorted(entries) == sorted(cases)
    return entries, data


ONNX_CASES = {
    "a.weight": ((16, 64), dict(dtype="int8", qscheme="symmetric")),
    "b.weight": ((16, 64), dict(dtype="uint8", qscheme="asymmetric",
                                granularity="per_channel:0")),
    "c.weight": ((16, 64), dict(dtype="int8", qscheme="asymmetric",
                                granularity="per_channel:1")),
    "d.input": ((4, 16, 64), dict(dtype="uint8", qscheme="asymmetric", target="activation")),
}
ONNX_BLOCKED_CASES = {
    "e.weight": ((8, 64), dict(dtype="int4", qscheme="symmetric", granularity="per_block:1:16")),
    "f.weight": ((8, 64), dict(dtype="uint8", qscheme="asymmetric",
                               granularity="per_block:1:32")),
    "g.weight": ((16, 64), dict(dtype="uint4", qscheme="asymmetric",
                                granularity="per_channel:0")),
}


def check_entries(entries: dict, data: dict) -> None:
    for tensor, (x, mine) in data.items():
        e = entries[tensor]
        y_scale = np.asarray(e["y_scale"], np.float64).astype(np.float32)
        assert f32_bits(y_scale) == f32_bits(mine.scale), tensor
        assert np.asarray(e["y_zero_point"]).ravel().tolist() == \
            mine.zero_point.ravel().tolist(), tensor
        onnx.checker.check_model(quantize_linear_model(e, x.shape), full_check=True)


@needs_onnx
def test_onnx_entries_make_valid_quantize_linear_graphs(client, name) -> None:
    entries, data = onnx_sessions(client, name + "/", ONNX_CASES)
    assert isinstance(entries["a.weight"]["y_scale"], float)
    assert entries["a.weight"].get("axis") is None
    assert len(entries["b.weight"]["y_scale"]) == 16 and entries["b.weight"]["axis"] == 0
    assert len(entries["c.weight"]["y_scale"]) == 64 and entries["c.weight"]["axis"] == 1
    assert all(entries[t].get("block_size") is None for t in ONNX_CASES)
    check_entries(entries, data)


@needs_onnx
def test_onnx_blocked_and_4_bit_entries(client, name) -> None:
    entries, data = onnx_sessions(client, name + "/", ONNX_BLOCKED_CASES)
    e, f = entries["e.weight"], entries["f.weight"]
    assert (e["output_dtype"], e["axis"], e["block_size"]) == ("int4", 1, 16)
    assert np.asarray(e["y_scale"]).shape == (8, 4)
    assert (f["output_dtype"], f["axis"], f["block_size"]) == ("uint8", 1, 32)
    assert np.asarray(f["y_scale"]).shape == (8, 2)
    assert entries["g.weight"]["output_dtype"] == "uint4"
    if OPSET < BLOCKED_OPSET or not hasattr(TensorProto, "INT4"):
        pytest.skip(f"the installed onnx {onnx.__version__} (opset {OPSET}) has no blocked "
                    f"or 4-bit QuantizeLinear (opset {BLOCKED_OPSET})")
    check_entries(entries, data)


@needs_onnx
def test_onnx_reference_evaluator_quantizes_as_the_session(client, name) -> None:
    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError:
        pytest.skip(f"the installed onnx {onnx.__version__} has no onnx.reference (>= 1.13)")
    entries, data = onnx_sessions(client, name + "/", ONNX_CASES)
    for tensor, (x, mine) in data.items():
        model = quantize_linear_model(entries[tensor], x.shape)
        (y,) = ReferenceEvaluator(model).run(None, {"x": x})
        assert np.array_equal(y.astype(np.int64), mine.quantize(x)), tensor


# ---------------------------------------------------------------- d. refusals

FORMATS = ("aimet", "onnx", "compressed-tensors")


def test_uninitialized_sessions_fail_or_are_left_out(client, name) -> None:
    prefix = name + "/"
    calibrate(client, prefix + "fc1.weight", (4, 8), seed=1)
    client.create_session(prefix + "fc2.weight", calculator="global_minmax", target="weight")
    for fmt in FORMATS:
        with pytest.raises(qparams.FailedPrecondition) as e:
            client.export(prefix, fmt)
        assert "fc2.weight" in e.value.message and "fc1.weight" not in e.value.message
        text = client.export(prefix, fmt, allow_uninitialized=True)
        assert "fc1" in text and "fc2" not in text, fmt
    state, config = client.export_compressed_tensors(prefix, allow_uninitialized=True)
    assert "fc1.weight_scale" in state and {key.split(".")[0] for key in state} == {"fc1"}
    with pytest.raises(qparams.FailedPrecondition, match="fc2.weight"):
        client.export_compressed_tensors(prefix)


@pytest.mark.parametrize("spec, refused_by", [
    (dict(dtype="float8_e4m3fn"), ("aimet",)),
    (dict(dtype="int8", qscheme="symmetric_with_clipping"), FORMATS),
    (dict(dtype="int8", granularity="per_channel:1"), ("aimet", "compressed-tensors")),
    (dict(dtype="float8_e5m2"), ("aimet", "compressed-tensors")),
    (dict(dtype="uint8", qscheme="asymmetric", granularity="per_channel:1",
          target="activation"), ("aimet", "compressed-tensors")),
], ids=["float8_e4m3fn", "clipping", "axis1", "float8_e5m2", "activation-per-channel"])
def test_sessions_a_format_cannot_express_are_invalid_argument(client, name, spec,
                                                               refused_by) -> None:
    prefix = name + "/"
    calibrate(client, prefix + "a.weight", (4, 8), seed=1)
    calibrate(client, prefix + "odd.weight", (4, 8), seed=2, **spec)
    for fmt in FORMATS:
        if fmt in refused_by:
            with pytest.raises(qparams.InvalidArgument) as e:
                client.export(prefix, fmt)
            assert "odd.weight" in e.value.message, (fmt, e.value.message)
        else:
            assert "odd.weight" in client.export(prefix, fmt), fmt


def test_onnx_floating_point_entries_have_no_zero_point(client, name) -> None:
    calibrate(client, name + "/fp8.weight", (4, 8), seed=3, dtype="float8_e4m3fn",
              granularity="per_channel:0")
    (entry,) = json.loads(client.export(name + "/", "onnx"))["encodings"]
    assert entry["output_dtype"] == "float8e4m3fn" and "y_zero_point" not in entry
    assert f32_bits(np.asarray(entry["y_scale"], np.float64)) == \
        f32_bits(client.get_qparams(name + "/fp8.weight").scale)


def test_bad_formats_prefixes_and_arguments(client, name) -> None:
    calibrate(client, name + "/a.weight", (4, 8), seed=1)
    for fmt in ("tflite", "", "AIMET"):
        with pytest.raises(qparams.InvalidArgument):
            client.export(name + "/", fmt)
    with pytest.raises(qparams.NotFound):
        client.export(name + "/nothing-here/", "aimet")
    with pytest.raises(qparams.NotFound):
        client.export_compressed_tensors(name + "/nothing-here/")
    with pytest.raises(qparams.InvalidArgument):
        client.export("bad prefix!", "aimet")
    with pytest.raises(TypeError, match="format"):
        client.export(name + "/", None)
    with pytest.raises(TypeError, match="prefix"):
        client.export(b"t/", "aimet")


def test_export_compressed_tensors_needs_torch(client, name, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(ImportError, match="torch"):
        client.export_compressed_tensors(name + "/")


# ---------------------------------------------------------------- e. compressed-tensors


def test_compressed_tensors_names_shapes_and_config(client, name) -> None:
    run = name + "/run"
    sessions = {
        "fc1.weight": ((16, 64), dict(dtype="int8", qscheme="symmetric",
                                      granularity="per_channel:0")),
        "fc2.weight": ((8, 16), dict(dtype="int8", qscheme="symmetric")),
        "fc3.weight": ((8, 64), dict(dtype="int4", qscheme="symmetric",
                                     granularity="per_block:1:32")),
        "fc1.input": ((4, 64), dict(dtype="uint8", qscheme="asymmetric", target="activation")),
        "fc1.activation_post_process": ((4, 16), dict(dtype="uint8", qscheme="asymmetric",
                                                      target="activation")),
    }
    ours = {}
    for i, (tensor, (shape, spec)) in enumerate(sessions.items()):
        calibrate(client, f"{run}/{tensor}", shape, seed=30 + i, **spec)
        ours[tensor] = Ours(client, f"{run}/{tensor}")

    state, config = client.export_compressed_tensors(run)  # no trailing "/": stripped
    shapes = {key: list(t.shape) for key, t in state.items()}
    scales = {key: shape for key, shape in shapes.items() if key.endswith("_scale")}
    assert scales == {"fc1.weight_scale": [16, 1], "fc2.weight_scale": [1],
                      "fc3.weight_scale": [8, 2], "fc1.input_scale": [1],
                      "fc1.output_scale": [1]}
    assert set(shapes) - set(scales) <= {"fc1.input_zero_point", "fc1.output_zero_point",
                                         "fc1.weight_zero_point", "fc2.weight_zero_point",
                                         "fc3.weight_zero_point"}
    for key, tensor in (("fc1.weight_scale", "fc1.weight"), ("fc2.weight_scale", "fc2.weight"),
                        ("fc3.weight_scale", "fc3.weight"), ("fc1.input_scale", "fc1.input"),
                        ("fc1.output_scale", "fc1.activation_post_process")):
        assert state[key].dtype == torch.float32
        assert f32_bits(state[key]) == f32_bits(ours[tensor].scale), key
    for key, tensor in (("fc1.input_zero_point", "fc1.input"),
                        ("fc1.output_zero_point", "fc1.activation_post_process")):
        assert state[key].dtype == torch.int8 and list(state[key].shape) == [1], key
        assert state[key].item() == ours[tensor].zero_point.item() - 128, key

    assert config["quant_method"] == "compressed-tensors"
    assert config["quantization_status"] == "frozen" and config["ignore"] == []
    groups = {}
    for group in config["config_groups"].values():
        for module in group["targets"]:
            assert module not in groups
            groups[module] = group
    assert sorted(groups) == ["fc1", "fc2", "fc3"]

    def args(module: str, kind: str) -> dict:
        a = groups[module].get(kind)
        assert a is not None, (module, kind, groups[module])
        assert a["dynamic"] is False and a["observer"] == "minmax", a
        return {k: a.get(k) for k in ("num_bits", "type", "symmetric", "strategy",
                                      "group_size")}

    assert args("fc3", "weights") == dict(num_bits=4, type="int", symmetric=True,
                                          strategy="group", group_size=32)
    assert args("fc1", "weights") == dict(num_bits=8, type="int", symmetric=True,
                                          strategy="channel", group_size=None)
    assert args("fc2", "weights") == dict(num_bits=8, type="int", symmetric=True,
                                          strategy="tensor", group_size=None)
    for kind in ("input_activations", "output_activations"):
        assert args("fc1", kind) == dict(num_bits=8, type="int", symmetric=False,
                                         strategy="tensor", group_size=None)
        assert groups["fc2"].get(kind) is None and groups["fc3"].get(kind) is None
    assert groups["fc1"] is not groups["fc2"] and groups["fc1"] is not groups["fc3"]


def test_export_concatenates_the_stream_and_is_deterministic(client, name) -> None:
    # Enough scales for a document of several hundred KiB, likely several messages.
    calibrate(client, name + "/big.weight", (20000, 2), seed=5, granularity="per_channel:0")
    with grpc.insecure_channel(client.target) as channel:  # the raw stream, chunk by chunk
        stub = qparams_pb2_grpc.QParamsServiceStub(channel)
        chunks = [c.data for c in stub.ExportSessions(
            qparams.pb.ExportSessionsRequest(prefix=name + "/", format="onnx"), timeout=30)]
    text = client.export(name + "/", "onnx")
    assert isinstance(text, str) and text == b"".join(chunks).decode("utf-8")
    assert client.export(name + "/", "onnx") == text
    (entry,) = json.loads(text)["encodings"]
    assert f32_bits(np.asarray(entry["y_scale"], np.float64)) == \
        f32_bits(client.get_qparams(name + "/big.weight").scale)


# ---------------------------------------------------------------- NVFP4


def e4m3_values(codes: np.ndarray) -> np.ndarray:
    """float8_e4m3fn codes decoded as nvfp4.md section 3.4 says (no NaN among scales)."""
    codes = np.asarray(codes, np.int64)
    e, m = (codes >> 3) & 15, codes & 7
    value = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7))
    return np.where(codes >> 7, -value, value).astype(np.float32)


def nvfp4_layer(client: qparams.Client, module: str, convention: str, seed: int) -> None:
    """An NVFP4 weight [8, 64] (blocks of 16 along the last axis) and its input
    ([-1, 16] blocks), each observed twice."""
    spec = dict(calculator="global_minmax", dtype="float4_e2m1fn_x2",
                scale_dtype="float8_e4m3fn", convention=convention)
    client.create_session(module + ".weight", target="weight", granularity="per_block:-1:16",
                          **spec)
    client.create_session(module + ".input", target="activation",
                          granularity="per_block:-1,16", **spec)
    g = np.random.default_rng(seed)
    for _ in range(2):
        client.observe(module + ".weight", g.standard_normal((8, 64)).astype(np.float32))
        client.observe(module + ".input", g.standard_normal((5, 64)).astype(np.float32) * 3)


@pytest.mark.parametrize("convention", ["compressed_tensors", "modelopt"])
def test_nvfp4_exports_decode_to_the_sessions_scales(client, name, convention) -> None:
    prefix = name + "/"
    nvfp4_layer(client, prefix + "layers.0.mlp.up_proj", convention, seed=5)
    nvfp4_layer(client, prefix + "layers.1.mlp.up_proj", convention, seed=6)
    if convention == "compressed_tensors":
        state, config = client.export_compressed_tensors(prefix)
        weight_global, input_global, global_shape = "weight_global_scale", "input_global_scale", (1,)
        assert config["format"] == "nvfp4-pack-quantized"
        (group,) = config["config_groups"].values()
        assert group["targets"] == ["layers.0.mlp.up_proj", "layers.1.mlp.up_proj"]
        assert group["weights"]["strategy"] == "tensor_group"
        assert group["input_activations"]["dynamic"] == "local"
    else:
        state, config = client.export_modelopt(prefix)
        weight_global, input_global, global_shape = "weight_scale_2", "input_scale", ()
        assert config["quantization"] == {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                          "group_size": 16, "exclude_modules": []}
        assert config["producer"] == {"name": "qparams", "version": qparams.__version__}
    assert len(state) == 6
    for layer in (0, 1):
        module = f"layers.{layer}.mlp.up_proj"
        w = client.get_qparams(prefix + module + ".weight")
        x = client.get_qparams(prefix + module + ".input")
        scale = state[module + ".weight_scale"]
        assert scale.dtype == torch.uint8 and qparams.is_e4m3(scale)
        assert tuple(scale.shape) == (8, 4)
        assert np.array_equal(scale.numpy(), w.scale_e4m3)
        # The bytes are the codes of the session's block scale values.
        assert f32_bits(e4m3_values(scale.numpy())) == f32_bits(w.scale)
        for tensor, q in ((state[f"{module}.{weight_global}"], w),
                          (state[f"{module}.{input_global}"], x)):
            assert tensor.dtype == torch.float32 and tuple(tensor.shape) == global_shape
            assert not qparams.is_e4m3(tensor)
            assert f32_bits(tensor.numpy().reshape(-1)) == f32_bits(np.float32([q.global_scale]))
    other = "modelopt" if convention == "compressed_tensors" else "compressed-tensors"
    with pytest.raises(qparams.InvalidArgument) as e:
        client.export(prefix, other)
    assert "layers.0.mlp.up_proj" in e.value.message and "--format=" in e.value.message


def test_e4m3_entries_hold_bytes(client, name) -> None:
    from qparams._export import decode_tensor
    t = decode_tensor({"dtype": "float8_e4m3fn", "shape": [1, 2], "data": [0, 126]})
    assert t.dtype == torch.uint8 and qparams.is_e4m3(t) and t.tolist() == [[0, 126]]
    for bad in ([0, 256], [-1, 0]):
        with pytest.raises(ValueError, match="outside float8_e4m3fn"):
            decode_tensor({"dtype": "float8_e4m3fn", "shape": [2], "data": bad})
    scalar = decode_tensor({"dtype": "float32", "shape": [], "data": [0.5]})
    assert tuple(scalar.shape) == () and scalar.item() == 0.5


@pytest.mark.parametrize("convention, fmt", [("compressed_tensors", "compressed-tensors"),
                                             ("modelopt", "modelopt")])
def test_nvfp4_fused_siblings_with_different_global_scales_are_refused(client, convention,
                                                                       fmt) -> None:
    prefix = f"t/siblings-{convention}/"  # the test's own name is too long for these
    nvfp4_layer(client, prefix + "l0.attn.q_proj", convention, seed=7)
    nvfp4_layer(client, prefix + "l0.attn.k_proj", convention, seed=8)
    with pytest.raises(qparams.FailedPrecondition) as e:
        client.export(prefix, fmt)
    for needle in ("attention siblings under l0.attn", prefix + "l0.attn.q_proj.weight (",
                   prefix + "l0.attn.k_proj.weight (", "GLOBAL_AMAX"):
        assert needle in e.value.message, (needle, e.value.message)
