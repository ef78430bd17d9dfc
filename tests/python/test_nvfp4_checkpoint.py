"""examples/nvfp4_checkpoint.py's table, and the checkpoints NVFP4Calibration writes:
their tensors and configs (nvfp4.md section 6), the group results they carry, the
experts' shared input scales (an expert that saw no token included), and the typed
refusals when fused members' global scales differ."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

import qparams
from conftest import REPO
from qparams import nvfp4, safetensors
from qparams.torch import NVFP4Calibration, read_checkpoint

sys.path.insert(0, str(REPO / "examples"))
import nvfp4_checkpoint as example  # noqa: E402

L0 = "model.layers.0"
MOE = f"{L0}.block_sparse_moe"


def test_the_table(server, client, capsys) -> None:
    table = example.run_table(server.target, run="nvfp4-example/table")
    with capsys.disabled():
        print("\n" + example.format_table(table))
    assert len(table["fused"]) == 4
    for convention in example.CONVENTIONS:
        errors, scales = table[convention]["errors"], table[convention]["scales"]
        assert set(errors) == set(table["groups"])
        assert all(0.05 < e < 0.15 for e in errors.values()), errors
        for group, modules in table["fused"].items():
            assert len({scales[m] for m in modules}) == 1, (convention, group)
            # The members' own scales differ: the groups are what made them equal.
            assert len({table[convention]["own"][m] for m in modules}) > 1, group
    # Under compressed-tensors the group's gs is the smallest of its members' own.
    ct = table["compressed_tensors"]
    for modules in table["fused"].values():
        assert ct["scales"][modules[0]] == min(ct["own"][m] for m in modules)
    assert not list(client.list_sessions("nvfp4-example/"))
    assert not list(client.list_scale_groups("nvfp4-example/"))


def header(path) -> dict:
    raw = path.read_bytes()
    return json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])


@pytest.fixture
def calibrated(client, tmp_path, request):
    """A calibration of the example's model per convention, written to tmp_path;
    deleted after the test."""
    made = []

    def make(convention: str, model: nn.Module | None = None) -> NVFP4Calibration:
        model = model or example.build_model()
        c = example.calibrate_and_write(model, client, f"ckpt/{request.node.name[5:40]}-"
                                        f"{convention}", convention, tmp_path / convention)
        made.append(c)
        return c

    yield make
    for c in made:
        c.delete()


def test_a_compressed_tensors_checkpoint(client, calibrated, tmp_path) -> None:
    calibration = calibrated("compressed_tensors")
    directory = tmp_path / "compressed_tensors"
    entries = header(directory / "model.safetensors")
    q = f"{L0}.self_attn.q_proj"
    assert entries[f"{q}.weight_packed"]["dtype"] == "U8"
    assert entries[f"{q}.weight_packed"]["shape"] == [64, 32]
    assert entries[f"{q}.weight_scale"] == {**entries[f"{q}.weight_scale"], "dtype": "F8_E4M3",
                                            "shape": [64, 4]}
    assert entries[f"{q}.weight_global_scale"]["shape"] == [1]
    assert entries[f"{q}.input_global_scale"]["shape"] == [1]
    assert f"{q}.weight" not in entries
    assert entries["lm_head.weight"]["dtype"] == "F32"  # left unquantized, whole
    assert entries[f"{MOE}.gate.weight"]["dtype"] == "F32"
    assert entries[f"{L0}.input_layernorm.weight"]["dtype"] == "F32"
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["TinyLlama"]
    quantization = config["quantization_config"]
    assert quantization["format"] == "nvfp4-pack-quantized"
    assert quantization["ignore"] == ["lm_head", f"{MOE}.gate"]
    assert sorted(quantization["config_groups"]["group_0"]["targets"]) == \
        sorted(calibration.modules)

    # The checkpoint carries each group's result: its global scale, the members' bytes.
    tensors, metadata = safetensors.load(directory / "model.safetensors")
    assert metadata == {"format": "pt"}
    for group in calibration.groups:
        result = client.get_group_qparams(calibration.groups.group_name(calibration.run, group))
        for module, member in zip(group.modules, result.members):
            role = "weight" if group.role == "weight" else "input"
            assert tensors[f"{module}.{role}_global_scale"].item() == result.global_scale
            if role == "weight":
                assert tensors[f"{module}.weight_scale"].tolist() == \
                    member.qparams.scale_e4m3.tolist()
    # And the packed weights are qparams.nvfp4's, with those scales.
    weight = dict(calibration.model.named_modules())[q].weight.detach()
    packed, _ = nvfp4.quantize(weight, tensors[f"{q}.weight_global_scale"],
                               "compressed_tensors", tensors[f"{q}.weight_scale"])
    assert torch.equal(tensors[f"{q}.weight_packed"], packed)


def test_a_modelopt_checkpoint(calibrated, tmp_path) -> None:
    calibrated("modelopt")
    directory = tmp_path / "modelopt"
    entries = header(directory / "model.safetensors")
    w2 = f"{MOE}.experts.1.w2"
    assert entries[f"{w2}.weight"]["dtype"] == "U8" and entries[f"{w2}.weight"]["shape"] == [64, 64]
    assert entries[f"{w2}.weight_scale"]["dtype"] == "F8_E4M3"
    assert entries[f"{w2}.weight_scale_2"]["shape"] == []
    assert entries[f"{w2}.input_scale"]["shape"] == []
    hf_quant_config = json.loads((directory / "hf_quant_config.json").read_text())
    assert hf_quant_config["quantization"]["quant_algo"] == "NVFP4"
    assert hf_quant_config["quantization"]["exclude_modules"] == ["lm_head", f"{MOE}.gate"]
    assert json.loads((directory / "config.json").read_text()) == {"architectures": ["TinyLlama"]}
    assert set(read_checkpoint(directory)) == {
        n for n, m in example.build_model().named_modules()
        if isinstance(m, nn.Linear) and n not in ("lm_head", f"{MOE}.gate")}


def test_an_expert_without_tokens_takes_the_blocks_input_scale(calibrated, tmp_path) -> None:
    model = example.build_model()
    with torch.no_grad():
        model.model.layers[0].block_sparse_moe.gate.weight.zero_()  # every token to expert 0
    calibrated("compressed_tensors", model)
    tensors, _ = safetensors.load(tmp_path / "compressed_tensors" / "model.safetensors")
    w13 = {tensors[f"{MOE}.experts.{e}.{w}.input_global_scale"].item()
           for e in "01" for w in ("w1", "w3")}
    w2 = {tensors[f"{MOE}.experts.{e}.w2.input_global_scale"].item() for e in "01"}
    assert len(w13) == 1 and len(w2) == 1 and w13 != w2


def test_without_groups_the_server_refuses_naming_the_siblings(client, tmp_path) -> None:
    model = example.build_model()
    calibration = NVFP4Calibration(model, "ckpt/nogroups", client=client, ignore=example.IGNORE)
    try:
        calibration.calibrate_weights()
        for group in calibration.groups:
            if group.role == "weight":  # the input groups were never created
                client.delete_scale_group(calibration.groups.group_name(calibration.run, group))
        with pytest.raises(qparams.FusedGlobalScalesDiffer) as refused:
            calibration.write_checkpoint(tmp_path)
        sets = [set(calibration.group_sessions(g)) for g in calibration.groups]
        assert set(refused.value.members) in sets
        assert len(refused.value.global_scales) == len(refused.value.members)
        assert isinstance(refused.value, qparams.FailedPrecondition)
        assert not (tmp_path / "model.safetensors").exists()
    finally:
        calibration.delete()


def test_a_custom_set_is_checked_on_the_export(client, tmp_path) -> None:
    torch.manual_seed(0)
    model = nn.Module()
    model.attn = nn.Module()
    for name in ("to_q", "to_k", "to_v"):
        setattr(model.attn, name, nn.Linear(32, 32))
    siblings = {"qkv": ("to_q", "to_k", "to_v")}
    calibration = NVFP4Calibration(model, "ckpt/custom", client=client, siblings=siblings)
    try:
        calibration.calibrate_weights()
        scales = calibration.write_checkpoint(tmp_path / "grouped").global_scales
        assert len(set(scales.values())) == 1
        # The server's table does not know to_q/to_k/to_v: the writer's own check does.
        client.delete_scale_group("ckpt/custom/{attn}.qkv")
        with pytest.raises(qparams.FusedGlobalScalesDiffer,
                           match=r"fused qkv group \{attn\}.qkv") as refused:
            calibration.write_checkpoint(tmp_path / "ungrouped")
        assert refused.value.members == tuple(f"ckpt/custom/{{attn}}.to_{x}.weight" for x in "qkv")
    finally:
        calibration.delete()


def test_an_uncalibrated_weight_group_is_refused_by_name(client, tmp_path) -> None:
    calibration = NVFP4Calibration(example.build_model(), "ckpt/uncal", client=client,
                                   ignore=example.IGNORE)
    try:
        calibration.calibrate_weights()
        q = calibration.session(f"{L0}.self_attn.q_proj")
        client.delete_session(q)
        client.create_session(q, calculator="global_minmax", target="weight",
                              dtype="float4_e2m1fn_x2", scale_dtype="float8_e4m3fn",
                              granularity="per_block:-1:16")
        with pytest.raises(qparams.UncalibratedGroup) as refused:
            calibration.write_checkpoint(tmp_path)
        assert refused.value.uncalibrated == (q,)
        assert refused.value.group == f"ckpt/uncal/{{{L0}.self_attn}}.attention"
    finally:
        calibration.delete()
