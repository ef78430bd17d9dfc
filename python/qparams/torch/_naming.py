"""Session names after the model's own names: which module, parameter or graph value
each observer of a prepared model watches (eager or FX mode).

The scheme, relative to the run (sessions are "RUN/<name>"):
  * a weight: its parameter's qualified name, "fc1.weight" (inside a fused module,
    such as LinearReLU's "fc1.0.weight", the fused module's: "fc1.weight");
  * eager mode: the observer torch.ao puts on a module's output,
    "fc1.activation_post_process", watches "fc1.output";
  * FX mode: an observer feeding a module watches that module's input, "fc2.input"
    (one observer shared by several values, e.g. conv -> pool -> flatten -> fc, is
    named after the last of them); else the output of the module it follows,
    "fc2.output"; else the graph value it follows, "x.output" or "add.output".
These are the names the exports use (compressed-tensors reads the module and the
role from them) and the keys onnx_tensor_names maps to an ONNX graph's tensors.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any

import torch

#: Parameters of prepared models by id: (weak reference, canonical name, run or None).
#: A weight observer torch.ao creates inside convert finds its name here by the
#: tensor it observes (see RemoteObserver.forward).
_parameters: dict[int, tuple[weakref.ref, str, str | None]] = {}
_parameters_lock = threading.Lock()


def layer_path(path: str, modules: dict[str, torch.nn.Module]) -> str:
    """The layer a module at `path` stands for: a fused module's part ("fc1.0" of a
    LinearReLU) is the fused module ("fc1"), which took the original layer's place."""
    parent, _, part = path.rpartition(".")
    fused = getattr(torch.nn.intrinsic, "_FusedModule", ())
    return parent if part.isdigit() and isinstance(modules.get(parent), fused) else path


def parameter_names(model: torch.nn.Module) -> dict[int, tuple[torch.nn.Parameter, str]]:
    """{id(parameter): (parameter, canonical name)} of every parameter of `model`; a
    parameter of a fused module's part takes the fused module's name."""
    modules = dict(model.named_modules())
    names: dict[int, tuple[torch.nn.Parameter, str]] = {}
    for path, module in modules.items():
        owner = layer_path(path, modules)
        for pname, parameter in module.named_parameters(recurse=False):
            names.setdefault(id(parameter), (parameter, f"{owner}.{pname}" if owner else pname))
    return names


def register_parameters(model: torch.nn.Module, run: str | None) -> None:
    """Remembers the canonical names of `model`'s parameters for weight observers."""
    with _parameters_lock:
        for key in [k for k, (ref, _, _) in _parameters.items() if ref() is None]:
            del _parameters[key]
        for key, (parameter, name) in parameter_names(model).items():
            _parameters[key] = (weakref.ref(parameter), name, run)


def parameter_name(x: Any) -> tuple[str, str | None] | None:
    """(canonical name, run) of the registered parameter `x` is, or None."""
    with _parameters_lock:
        entry = _parameters.get(id(x))
    if entry is None or entry[0]() is not x:
        return None
    return entry[1], entry[2]


def _value_name(node: torch.fx.Node) -> str:
    """The name of the value `node` produces: a module's output, a parameter, or the
    node's own name."""
    if node.op == "call_module":
        return f"{node.target}.output"
    if node.op == "get_attr":
        return str(node.target)
    return f"{node.name}.output"


def fx_names(model: torch.fx.GraphModule, kind: type) -> dict[int, str]:
    """{id(observer): its name} for the observers of class `kind` in an FX-prepared
    model, under the scheme of this module's docstring. One observer may stand at
    several nodes (torch.ao shares it between an op and a flatten after it)."""
    modules = dict(model.named_modules(remove_duplicate=False))

    def observer(node: torch.fx.Node) -> Any:
        if node.op != "call_module":
            return None
        module = modules.get(str(node.target))
        return module if isinstance(module, kind) else None

    uses: dict[int, list[torch.fx.Node]] = {}
    for node in model.graph.nodes:
        if observer(node) is not None:
            uses.setdefault(id(observer(node)), []).append(node)
    names: dict[int, str] = {}
    for key, nodes in uses.items():
        name = None
        for node in nodes:  # the last value fed to a module wins
            for user in node.users:
                if user.op == "call_module" and observer(user) is None:
                    name = f"{user.target}.input"
        if name is None:
            producer = nodes[0].args[0] if nodes[0].args else None
            name = (_value_name(producer) if isinstance(producer, torch.fx.Node)
                    else str(nodes[0].target))
        names[key] = name
    return names


def makes(factory: Any, kind: type) -> bool:
    """Whether the observer factory `factory` (a class, or torch.ao's with_args
    wrapper around one) constructs a `kind`."""
    seen = 0
    while seen < 16:  # with_args wrappers nest: _PartialWrapper(partial(_PartialWrapper...))
        seen += 1
        factory = getattr(factory, "p", factory)
        if isinstance(factory, functools.partial):
            factory = factory.func
            continue
        break
    return isinstance(factory, type) and issubclass(factory, kind)


def eager_name(path: str) -> str:
    """The name of the eager-mode observer at module path `path`."""
    owner, _, last = path.rpartition(".")
    if last == "activation_post_process":
        return f"{owner}.output" if owner else "output"
    return path or "observer"
