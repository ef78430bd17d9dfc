"""qparams.torch.find_fused_groups (no server): the default sibling sets on a Llama /
Mixtral-named model, custom sets, the hash-tagged session names, and bad input; and
NVFP4Calibration's checks of its arguments, made before any call."""

from __future__ import annotations

import sys

import pytest
from torch import nn

import qparams
from conftest import REPO
from qparams.torch import FUSED_SIBLINGS, NVFP4Calibration, find_fused_groups

sys.path.insert(0, str(REPO / "examples"))
import nvfp4_checkpoint as example  # noqa: E402

L0 = "model.layers.0"
MOE = f"{L0}.block_sparse_moe"


def test_the_default_sets_on_a_llama_and_mixtral_layer() -> None:
    groups = find_fused_groups(example.build_model())
    got = [(g.kind, g.role, g.parent, g.modules, g.name) for g in groups]
    assert got == [
        ("attention", "weight", f"{L0}.self_attn",
         tuple(f"{L0}.self_attn.{p}_proj" for p in "qkv"), f"{{{L0}.self_attn}}.attention"),
        ("mlp", "weight", f"{L0}.mlp", (f"{L0}.mlp.gate_proj", f"{L0}.mlp.up_proj"),
         f"{{{L0}.mlp}}.mlp"),
        ("expert", "weight", f"{MOE}.experts.0", (f"{MOE}.experts.0.w1", f"{MOE}.experts.0.w3"),
         f"{{{MOE}}}.experts.0.expert"),
        ("expert", "weight", f"{MOE}.experts.1", (f"{MOE}.experts.1.w1", f"{MOE}.experts.1.w3"),
         f"{{{MOE}}}.experts.1.expert"),
        ("w13_input", "input", MOE, tuple(f"{MOE}.experts.{e}.{w}" for e in "01" for w in
                                          ("w1", "w3")), f"{{{MOE}}}.experts.w13_input"),
        ("w2_input", "input", MOE, (f"{MOE}.experts.0.w2", f"{MOE}.experts.1.w2"),
         f"{{{MOE}}}.experts.w2_input"),
    ]
    # The server's sibling table (export/fused_siblings.h) holds the same sets.
    table = (REPO / "export/fused_siblings.cc").read_text()
    for names in FUSED_SIBLINGS.values():
        assert "{" + ", ".join(f'"{n}"' for n in names) + "}" in table


def test_session_names_share_their_groups_hash_tag() -> None:
    groups = find_fused_groups(example.build_model())
    assert groups.session_name("r", f"{L0}.self_attn.q_proj", "weight") == \
        f"r/{{{L0}.self_attn}}.q_proj.weight"
    assert groups.session_name("r", f"{MOE}.experts.1.w2", "input") == \
        f"r/{{{MOE}}}.experts.1.w2.input"
    assert groups.session_name("r", f"{MOE}.gate", "weight") == f"r/{{{MOE}}}.gate.weight"
    assert groups.session_name("r", "lm_head", "weight") == "r/lm_head.weight"  # top level
    for g in groups:
        tag = g.name[1:g.name.index("}")]
        assert all(s.startswith(f"r/{{{tag}}}.") for s in groups.sessions("r", g))
    with pytest.raises(ValueError, match="role"):
        groups.session_name("r", "lm_head", "output")
    with pytest.raises(KeyError, match="model.norm"):
        groups.tag("model.norm")


