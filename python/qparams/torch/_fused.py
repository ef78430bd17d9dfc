"""The fused groups of a model, found by module names, and the session names that keep
each group on one replica.

Engines fuse some linears into one GEMM with one global scale per operand (nvfp4.md
section 7): q/k/v under one attention module, gate/up under one MLP, an MLA block's
q_a_proj/kv_a_proj_with_mqa, each MoE expert's w1/w3; and a MoE block's fused expert
kernel takes one input global scale for all its experts (the experts' w1/w3 inputs, and
their w2 inputs). Each such set is one GLOBAL_AMAX scale group.

Session names carry a hash tag (docs/sharding.md) so that every member of a group, and
the group, hash to one slot: "RUN/{model.layers.0.self_attn}.q_proj.weight". The tag
is the group's parent module (a MoE block for everything under its experts), else the
module's own parent; a top-level module gets none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

import torch

__all__ = ["FUSED_SIBLINGS", "EXPERT_INPUTS", "FusedGroup", "FusedGroups", "find_fused_groups"]

#: Sibling sets by name: module names relative to a common parent (dotted paths allowed,
#: or "re:" and a regular expression matched against the whole relative name). These are
#: llm-compressor's FUSED_LAYER_NAMES (observers/helpers.py), and must stay the sets of
#: export/fused_siblings.h, whose exports the server refuses when their global scales
#: differ.
FUSED_SIBLINGS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "attention": ("q_proj", "k_proj", "v_proj"),
    "mlp": ("gate_proj", "up_proj"),
    "mla": ("q_a_proj", "kv_a_proj_with_mqa"),
    "expert": ("w1", "w3"),
})

#: A MoE block's input groups: each is the inputs of these linears in every expert
#: (vLLM's fused MoE takes one w13 and one w2 input scale per block, nvfp4.md section 7).
EXPERT_INPUTS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "w13_input": ("w1", "w3"),
    "w2_input": ("w2",),
})

# Group and set names become part of session and group names.
_NAME = re.compile(r"[a-zA-Z0-9_-][a-zA-Z0-9._-]*")


class FusedGroup(NamedTuple):
    """One fused group of a model.

    Attributes:
        kind: its set's name ("attention", "mlp", "expert", "w13_input", ...).
        role: "weight" (the members' weights) or "input" (their input activations).
        parent: the module the group sits under: the siblings' common parent, or for an
            expert input group the MoE block.
        modules: the members' module names, in model order.
        name: the group's name below the run, hash-tagged like its members'
            ("{model.layers.0.self_attn}.attention").
    """

    kind: str
    role: str
    parent: str
    modules: tuple[str, ...]
    name: str


def _check_sets(what: str, sets: Mapping[str, Sequence[str]]) -> dict[str, tuple]:
    """{set name: compiled patterns}; TypeError / ValueError naming `what` and the rule."""
    if not isinstance(sets, Mapping):
        raise TypeError(f"{what} must be a mapping of set names to module names, not "
                        f"{type(sets).__name__}")
    out: dict[str, tuple] = {}
    for kind, names in sets.items():
        if not isinstance(kind, str) or not _NAME.fullmatch(kind):
            raise ValueError(f"{what}: set name {kind!r} must be letters, digits, '_', '-' "
                             "or '.' (it becomes part of the group's name)")
        if isinstance(names, str) or not isinstance(names, Sequence) or not names:
            raise ValueError(f"{what}[{kind!r}] must be a non-empty sequence of module names, "
                             f"not {names!r}")
        patterns = []
        for name in names:
            if not isinstance(name, str) or not name or name == "re:":
                raise ValueError(f"{what}[{kind!r}] holds {name!r}, not a module name or "
                                 "\"re:\" pattern")
            if name.startswith("re:"):
                try:
                    patterns.append((name, re.compile(name[3:])))
                except re.error as e:
                    raise ValueError(f"{what}[{kind!r}]: {name!r} is not a regular "
                                     f"expression: {e}") from None
            else:
                patterns.append((name, None))
        out[kind] = tuple(patterns)
    return out


def _matches(pattern: tuple[str, re.Pattern | None], relative: str) -> bool:
    name, regex = pattern
    return regex.fullmatch(relative) is not None if regex is not None else relative == name


class FusedGroups(Sequence[FusedGroup]):
    """The fused groups of a model (find_fused_groups), a sequence of FusedGroup, and
    the hash-tagged session names of the modules it was given."""

    def __init__(self, groups: Sequence[FusedGroup], modules: Sequence[str],
                 tags: Mapping[str, str]) -> None:
        self._groups = tuple(groups)
        self.modules: tuple[str, ...] = tuple(modules)
        self._tags = dict(tags)

    def __getitem__(self, index):  # type: ignore[override]
        """The group at `index` (or a tuple of them for a slice)."""
        return self._groups[index]

    def __len__(self) -> int:
        return len(self._groups)

    def __repr__(self) -> str:
        return f"FusedGroups({list(self._groups)!r})"

    def tag(self, module: str) -> str:
        """The hash tag of `module`'s sessions (the module its groups sit under, else
        its parent), "" for a top-level module.

        Raises:
            KeyError: `module` is not one of the modules the groups were found among.
        """
        if module not in self._tags:
            raise KeyError(f"module {module!r} is not among the modules these groups were "
                           "found among")
        return self._tags[module]

    def session_name(self, run: str, module: str, role: str) -> str:
        """The session of `module`'s `role` ("weight" or "input") under `run`:
        "RUN/{TAG}.REST.ROLE", REST being the module's name below its tag.

        Raises:
            ValueError: role is neither "weight" nor "input".
            KeyError: as for tag.
        """
        if role not in ("weight", "input"):
            raise ValueError(f"role must be \"weight\" or \"input\", not {role!r}")
        tag = self.tag(module)
        below = f"{{{tag}}}.{module[len(tag) + 1:]}" if tag else module
        return f"{run}/{below}.{role}"

    def group_name(self, run: str, group: FusedGroup) -> str:
        """The scale group of `group` under `run`: "RUN/" and group.name."""
        return f"{run}/{group.name}"

    def sessions(self, run: str, group: FusedGroup) -> tuple[str, ...]:
        """The member sessions of `group` under `run`, in member order."""
        return tuple(self.session_name(run, m, group.role) for m in group.modules)


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def find_fused_groups(model: torch.nn.Module,
                      siblings: Mapping[str, Sequence[str]] = FUSED_SIBLINGS, *,
                      experts: str = "experts",
                      expert_inputs: Mapping[str, Sequence[str]] = EXPERT_INPUTS,
                      modules: Iterable[str] | None = None) -> FusedGroups:
    """The fused groups of `model` by its module names.

    A sibling set applies under a parent module when each of its names matches at
    least one module below it (all of q_proj, k_proj and v_proj, say); the group is
    those modules. A MoE block is a module with a child `experts` whose children are
    the experts; each set of `expert_inputs` gives one group of the named linears'
    inputs across all of its experts.

    Args:
        model: the model.
        siblings: sibling sets by name, module names relative to the parent
            (FUSED_SIBLINGS by default, as llm-compressor's FUSED_LAYER_NAMES).
        experts: the name of a MoE block's child that holds its experts.
        expert_inputs: the experts' input sets (EXPERT_INPUTS); {} for none.
        modules: the names of the modules that may be members (the ones being
            quantized); default every nn.Linear of the model.

    Returns:
        FusedGroups: weight groups first, in model order, then the input groups.

    Raises:
        TypeError: model is not an nn.Module, or a set mapping is not a mapping.
        ValueError: a malformed set, experts name or module name; a module name that
            is not in the model; a module two groups of one role would both hold.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
    sibling_sets = _check_sets("siblings", siblings)
    input_sets = _check_sets("expert_inputs", expert_inputs)
    if not isinstance(experts, str) or not _NAME.fullmatch(experts) or "." in experts:
        raise ValueError(f"experts must be a module's attribute name, not {experts!r}")
    named = dict(model.named_modules())
    if modules is None:
        members = [n for n, m in named.items() if isinstance(m, torch.nn.Linear)]
    else:
        if isinstance(modules, str):
            raise TypeError("modules must be an iterable of module names, not a str")
        members = list(dict.fromkeys(modules))
        for m in members:
            if not isinstance(m, str) or m not in named or not m:
                raise ValueError(f"modules names {m!r}, which is not a module of the model")
        order = {n: i for i, n in enumerate(named)}
        members.sort(key=order.__getitem__)

    # Weight groups: under each ancestor of each member, the sets all of whose names match.
    found: dict[tuple[str, str], list[str]] = {}
    for kind, patterns in sibling_sets.items():
        by_parent: dict[str, list[set[str]]] = {}
        for m in members:
            parts = m.split(".")
            for cut in range(len(parts) - 1, -1, -1):
                parent = ".".join(parts[:cut])
                relative = ".".join(parts[cut:])
                hits = by_parent.setdefault(parent, [set() for _ in patterns])
                for i, p in enumerate(patterns):
                    if _matches(p, relative):
                        hits[i].add(m)
        for parent, hits in by_parent.items():
            if all(hits):
                found[(parent, kind)] = [m for m in members if any(m in h for h in hits)]
    position = {m: i for i, m in enumerate(members)}
    weight_groups = sorted(found.items(), key=lambda item: position[item[1][0]])

    # MoE blocks: the parents of an `experts` child, which holds the experts.
    blocks = [n for n, mod in named.items()
              if isinstance(getattr(mod, experts, None), torch.nn.Module)
              and (f"{n}.{experts}" if n else experts) in named]
    containers = {b: f"{b}.{experts}" if b else experts for b in blocks}
    tags: dict[str, str] = {m: _parent(m) for m in members}
    for block in blocks:
        for m in members:
            if m.startswith(containers[block] + "."):
                tags[m] = block

    groups: list[FusedGroup] = []
    owner: dict[tuple[str, str], str] = {}

    def add(kind: str, role: str, parent: str, group_modules: list[str], name: str) -> None:
        for m in group_modules:
            other = owner.setdefault((m, role), name)
            if other != name:
                raise ValueError(f"module {m} would be in two {role} groups, {other} and "
                                 f"{name}: a checkpoint holds one global scale per tensor; "
                                 "make the sibling sets disjoint")
        groups.append(FusedGroup(kind, role, parent, tuple(group_modules), name))

    def tagged(root: str, rest: str) -> str:
        return f"{{{root}}}.{rest}" if root else rest

    for (parent, kind), group_modules in weight_groups:
        # Under a MoE block's experts the block is the tag, so that the experts' input
        # groups share the slot of their weights; elsewhere the siblings' parent.
        root = next((b for b in blocks if parent.startswith(containers[b] + ".")), parent)
        for m in group_modules:
            tags[m] = root
        rest = parent[len(root) + 1:] if root else parent
        add(kind, "weight", parent, group_modules,
            tagged(root, f"{rest}.{kind}" if rest else kind))
    for block in blocks:
        prefix = containers[block]
        container = named[prefix]
        for kind, patterns in input_sets.items():
            group_modules = []
            for child, _ in container.named_children():
                for m in members:
                    if m.startswith(f"{prefix}.{child}.") and any(
                            _matches(p, m[len(prefix) + len(child) + 2:]) for p in patterns):
                        group_modules.append(m)
            if group_modules:
                add(kind, "input", block, group_modules, tagged(block, f"{experts}.{kind}"))
    return FusedGroups(groups, members, tags)
