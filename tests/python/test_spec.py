"""qparams.quant_spec, qparams.granularity and qparams.block_shape: the Python values
become the same wire messages as the CLI's flags, and the block shapes are the
server's (a range observation of the wrong shape would be refused)."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import qparams
from qparams import pb

GRANULARITY_STRINGS = [
    "per_tensor", "per_channel:0", "per_channel:-1", "per_channel:7", "per_block:1:32",
    "per_block:-1:4", "per_block:0:0", "per_block:4,-1", "per_block:2,-1,8", "per_block:1",
    "per_block:-2", "per_channel:-0",
    # malformed for both
    "per_channel", "per_channel:", "per_channel:x", "per_channel:1:2", "per_block:1:",
    "per_block:1,", "per_block:a,b", "per_block:1:2:3", "per_tensor:0", "channel:0",
    "per_block:1:+2", "per_channel: 1", "per_channel:1 ", "per_channel:1_0", "PER_TENSOR",
    "per_channel:99999999999", "per_block:1:99999999999999999999",
]


@pytest.mark.parametrize("text", GRANULARITY_STRINGS)
def test_granularity_strings_parse_as_the_cli_parses_them(server, text) -> None:
    """One grammar, two languages: qparams-cli create --granularity=TEXT and
    qparams.granularity(TEXT) either both refuse TEXT or give the same message. (An
    empty flag is the CLI's "not given", so "" is not among them.)"""
    cli = os.environ.get("QPARAMS_CLI", "../../build/tools/qparams-cli")
    name = f"t/grammar/{abs(hash(text))}"
    run = subprocess.run([cli, f"--target={server.target}", "create", name,
                          f"--granularity={text}"], capture_output=True, text=True)
    try:
        ours = qparams.granularity(text)
    except ValueError:
        ours = None
    if run.returncode == 2:  # a usage error: the CLI refused the syntax
        assert ours is None, run.stderr
        return
    assert ours is not None, f"the CLI accepted {text!r}: {run.stdout}{run.stderr}"
    with qparams.Client(server.target) as c:
        if run.returncode == 0:
            assert c.get_session(name).spec.granularity == ours
            c.delete_session(name)
        else:  # the server refused a well-formed granularity: so must it refuse ours
            with pytest.raises(qparams.InvalidArgument):
                c.create_session(name, granularity=ours, target="weight")


@pytest.mark.parametrize("text", GRANULARITY_STRINGS)
def test_granularity_text_is_the_parsers_inverse(text) -> None:
    try:
        g = qparams.granularity(text)
    except ValueError:
        return
    assert qparams.granularity(qparams._spec.granularity_text(g)) == g


def test_granularity_forms() -> None:
    assert qparams.granularity("per_block:1:32") == qparams.granularity(
        {"kind": "per_block", "axis": 1, "block_size": [32]})
    assert qparams.granularity({"kind": "per_block", "axis": 1, "block_size": 32}) == \
        pb.Granularity(per_block=pb.PerBlock(axis=1, block_size=[32]))
    assert qparams.granularity({"kind": "per_block", "block_size": [4, -1]}) == \
        pb.Granularity(per_block=pb.PerBlock(block_size=[4, -1]))
    g = pb.Granularity(per_channel=pb.PerChannel(axis=2))
    assert qparams.granularity(g) is g
    with pytest.raises(ValueError, match="unknown keys"):
        qparams.granularity({"kind": "per_channel", "axis": 0, "size": 2})
    with pytest.raises(ValueError):
        qparams.granularity({"kind": "per_channel"})
    with pytest.raises(TypeError):
        qparams.granularity(3)


def test_quant_spec_values() -> None:
    spec = qparams.quant_spec(dtype="uint4", qscheme="asymmetric", granularity="per_channel:1",
                              target="activation", quant_min=0, quant_max=12,
                              float_range=(None, 6), scale_dtype="", range_calculator="minmax")
    assert spec == pb.QuantSpec(
        dtype="uint4", qscheme=pb.ASYMMETRIC,
        granularity=pb.Granularity(per_channel=pb.PerChannel(axis=1)), target=pb.ACTIVATION,
        quant_min=0, quant_max=12, float_range=pb.FloatRange(max=6), range_calculator="minmax")
    assert not spec.float_range.HasField("min")
    assert qparams.quant_spec({"dtype": "int8", "float_range": [None, None]},
                              dtype=None) == pb.QuantSpec(dtype="int8")
    assert qparams.quant_spec(spec, dtype="int4").dtype == "int4" and spec.dtype == "uint4"
    assert qparams.quant_spec(qscheme=pb.SYMMETRIC).qscheme == pb.SYMMETRIC
    with pytest.raises(TypeError):
        qparams.quant_spec("int8")


# (granularity, target, shape, B or None where it does not fit)
BLOCKS = [
    ("per_tensor", "weight", (3, 4), (3, 4)),
    ("per_channel:0", "weight", (3, 4), (1, 4)),
    ("per_channel:-1", "weight", (3, 4, 5), (3, 4, 1)),
    ("per_channel:3", "weight", (3, 4, 5), None),
    ("per_channel:-4", "weight", (3, 4, 5), None),
    ("per_block:1:2", "weight", (3, 4, 5, 6), (1, 2, 5, 6)),
    ("per_block:3:3", "weight", (3, 4, 5, 6), (1, 1, 5, 3)),
    ("per_block:3:3", "activation", (3, 4, 5, 6), (1, 1, 1, 3)),
    ("per_block:-1:2", "activation", (2, 4), (1, 2)),
    ("per_block:0:2", "weight", (4,), (2,)),
    ("per_block:1:3", "weight", (3, 4), None),
    ("per_block:2,-1", "weight", (4, 6), (2, 6)),
    ("per_block:2,-1", "weight", (4, 6, 1), None),
    ("per_block:3,-1", "weight", (4, 6), None),
]


@pytest.mark.parametrize("text,target,shape,expected", BLOCKS)
def test_block_shapes_are_the_servers(client, name, text, target, shape, expected) -> None:
    g = qparams.granularity(text)
    t = pb.ACTIVATION if target == "activation" else pb.WEIGHT
    assert qparams.block_shape(g, t, shape) == expected
    client.create_session(name, granularity=text, target=target)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    if expected is None:
        with pytest.raises(qparams.InvalidArgument):
            client.observe(name, x, reduce="never")
        return
    counts = tuple(s // b for s, b in zip(shape, expected))
    assert client.observe(name, x, reduce="always").qparams.shape == counts