class Wan(nn.Module):
    """Diffusers' attention names (to_q/to_k/to_v), and a dotted sibling."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Module()
        for name in ("to_q", "to_k", "to_v", "to_out"):
            setattr(self.attn, name, nn.Linear(16, 16))
        self.attn.gate = nn.Module()
        self.attn.gate.proj = nn.Linear(16, 16)


def test_custom_sets_by_name_pattern_and_dotted_path() -> None:
    model = Wan()
    groups = find_fused_groups(model, {"qkv": ("to_q", "re:to_[kv]", "gate.proj")},
                               expert_inputs={})
    assert [(g.kind, g.parent, g.modules, g.name) for g in groups] == [
        ("qkv", "attn", ("attn.to_q", "attn.to_k", "attn.to_v", "attn.gate.proj"),
         "{attn}.qkv")]
    # The dotted member takes its group's tag, so that the group stays on one slot.
    assert groups.session_name("run", "attn.gate.proj", "weight") == "run/{attn}.gate.proj.weight"
    assert groups.session_name("run", "attn.to_out", "weight") == "run/{attn}.to_out.weight"
    # The defaults know none of them.
    assert len(find_fused_groups(model)) == 0


def test_a_set_applies_only_when_each_of_its_names_is_present() -> None:
    model = example.build_model()
    chosen = [n for n, m in model.named_modules()
              if isinstance(m, nn.Linear) and not n.endswith("v_proj")]
    kinds = [g.kind for g in find_fused_groups(model, modules=chosen)]
    assert "attention" not in kinds and "mlp" in kinds
    assert [g.kind for g in find_fused_groups(model, modules=[f"{L0}.mlp.up_proj",
                                                              f"{L0}.mlp.gate_proj"])] == ["mlp"]


def test_top_level_siblings_and_experts() -> None:
    model = nn.Module()
    model.q_proj, model.k_proj, model.v_proj = (nn.Linear(16, 16) for _ in range(3))
    model.experts = nn.ModuleList(example.Expert() for _ in range(2))
    groups = find_fused_groups(model)
    assert [g.name for g in groups] == ["attention", "experts.0.expert", "experts.1.expert",
                                        "experts.w13_input", "experts.w2_input"]
    assert groups.session_name("r", "q_proj", "weight") == "r/q_proj.weight"
    assert groups.session_name("r", "experts.0.w1", "input") == "r/experts.0.w1.input"


@pytest.mark.parametrize("args, kwargs, error, match", [
    (("not a model",), {}, TypeError, "model must be a torch.nn.Module"),
    ((None, ["q_proj"]), {}, TypeError, "siblings must be a mapping"),
    ((None, {"qkv": ()}), {}, ValueError, r"siblings\['qkv'\] must be a non-empty sequence"),
    ((None, {"qkv": "q_proj"}), {}, ValueError, r"siblings\['qkv'\] must be a non-empty"),
    ((None, {"qkv": ("q_proj", 3)}), {}, ValueError, r"siblings\['qkv'\] holds 3"),
    ((None, {"q/kv": ("q_proj",)}), {}, ValueError, "set name 'q/kv'"),
    ((None, {"qkv": ("re:(q_proj",)}), {}, ValueError, "not a regular expression"),
    ((None, {"a": ("q_proj", "k_proj"), "b": ("k_proj", "v_proj")}), {}, ValueError,
     r"k_proj would be in two weight groups, \{model.layers.0.self_attn\}.a and"),
    ((None,), {"experts": "block.experts"}, ValueError, "experts must be"),
    ((None,), {"expert_inputs": {"w13": []}}, ValueError, r"expert_inputs\['w13'\]"),
    ((None,), {"modules": ["model.layers.0.nope"]}, ValueError, "not a module of the model"),
    ((None,), {"modules": "lm_head"}, TypeError, "not a str"),
])
def test_bad_input_names_the_argument_and_the_rule(args, kwargs, error, match) -> None:
    model = example.build_model()
    args = tuple(model if a is None and i == 0 else a for i, a in enumerate(args))
    with pytest.raises(error, match=match):
        find_fused_groups(*args, **kwargs)


def test_calibration_checks_its_arguments_before_any_call() -> None:
    model = example.build_model()
    client = qparams.Client("127.0.0.1:9")  # never called
    calibration = NVFP4Calibration(model, "r", client=client, ignore=example.IGNORE)
    assert "lm_head" not in calibration.modules and f"{MOE}.gate" not in calibration.modules
    assert calibration.session(f"{L0}.self_attn.q_proj", "input") == \
        f"r/{{{L0}.self_attn}}.q_proj.input"
    odd = nn.Sequential(nn.Linear(40, 16))
    for kwargs, error, match in [
        (dict(model=odd), ValueError, r"module 0: NVFP4 quantizes blocks of 16 .* not 40"),
        (dict(run="a{b}"), ValueError, "run must be a non-empty session-name prefix without "
                                       "braces"),
        (dict(run=""), ValueError, "run must be"),
        (dict(convention="torchao"), ValueError, "convention must be one of"),
        (dict(modules=["model.norm"]), TypeError, "'model.norm', a RMSNorm"),
        (dict(modules=["nope"]), ValueError, "not a module of the model"),
        (dict(ignore="lm_head"), TypeError, "ignore must be a sequence"),
        (dict(ignore=["re:("]), ValueError, "ignore: 're:\\(' is not a regular expression"),
        (dict(ignore=["re:.*"]), ValueError, "no nn.Linear module is left"),
        (dict(model="x"), TypeError, "model must be a torch.nn.Module"),
    ]:
        arguments = dict(model=model, run="r", client=client) | kwargs
        with pytest.raises(error, match=match):
            NVFP4Calibration(arguments.pop("model"), arguments.pop("run"), **arguments)
    client.close()
